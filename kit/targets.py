"""`module:attr` names of objects (a backend class, a case catalog, a mutant catalog)."""
from __future__ import annotations

import importlib


def import_target(target: str):
    """The object at `module:attr`."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
