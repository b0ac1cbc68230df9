"""The compilers' on-disk caches as one archive: `python -m kit warmup --save ARCHIVE` writes it
after the builds, `--restore ARCHIVE` unpacks it on another machine before them, so that its
warmup and matrix load every kernel rather than compile it. Each cache is where its library reads
it on this machine (the variables the libraries read, else their defaults); an archive holds each
under its name, with a manifest of where and with what versions it was written. Torch-free."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set

MANIFEST = "manifest.json"


def _triton() -> Path:
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return Path(os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache"))


def _inductor() -> Path:
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    import getpass
    import re
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def _flashinfer_base() -> Path:
    return Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or os.path.expanduser("~"))


def _flashinfer() -> Path:
    return _flashinfer_base() / ".cache" / "flashinfer"


# Per cache, where its library reads it (each library's own rule, read without importing it) and the
# distribution whose version decides whether its entries are any use.
CACHES: Dict[str, Callable[[], Path]] = {"triton": _triton, "inductor": _inductor, "flashinfer": _flashinfer}
DISTRIBUTIONS = {"triton": "triton", "inductor": "torch", "flashinfer": "flashinfer-python"}
# Whose versions decide which kernels a build compiles besides the compilers': the engines' wrappers pick them.
ENGINES = ("sglang", "vllm")


# The variable each library reads its cache's place from, and the place as it reads it now (FlashInfer's
# names the folder its `.cache/flashinfer` goes under).
VARIABLES: Dict[str, Callable[[], Path]] = {"TRITON_CACHE_DIR": _triton, "TORCHINDUCTOR_CACHE_DIR": _inductor,
                                            "FLASHINFER_WORKSPACE_BASE": _flashinfer_base}


def pin() -> None:
    """Name each cache's place in its variable where none is named. A library that, when imported,
    points the caches at its own folder for the whole process where they are unnamed (SGLang's
    import does) then leaves them where every other backend of the process, the warmup's builds and
    its archive find them: kernels compiled once, not once per folder."""
    for variable, place in VARIABLES.items():
        os.environ.setdefault(variable, str(place()))


def where() -> Dict[str, Path]:
    return {name: find() for name, find in CACHES.items()}


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> Dict[str, Optional[str]]:
    return {name: _version(dist) for name, dist in DISTRIBUTIONS.items()}


def engine_versions() -> Dict[str, Optional[str]]:
    return {name: _version(name) for name in ENGINES}


@dataclasses.dataclass
class Restored:
    lines: List[str]  # what was restored, and each version that differs from the one that wrote it
    manifest: Dict

    def held(self, device: str) -> Set[str]:
        """The builds (kit.warmup.Build.key) whose kernels the archive holds for a machine of `device`:
        those its warmup finished, where it was written on that device with this machine's versions of
        the compilers and the engines (else none: the kernels it holds would not be found)."""
        same = (self.manifest.get("device") == device and self.manifest["versions"] == versions()
                and self.manifest.get("engines") == engine_versions())
        return set(self.manifest.get("builds", ())) if same else set()


def save(archive: str, dirs: Optional[Dict[str, Path]] = None, builds: Iterable[str] = (),
         device: Optional[str] = None) -> Dict[str, int]:
    """Every cache of `dirs` (default: this machine's) that exists into `archive` (a tar: gzip where
    its name ends in .gz), with the warmup's finished `builds` and the `device` it ran on: files per cache."""
    dirs = dirs or where()
    files = {name: sum(len(f) for _, _, f in os.walk(d)) for name, d in dirs.items() if d.is_dir()}
    manifest = dict(caches={name: str(dirs[name]) for name in files}, files=files, versions=versions(),
                    engines=engine_versions(), device=device, builds=sorted(builds))
    mode = "w:gz" if archive.endswith(".gz") else "w"
    partial = f"{archive}.partial"
    with tarfile.open(partial, mode) as tar:
        for name in files:
            tar.add(dirs[name], arcname=name)
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            tar.add(f.name, arcname=MANIFEST)
    os.replace(partial, archive)  # a save stopped half-way leaves no archive to restore
    return files


def restore(archive: str, dirs: Optional[Dict[str, Path]] = None) -> Restored:
    """`archive`'s caches into `dirs` (default: this machine's), added to what is there (a file of
    the same name replaced; a cache not there yet moved in whole); lines saying what was restored,
    and any version that differs from the one that wrote it (that library's entries will not be
    found: its kernels compile again)."""
    dirs = dirs or where()
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")  # no member outside tmp, no device or link out of it
        manifest = json.loads((Path(tmp) / MANIFEST).read_text())
        lines = []
        for name in manifest["caches"]:
            if name not in dirs:
                lines.append(f"{name}: in the archive, but this kit keeps no such cache; left out")
                continue
            if dirs[name].exists():
                shutil.copytree(Path(tmp) / name, dirs[name], dirs_exist_ok=True)
            else:
                dirs[name].parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(Path(tmp) / name), str(dirs[name]))
            lines.append(f"{name}: {manifest['files'][name]} files -> {dirs[name]}")
    here = versions()
    for name, version in manifest["versions"].items():
        if name in manifest["caches"] and version != here.get(name):
            lines.append(f"{name}: written with {DISTRIBUTIONS[name]} {version}, this machine has "
                         f"{here.get(name)}: its kernels compile again")
    return Restored(lines, manifest)
