"""A backend's Python state, as a captured CUDA graph sees it.

A real graph replays the kernels it recorded: the host values they were launched
with (grid sizes, scalars, which tensor each argument is) stay those of capture,
while the memory behind the tensors is read live. Emulated graphs (no CUDA) call
forward() again, so the kit puts the backend's Python state back to what it was
at capture for that call (`Bindings.restore`), and names the tensors a replay
hook replaced instead of refilling (`tensor_pointers`).

The walk covers the backend's attributes and what they hold: objects with a
__dict__, dataclasses, lists, tuples and dicts; tensors are leaves (never
copied). The kit's own objects (the context, pools, layers) are not walked.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Callable, Dict, Iterator, List, Tuple

import torch

MAX_DEPTH = 6


def _is_kit_object(obj) -> bool:
    return type(obj).__module__.startswith("kit.")


def _children(obj) -> Iterator[Tuple[str, object]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"[{k!r}]", v
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, types.FunctionType,
                                                           types.MethodType)):
        for k, v in vars(obj).items():
            yield f".{k}", v


def _walk(root, visit: Callable[[str, object], None]) -> None:
    seen = set()

    def go(path: str, obj, depth: int) -> None:
        if id(obj) in seen or depth > MAX_DEPTH:
            return
        seen.add(id(obj))
        visit(path, obj)
        if isinstance(obj, torch.Tensor) or (depth and _is_kit_object(obj)):
            return
        for name, child in _children(obj):
            go(path + name, child, depth + 1)

    go("", root, 0)


def tensor_pointers(backend) -> Dict[str, int]:
    """`attribute path -> data pointer` of every tensor the backend holds."""
    out: Dict[str, int] = {}

    def visit(path, obj):
        if isinstance(obj, torch.Tensor) and obj.numel():
            out[path.lstrip(".")] = obj.data_ptr()

    _walk(backend, visit)
    return out


def replaced(before: Dict[str, int], after: Dict[str, int]) -> List[str]:
    """Paths holding another tensor than before (a tensor rebound, not refilled)."""
    return sorted(p for p, ptr in after.items() if p in before and before[p] != ptr)


@dataclasses.dataclass
class Bindings:
    """What every mutable container reachable from the backend held, by reference."""

    saved: List[Tuple[object, object]]

    @classmethod
    def of(cls, backend) -> "Bindings":
        saved = []

        def visit(path, obj):
            if isinstance(obj, dict):
                saved.append((obj, dict(obj)))
            elif isinstance(obj, list):
                saved.append((obj, list(obj)))
            elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.Tensor, type, types.ModuleType)) \
                    and not _is_kit_object(obj):
                saved.append((obj, dict(vars(obj))))

        _walk(backend, visit)
        return cls(saved)

    def restore(self) -> None:
        for obj, held in self.saved:
            if isinstance(obj, list):
                obj[:] = held
                continue
            target = obj if isinstance(obj, dict) else vars(obj)
            for k in [k for k in target if k not in held]:
                del target[k]
            target.update(held)
