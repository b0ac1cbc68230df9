"""python scripts/setup.py cpu|cuda [--dry-run] — everything the test command covers, in one step.

Into the Python that runs it (use a virtual environment): torch (on CPU the CPU build, first:
`pip install -e .` first would pull the CUDA build and its NVIDIA packages), the kit with its test
extra (FlashInfer too on CUDA), SGLang's backends (`python -m backends.sglang.install`), vLLM's
backends (`python -m backends.vllm.install`), and the headless browser the HTML report's test drives (Debian's chromium and chromium-driver), and the
installed packages byte-compiled. Each step first looks whether it is done, so a second run
installs nothing and says so.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Callable, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
CPU_TORCH = "torch==2.13.0"
# PyTorch's own CPU wheel index; TORCH_INDEX_URL names another, and a pip configured with an index
# of its own (pip config) is left to it.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRAS = {"cpu": "test", "cuda": "test,flashinfer"}
# The engines whose backends the test command covers: (name, its distribution, its pinned requirements).
ENGINES = (("SGLang", "sglang", REPO / "backends" / "sglang" / "requirements-cpu.txt"),
           ("vLLM", "vllm", REPO / "backends" / "vllm" / "requirements-cpu.txt"))
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER_PACKAGES = ("chromium", "chromium-driver")


@dataclasses.dataclass
class Step:
    what: str
    done: Callable[[], Optional[str]]  # what is there already, or None when the step must run
    commands: Callable[[], List[List[str]]]
    required: bool = True  # a failed step that is not required is a warning
    background: bool = False  # runs while the next steps do (on a core pip leaves idle); not required
    waits: bool = False  # runs once the background steps have ended
    how: str = ""  # what it downloads, with what: said before anything runs


def _version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pip(*args: str) -> List[str]:
    """pip install, its progress shown: a quiet pip said nothing for minutes."""
    return [sys.executable, "-m", "pip", "install", *args]


def torch_index() -> List[str]:
    """pip options for the CPU build of torch: TORCH_INDEX_URL, else pip's own configured index,
    else PyTorch's CPU index."""
    if os.environ.get("TORCH_INDEX_URL"):
        return ["--index-url", os.environ["TORCH_INDEX_URL"]]
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    if "index-url" in config or os.environ.get("PIP_INDEX_URL"):
        return []
    return ["--index-url", CPU_INDEX]


def _kit_installed(extras: str) -> Optional[str]:
    """The kit installed editable from this checkout, with its extras' packages, or None."""
    try:
        dist = importlib.metadata.distribution("attention-conformance-kit")
    except importlib.metadata.PackageNotFoundError:
        return None
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    if url.get("url") != REPO.as_uri() or not url.get("dir_info", {}).get("editable"):
        return None
    wanted = [r.split(";")[0].strip() for r in dist.requires or []
              if any(f'extra == "{e}"' in r for e in extras.split(","))]
    names = [w.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for w in wanted]
    if not all(_version(n) for n in names):
        return None
    return f"the kit, editable from {REPO}, with [{extras}]"


def _engine(dist: str, requirements: Path) -> Optional[str]:
    """The engine at the version its adapter is pinned to (its requirements' pin), or None: then
    `python -m backends.<dist>.install` installs it, or says why the installed one is not used."""
    pin = next(line.split("==")[1].strip() for line in requirements.read_text().splitlines()
               if line.startswith(f"{dist}=="))
    return f"{dist} {pin}" if _version(dist) == pin else None


def browser_paths() -> Optional[Tuple[str, str]]:
    """(browser, chromedriver) executables for the HTML report's test, or None. CHROMEWEBDRIVER:
    the folder of a chromedriver not on PATH (as hosted CI runners have it)."""
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = shutil.which("chromedriver") or shutil.which("chromedriver", path=os.environ.get("CHROMEWEBDRIVER", ""))
    return (found, driver) if found and driver else None


def browser() -> Optional[str]:
    paths = browser_paths()
    return paths and " and ".join(paths)


# Byte-compiled once here, on every core, rather than by each test process: where
# PYTHONDONTWRITEBYTECODE is set (as on many CI machines) nothing compiled at import is kept, so each
# of the suite's many processes would compile torch's, sglang's, transformers' and the kit's modules again; where
# it is not, the first processes, started together, would each compile the same modules. Files that
# are not Python 3 (templates, old examples) are left as they are, and so are the parts of sglang
# nothing here imports (NOT_IMPORTED: its diffusion serving stack and its own tests, a tenth of
# what is installed).
NOT_IMPORTED = r"[\\/](sglang[\\/](multimodal_gen|test)|flashinfer[\\/]data)[\\/]"
COMPILE = ("import compileall, re, sys; [compileall.compile_dir(d, quiet=2, workers=int(sys.argv[1]), "
           f"rx=re.compile({NOT_IMPORTED!r})) for d in sys.argv[2:]]")  # workers: 0 for every core
COMPILED = ("torch", "transformers", "sglang", "vllm")  # the largest packages the suite imports


def compile_dirs() -> List[str]:
    """Where pip installs, and this checkout's own packages (a clean checkout has no .pyc either)."""
    return (sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
            + sorted(str(init.parent) for init in REPO.glob("*/__init__.py")))


