"""Finding a backend by name: a registered entry point (the in-box backends are
registered in pyproject.toml in the same group external ones use), or module:attr."""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List, Optional

from kit.report.results import REPO
from kit.targets import import_target

ENTRY_POINT_GROUP = "attention_conformance.backends"
KIT_DISTRIBUTION = "attention-conformance-kit"  # pyproject.toml's name: the in-box backends' package
# The in-box backends: the kit's own kernels (its package also registers the adapters of SGLang's and
# vLLM's backends, which run the engines' kernels). The matrix the benchmarks time and the fuzz
# ledger the checkout tracks are theirs.
IN_BOX = ("torch_native", "triton", "flashinfer", "flashinfer_mla", "torch_sparse_mla", "torch_native_linear",
          "torch_native_hybrid")


class UnknownBackend(LookupError):
    pass


@functools.lru_cache(maxsize=None)  # read once per process: it scans every installed package
def _entry_points() -> Dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def known_backends() -> List[str]:
    """Every registered backend name, in-box and external."""
    return sorted(_entry_points())


def load_backend(spec: str):
    """The backend class for `spec`: a registered name, or `module:attr` for code not registered."""
    eps = _entry_points()
    if spec in eps:
        return eps[spec].load()
    if ":" in spec:
        return import_target(spec)
    hint = "" if eps else " (none registered: install the kit with `pip install -e .`)"
    raise UnknownBackend(
        f"unknown backend {spec!r}; known: {', '.join(sorted(eps)) or '-'}{hint} "
        f"(or give an external one as module:attr, or register entry point group {ENTRY_POINT_GROUP!r})")


def is_in_box(spec: str) -> bool:
    """Whether `spec` is one of the kit's own backends (IN_BOX, registered by the kit's package)."""
    ep = _entry_points().get(spec)
    return spec in IN_BOX and ep is not None and getattr(ep.dist, "name", None) == KIT_DISTRIBUTION


def import_root(spec: str) -> Optional[str]:
    """The folder a fresh `python -m kit` needs on PYTHONPATH to import `spec` (module:attr), where
    its module lies outside this repository and the installed packages (None for those, and for
    registered names): what made it importable here (a PYTHONPATH, the working directory) is gone
    in a fresh shell elsewhere."""
    if ":" not in spec or spec in _entry_points():
        return None
    name = spec.partition(":")[0]
    try:
        found = getattr(sys.modules.get(name), "__spec__", None) or importlib.util.find_spec(name)
    except (ImportError, ValueError):  # it does not import: its run says so
        return None
    if found is None or not found.origin or not found.has_location:
        return None
    origin = Path(found.origin).resolve()
    root = origin.parents[name.count(".") + (origin.name == "__init__.py")]
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib", "stdlib")}
    if root == REPO or root in installed or any(p in root.parents for p in installed):
        return None
    return str(root)


def backend_label(spec: str) -> str:
    """Name used in test ids and results, failing early on an unknown name: the spec itself for
    registered names (not loaded here: importing a backend's library can take seconds, and is
    left to the process that runs it), else the class's `name` or its attribute name."""
    if spec in _entry_points():
        return spec
    cls = load_backend(spec)
    return getattr(cls, "name", None) or spec.rsplit(":", 1)[1].split(".")[-1]


def kernels_of(spec: str) -> str:
    """The registered backend whose kernels `spec` runs: itself if registered, else the nearest
    registered class its class derives from (a mutant or variant made by overriding methods
    builds nothing of its own), else `spec`."""
    eps = _entry_points()
    if spec in eps:
        return spec
    mro = getattr(load_backend(spec), "__mro__", ())
    registered = {load_backend(name): name for name in eps}
    return next((registered[cls] for cls in mro if cls in registered), spec)

