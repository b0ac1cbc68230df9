"""Build and install an engine's offline bundle (its `Spec`), and the command line each engine's
module gives it:

    python -m backends.<engine>.gpu_bundle build OUT [--wheels DIR] [--python 3.12]   (where there is network)
    python -m backends.<engine>.gpu_bundle install BUNDLE TARGET                       (on the CUDA machine)

`build` decides the bundle from the engine's import chain (chain.py): it probes, in a fresh
process, every backend of the engine the kit registers; takes the distributions whose files the
chain loaded, less the target's base (the standard library, torch and what it requires, Triton), the
kit and what another bundle brings; proves them sufficient (the probe again, with those
distributions and the base alone on its path); then downloads their wheels at the versions that
loaded here, for the target's Python and manylinux x86_64 (`pip download --no-deps
--only-binary=:all:`), keeps of the engine's wheel what its backends load (the Spec's `keeps`), and
packs the wheels as one tar in parts of at most PART_BYTES, with MANIFEST.json (the parts,
their sizes, the archive's sha256, the wheels, and each top-level module of the chain with the
wheel that brings it).

`install` checks and joins the parts, installs every wheel into TARGET (`pip install --no-index
--no-deps --target`: nothing of the machine's own packages is touched), prints what it installed,
then probes each registered backend of the engine in a fresh process with TARGET first on its path,
and fails naming every module missing and the wheel that brings it (or that none in the bundle
does), and each program the engine runs that is not on PATH.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from backends.offline import chain, parts

PART_BYTES = 30 << 20
ENTRY_POINT_GROUP = "attention_conformance.backends"  # kit.harness.registry's: where the kit registers them
GLIBC_MINORS = range(17, 35)  # manylinux_2_17 .. manylinux_2_34: what the target's glibc runs
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in reversed(GLIBC_MINORS)), "manylinux2014_x86_64",
             "linux_x86_64", "any")
KIT_INSTALL = "pip install --no-index --no-deps --no-build-isolation -e ."


def engine_load(cls) -> None:
    """What a run of an engine adapter imports of its engine, as the adapter declares it (`load_engine`)."""
    cls.load_engine()


@dataclasses.dataclass(frozen=True)
class Spec:
    """One engine's bundle."""

    name: str  # the bundle's name: its archive's, its messages'
    engine: str  # the engine's distribution (its requirements are a serving stack: never followed)
    where: str  # module:attr of this Spec, for the probe's process
    packages: Tuple[str, ...]  # the kit's modules whose registered backends the bundle serves
    load: Callable[[type], None]  # loads what a backend class imports of its engine (raises where it cannot)
    leaves_out: Tuple[str, ...] = ()  # distributions another bundle brings
    keeps: Optional[Callable[[str], bool]] = None  # which files of the engine's wheel it keeps (None: all)
    tools: Tuple[str, ...] = ()  # programs the engine runs, from PATH (TARGET/bin first)
    also: Tuple[str, ...] = ()  # name==version of what it needs that no import loads (a program's wheel)
    runs_import: Tuple[str, ...] = ()  # modules its kernels import when they first run on a GPU (no chain here
    # reaches them): the install checks each imports on the target

    @property
    def archive(self) -> str:
        return f"{self.name}-bundle.tar"

    @property
    def command(self) -> str:
        return f"python -m {self.where.partition(':')[0]}"


def registered(spec: Spec) -> Dict[str, str]:
    """name -> module:attr of every backend the kit registers from the Spec's packages."""
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    found = {ep.name: ep.value for ep in eps if ep.value.partition(":")[0] in spec.packages}
    if not found:
        raise SystemExit(f"no backend of {', '.join(spec.packages)} is registered here: install the kit first, from "
                         f"its checkout: {KIT_INSTALL}")
    return dict(sorted(found.items()))


def download(pinned: Sequence[str], into: Path, python: str, cache: Optional[Path] = None) -> None:
    """pip download of `pinned` (name==version) for the target's Python and platform, no dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", "-d", str(into)]
    cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    if cache:
        cmd += ["--find-links", str(cache)]
    subprocess.run(cmd + list(pinned), check=True)


def wheel_key(filename: str) -> str:
    """A wheel file's distribution, canonical."""
    return chain.canonical(filename.split("-")[0])


