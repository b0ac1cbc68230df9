"""An engine's attention import chain, as a fresh process loads it (probe.py), and the distributions
it needs: those that own the files of the modules it loads, decided by each installed
distribution's file list (RECORD), not by top-level names (a vendored copy is its vendor's).

The target's base is what a CUDA computer with torch has without any bundle: the standard library,
torch and the distributions torch requires (pip installed them with it), and Triton. What the
chain loads beyond the base, the kit's checkout and what another bundle brings is the bundle.

`view` lays out chosen distributions alone (a folder of links to their files) so that the probe,
run there with nothing else on its path (`python -S`), proves them sufficient on the build
machine, with what happens to be installed there out of sight.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

REPO = Path(__file__).resolve().parents[2]
KIT = "attention-conformance-kit"
# The target's base, beyond the standard library: torch with what it requires, and Triton.
BASE = ("torch", "triton")
# Modules of the build's standard library that the target's Python no longer has (PEP 594, PEP 632).
REMOVED_FROM_STDLIB = {"3.12": ("asynchat", "asyncore", "distutils", "imp", "smtpd")}
# Marker values of the target: CPython on x86_64 Linux; python_version is the target's.
TARGET_MARKERS = {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
                  "platform_machine": "x86_64", "platform_python_implementation": "CPython",
                  "implementation_name": "cpython", "extra": ""}
STDLIB_DIRS = tuple(Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib"))
SITE_DIRS = tuple(Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib"))


def canonical(name: str) -> str:
    """A distribution's name as the index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclasses.dataclass
class Probe:
    """What probe.py reported: modules loaded (name -> file), backends that failed, modules missing."""

    modules: Dict[str, Optional[str]]
    failed: Dict[str, str]
    missing: List[str]


def run_probe(spec: str, backends: Dict[str, str], path: Sequence[str] = (), isolated: bool = False,
              expect: Sequence[str] = (), python: str = sys.executable) -> Probe:
    """probe.py in a fresh process from the checkout, `path` first on its PYTHONPATH; `isolated`:
    without the site packages or the caller's PYTHONPATH (python -S), `path` and the standard
    library alone."""
    pythonpath = [str(REPO), *map(str, path)]
    if not isolated and os.environ.get("PYTHONPATH"):
        pythonpath.append(os.environ["PYTHONPATH"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "PYTHONNOUSERSITE": "1"}
    cmd = [python, *(["-S"] if isolated else []), "-m", "backends.offline.probe", "--expect", ",".join(expect), spec,
           *(f"{name}={target}" for name, target in backends.items())]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode or not last.startswith("{"):
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the probe of {spec} did not run (exit code {proc.returncode}): {tail}")
    return Probe(**json.loads(last))


def owners() -> Dict[Path, str]:
    """Each installed file -> the canonical name of the distribution whose RECORD lists it."""
    out: Dict[Path, str] = {}
    for dist in importlib.metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        for file in dist.files or ():
            out.setdefault(Path(dist.locate_file(file)).resolve(), name)
    return out


@dataclasses.dataclass
class Chain:
    """A probe's modules, sorted: distribution -> its top-level modules loaded, the standard
    library's, the checkout's, and those nothing here owns (which no bundle can bring)."""

    distributions: Dict[str, Set[str]]
    stdlib: Set[str]
    checkout: Set[str]
    unowned: Dict[str, str]  # module -> its file

    def top_levels(self, of: Iterable[str]) -> Dict[str, str]:
        """Top-level module -> its distribution, for the distributions `of`."""
        return {module: dist for dist in of for module in sorted(self.distributions.get(dist, ()))}


def _under(path: Path, dirs: Iterable[Path]) -> bool:
    return any(path == d or d in path.parents for d in dirs)


def _importable(top: str) -> bool:
    """Whether an import finds `top` by that name (find_spec raises for a module whose spec is None,
    `__main__` of a script)."""
    try:
        return importlib.util.find_spec(top) is not None
    except ValueError:
        return False


def sort_modules(modules: Dict[str, Optional[str]], owned: Dict[Path, str], target_python: str) -> Chain:
    chain = Chain({}, set(), set(), {})
    removed = REMOVED_FROM_STDLIB.get(target_python, ())
    for name, file in sorted(modules.items()):
        top = name.partition(".")[0]
        if file is None or not os.path.isabs(file):  # built in, a namespace package, a stand-in, generated code
            if name in sys.builtin_module_names:
                chain.stdlib.add(top)
            continue
        path = Path(file).resolve()
        # the checkout first (an editable install's egg-info in it lists its files too); a venv may lie inside it
        if _under(path, (REPO,)) and not _under(path, SITE_DIRS):
            chain.checkout.add(top)
        elif path in owned:
            if not _importable(top):
                continue  # an alias a package put in sys.modules (vllm's `model_executor`): no import finds it by that name
            chain.distributions.setdefault(owned[path], set()).add(top)
        elif _under(path, STDLIB_DIRS) and not _under(path, SITE_DIRS) and top not in removed:
            chain.stdlib.add(top)
        else:
            chain.unowned[name] = file
    return chain


def requirement_closure(names: Iterable[str], target_python: str) -> Set[str]:
    """`names` and, transitively, what their installed metadata requires on the target (extras
    left out), as canonical names."""
    from packaging.requirements import Requirement

    markers = {**TARGET_MARKERS, "python_version": target_python, "python_full_version": f"{target_python}.0"}
    todo, seen = [canonical(n) for n in names], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(markers):
                todo.append(canonical(req.name))
    return seen


def installed_versions() -> Dict[str, str]:
    return {canonical(d.metadata["Name"] or ""): d.version for d in importlib.metadata.distributions()}


def view(distributions: Iterable[str], into: Path) -> Path:
    """A folder holding the installed files of `distributions` alone, as links (their compiled
    bytecode beside them, so nothing compiles again), for a path with nothing else on it."""
    wanted = {canonical(n) for n in distributions}
    for dist in importlib.metadata.distributions():
        if canonical(dist.metadata["Name"] or "") not in wanted:
            continue
        for file in dist.files or ():
            if file.parts[0] == "..":  # scripts and data outside the site folder
                continue
            source = Path(dist.locate_file(file))
            links = [(into / file, source)]
            if source.suffix == ".py":
                cached = Path(importlib.util.cache_from_source(str(source)))
                links.append((into / file.parent / "__pycache__" / cached.name, cached))
            for link, real in links:
                if real.exists() and not link.exists():
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(real)
    return into
