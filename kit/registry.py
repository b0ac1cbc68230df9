"""Finding a backend by name: in-box (backends/), entry point, or module:attr."""
from __future__ import annotations

import importlib
import importlib.metadata
from typing import Dict, List

ENTRY_POINT_GROUP = "attention_conformance.backends"


class UnknownBackend(LookupError):
    pass


def import_target(target: str):
    """The object at `module:attr`."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _entry_points() -> Dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def builtin_backends() -> Dict[str, str]:
    from backends import BUILTIN
    return dict(BUILTIN)


def known_backends() -> List[str]:
    return sorted(set(builtin_backends()) | set(_entry_points()))


def load_backend(spec: str):
    """The backend class for `spec`: a known name, or `module:attr` for code the kit did not write."""
    builtin = builtin_backends()
    if spec in builtin:
        return import_target(builtin[spec])
    eps = _entry_points()
    if spec in eps:
        return eps[spec].load()
    if ":" in spec:
        return import_target(spec)
    raise UnknownBackend(
        f"unknown backend {spec!r}; known: {', '.join(known_backends())} "
        f"(or give an external one as module:attr, or register entry point group {ENTRY_POINT_GROUP!r})")


def backend_label(spec: str) -> str:
    """Name used in test ids and results (resolving it, so an unknown name fails early):
    the spec itself for known names, else the class's `name` or its attribute name."""
    cls = load_backend(spec)
    if ":" not in spec:
        return spec
    return getattr(cls, "name", None) or spec.rsplit(":", 1)[1].split(".")[-1]