def compiled(names=COMPILED) -> Optional[str]:
    """`names` byte-compiled (their package modules have their .pyc), or None."""
    found = {name: spec.origin for name in names
             if (spec := importlib.util.find_spec(name)) is not None and spec.origin}
    if found and all(Path(importlib.util.cache_from_source(origin)).exists() for origin in found.values()):
        return f"{', '.join(found)} byte-compiled"
    return None


def _compile(workers: int = 0) -> List[List[str]]:
    return [[sys.executable, "-c", COMPILE, str(workers), *compile_dirs()]]


def _apt() -> List[List[str]]:
    sudo = [] if os.geteuid() == 0 or not shutil.which("sudo") else ["sudo"]
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    return [sudo + ["apt-get", "update", "-q"],
            sudo + env + ["apt-get", "install", "-y", "-q", "--no-install-recommends", *BROWSER_PACKAGES]]


def steps(kind: str) -> List[Step]:
    out = []
    if kind == "cpu":  # before the kit: its torch requirement would otherwise resolve the CUDA build
        out.append(Step(f"torch (CPU build, {CPU_TORCH})", lambda: _version("torch") and f"torch {_version('torch')}",
                        lambda: [_pip(CPU_TORCH, *torch_index())],
                        how=f"pip, from {(torch_index() or ['', 'the index pip is configured with'])[1]}, "
                            f"about 200 MB"))
    # torch and its dependencies (a third of what is installed) compile on the core pip leaves idle
    out.append(Step("torch and what it needs, byte-compiled (while the rest installs)",
                    lambda: compiled(("torch",)), lambda: _compile(workers=1), required=False, background=True,
                    how="on a core pip leaves idle, no download"))
    extras = EXTRAS[kind]
    out.append(Step(f"the kit with [{extras}]", lambda: _kit_installed(extras),
                    lambda: [_pip("-e", f"{REPO}[{extras}]")],
                    how="pip, editable from this checkout" + (" (CUDA torch and FlashInfer: gigabytes)"
                                                              if kind == "cuda" else "")))
    for name, dist, requirements in ENGINES:
        out.append(Step(f"{name}'s backends ({dist} without its serving stack)",
                        lambda d=dist, r=requirements: _engine(d, r),
                        lambda d=dist: [[sys.executable, "-m", f"backends.{d}.install"]],
                        how=f"pip, --no-deps, from {Path(requirements).relative_to(REPO)}"))
    # Required where CI runs the whole suite (CPU): there the HTML report's test fails without it.
    out.append(Step(f"a headless browser for the HTML report's test ({', '.join(BROWSER_PACKAGES)})",
                    browser, _apt, required=kind == "cpu" and os.environ.get("CI") == "true",
                    how=f"apt-get{' with sudo' if _apt()[0][0] == 'sudo' else ''}, about 440 MB; without it "
                        f"the HTML report's test skips (under CI it fails)"))
    out.append(Step("the rest of the installed packages and the kit, byte-compiled", compiled, _compile,
                    required=False, waits=True, how="on every core, no download"))
    return out


def run(kind: str, dry_run: bool = False) -> int:
    installed, present, background = [], [], []
    todo = []
    for step in steps(kind):
        there = step.done()
        if there:
            print(f"setup: {step.what}: already there ({there})")
            present.append(step.what)
        else:
            todo.append(step)
    if todo:  # what is about to be downloaded and with what, before any of it runs
        print(f"setup {kind}: {'would install' if dry_run else 'installs'}, in this order:")
        for step in todo:
            print(f"  - {step.what}" + (f": {step.how}" if step.how else ""), flush=True)
    for step in todo:
        if step.waits:
            _wait(background)
        if step.background and not dry_run:
            thread = threading.Thread(target=_run_step, args=(step, False))
            thread.start()
            background.append(thread)
            installed.append(step.what)
            continue
        code = _run_step(step, dry_run)
        if code and step.required:
            return code
        if not code:
            installed.append(step.what)
    _wait(background)
    if not installed:
        print(f"setup {kind}: nothing to install, all {len(present)} steps already done")
    else:
        print(f"setup {kind}: {'would install' if dry_run else 'installed'}: {'; '.join(installed)}"
              + (f" (already there: {len(present)})" if present else "") + ("" if dry_run else "; done"))
    return 0


def _run_step(step: Step, dry_run: bool) -> int:
    """The step's commands, one after another; the first exit code that is not 0, else 0."""
    for cmd in step.commands():
        print(f"setup: {step.what}: {'would run' if dry_run else 'running'} {' '.join(cmd)}", flush=True)
        if dry_run:
            continue
        code = subprocess.call(cmd, cwd=REPO)
        if code:
            print(f"setup: {step.what}: failed (exit code {code})" +
                  ("" if step.required else "; the tests that need it skip here"), file=sys.stderr)
            return code
    return 0


def _wait(threads: list) -> None:
    while threads:
        threads.pop().join()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/setup.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(EXTRAS), help="cpu: no GPU (CPU torch, CI); cuda: an NVIDIA GPU")
    parser.add_argument("--dry-run", action="store_true", help="say what would be installed, install nothing")
    args = parser.parse_args(argv)
    return run(args.kind, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