def trim(wheel: Path, keeps: Callable[[str], bool], into: Path) -> Path:
    """A copy of `wheel` with only the files `keeps` (its RECORD too)."""
    out = into / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = [i.filename for i in src.infolist() if not i.is_dir() and keeps(i.filename)]
        for name in names:
            data = src.read(name)
            if name.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if line.split(b",")[0].decode() in names)
            dst.writestr(src.getinfo(name), data, compress_type=zipfile.ZIP_DEFLATED)
    return out


def decide(spec: Spec, python: str, backends: Dict[str, str], probe=chain.run_probe
           ) -> Tuple[Dict[str, str], chain.Chain, Dict[str, str]]:
    """What the bundle holds, from the chain of `backends` (name -> module:attr): distribution ->
    version; the chain; the backends that do not load on this machine (-> why), whose chain the
    install's probe on the target checks."""
    traced = probe(spec.where, backends)
    if len(traced.failed) == len(backends):
        raise SystemExit(f"no backend of {spec.name} loads here, so its chain cannot be traced: "
                         f"{next(iter(traced.failed.values()))}")
    found = chain.sort_modules(traced.modules, chain.owners(), python)
    if found.unowned:
        raise SystemExit(f"modules of {spec.name}'s chain that no installed distribution lists (no bundle can bring "
                         f"them): {', '.join(f'{m} ({f})' for m, f in found.unowned.items())}")
    base = chain.requirement_closure(chain.BASE, python)
    versions = chain.installed_versions()
    wanted = set(found.distributions) - base - {chain.KIT} - {chain.canonical(n) for n in spec.leaves_out}
    pins = {n: versions[n] for n in wanted}
    pins.update((chain.canonical(n), v) for n, _, v in (pin.partition("==") for pin in spec.also))
    return dict(sorted(pins.items())), found, traced.failed


def prove(spec: Spec, bundle: Sequence[str], python: str, loads: Dict[str, str], probe=chain.run_probe) -> None:
    """The probe with the base, what other bundles bring and `bundle` alone on its path: each
    backend that loads here loads from them (else nothing decided the bundle right)."""
    base = chain.requirement_closure(chain.BASE, python)
    with tempfile.TemporaryDirectory() as tmp:
        chain.view([*base, *bundle, *spec.leaves_out], Path(tmp))
        proof = probe(spec.where, loads, path=[tmp], isolated=True)
    if proof.failed:
        raise SystemExit(f"{spec.name}'s bundle and the base alone do not load: "
                         + "; ".join(f"{name}: {why}" for name, why in proof.failed.items()))


def build(spec: Spec, out: Path, wheels: Optional[Path] = None, python: str = "3.12", part_bytes: int = PART_BYTES,
          fetch=download, probe=chain.run_probe, backends: Optional[Dict[str, str]] = None) -> dict:
    backends = backends or registered(spec)
    pins, found, not_here = decide(spec, python, backends, probe)
    prove(spec, list(pins), python, {n: t for n, t in backends.items() if n not in not_here}, probe)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fetched, trimmed = Path(tmp) / "downloads", Path(tmp) / "trimmed"
        fetch([f"{n}=={v}" for n, v in pins.items()], fetched, python, wheels)
        trimmed.mkdir()
        got = {wheel_key(p.name): p for p in sorted(fetched.glob("*.whl"))}
        lacking = sorted(set(pins) - set(got))
        if lacking:
            raise SystemExit(f"no wheel downloaded for: {', '.join(lacking)}")
        engine = chain.canonical(spec.engine)
        if spec.keeps and engine in got:
            got[engine] = trim(got[engine], spec.keeps, trimmed)
        files = [got[n] for n in sorted(pins)]
        manifest = {"bundle": spec.name, "install": f"{spec.command} install", "python": python, **parts.pack(files, out, spec.archive, part_bytes),
                    "wheels": [{"name": p.name, "bytes": p.stat().st_size} for p in files],
                    "modules": {m: next(p.name for p in files if wheel_key(p.name) == d)
                                for m, d in found.top_levels(pins).items()},
                    "elsewhere": found.top_levels(chain.canonical(n) for n in spec.leaves_out),
                    "not_loaded_here": not_here}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def install(spec: Spec, bundle: Path, target: Path, pip=subprocess.run, probe=chain.run_probe,
            backends: Optional[Dict[str, str]] = None) -> List[str]:
    """Installs the bundle into `target`, then checks its backends load from there; returns the
    wheels installed."""
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    if manifest["bundle"] != spec.name:
        raise SystemExit(f"{bundle} is {manifest['bundle']}'s bundle: install it with {manifest['install']}")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = parts.unpack(bundle, manifest, Path(tmp))
        pip([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade", "--target",
             str(target), *map(str, wheels)], check=True)
    names = sorted(p.name for p in wheels)
    print(f"installed into {target}: {len(names)} wheels: " + ", ".join(_named(n) for n in names))
    check(spec, target, manifest, probe, backends)
    return names


def _named(wheel: str) -> str:
    name, version = wheel.split("-")[:2]
    return f"{name} {version}"


def _brought_by(module: str, manifest: dict) -> str:
    """A missing module, with what brings it."""
    if module in manifest["modules"]:
        return f"{module} (wheel {manifest['modules'][module]})"
    if module in manifest.get("elsewhere", {}):
        return (f"{module} ({manifest['elsewhere'][module]}'s own bundle: install it first, its folder on "
                f"PYTHONPATH)")
    return f"{module} (no wheel of the bundle brings it: add its distribution to the Spec's `also`, build again)"


def site_paths(target: Path) -> List[str]:
    """`target` and what its .pth files add to sys.path, in the order Python's site machinery adds
    them: `pip install --target` leaves them unprocessed and a folder on PYTHONPATH is no site
    directory (nvidia-cutlass-dsl puts its `cutlass` on the path so)."""
    code = ("import site, sys; before = list(sys.path); site.addsitedir(sys.argv[1]); "
            "print('\\n'.join(p for p in sys.path if p not in before))")
    found = subprocess.run([sys.executable, "-S", "-c", code, str(target)], capture_output=True, text=True, check=True)
    return found.stdout.splitlines() or [str(target)]


def check(spec: Spec, target: Path, manifest: dict, probe=chain.run_probe,
          backends: Optional[Dict[str, str]] = None) -> None:
    """Each backend the kit registers for the Spec loads in a fresh process with `target` (and what
    its .pth files add) first on its path, every module of the chain and of `runs_import` is there,
    each program is on PATH; else SystemExit naming what is missing and the wheel to add."""
    backends = backends or registered(spec)
    paths = site_paths(target)
    found = probe(spec.where, backends, path=paths, expect=sorted(manifest["modules"]) + list(spec.runs_import))
    bin_path = os.pathsep.join([str(target / "bin"), os.environ.get("PATH", "")])
    no_tool = [tool for tool in spec.tools if shutil.which(tool, path=bin_path) is None]
    if found.missing or found.failed or no_tool:
        lines = [f"{spec.name}'s backends do not all load from {target}:"]
        lines += [f"  {name}: {why}" for name, why in found.failed.items()]
        if found.missing:
            lines.append("missing modules: " + ", ".join(_brought_by(m, manifest) for m in found.missing))
        if no_tool:
            lines.append(f"not on PATH: {', '.join(no_tool)}: export PATH={target / 'bin'}:$PATH")
        raise SystemExit("\n".join(lines))
    print(f"{spec.name}: {len(backends)} backends load from {target} ({', '.join(backends)}): "
          f"export PYTHONPATH={os.pathsep.join(paths)}${{PYTHONPATH:+:$PYTHONPATH}}"
          + (f" PATH={target / 'bin'}:$PATH" if spec.tools else "") + ", then `python -m kit list --backends`")


def main(spec: Spec, argv=None) -> int:
    parser = argparse.ArgumentParser(prog=spec.command, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make the bundle (needs network, or the wheels in --wheels)")
    b.add_argument("out", type=Path)
    b.add_argument("--wheels", type=Path, help="a folder of wheels to take first (e.g. an earlier download)")
    b.add_argument("--python", default="3.12", help="the target's Python version (default 3.12)")
    i = sub.add_parser("install", help="install a bundle on the machine without network, and check it")
    i.add_argument("bundle", type=Path)
    i.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        manifest = build(spec, args.out, args.wheels, args.python)
        sizes = ", ".join(f"{p['bytes'] / 2**20:.1f}" for p in manifest["parts"])
        print(f"{args.out}: {len(manifest['wheels'])} wheels in {len(manifest['parts'])} parts of {sizes} MiB"
              + "".join(f"\n  not loadable here, checked by the install on the target: {n}: {why}"
                        for n, why in manifest["not_loaded_here"].items()))
    else:
        install(spec, args.bundle, args.target)
    return 0
