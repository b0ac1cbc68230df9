"""References kept on disk (`KIT_REFERENCE_CACHE=DIR`), shared by every process and later session
that judges the same step: a matrix's workers each build the batches of their runs, every
backend's workers the same ones again, and a reference is most of a batch's cost on a CPU.

A reference depends only on what it reads: the step's requests (which keys each query sees, their
positions), the model's layers and the inputs. Its key is a hash of those (the inputs' and the
plan's bytes, so a changed or reordered input misses), of the kit's engine code that computes
it, and of where it is computed (torch's version, the device: a same-dtype reference rounds as
that device's kernels do). One file a key, found by its name: a lookup costs the same however many
the folder holds. Without the variable nothing is kept."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

ENV = "KIT_REFERENCE_CACHE"
_ENGINE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _code() -> str:
    """The engine's code: a change to how inputs are drawn or references computed misses every key."""
    digest = hashlib.sha256()
    for path in sorted(_ENGINE.rglob("*.py")):
        digest.update(path.relative_to(_ENGINE).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def _tensor(digest, t: Optional[torch.Tensor]) -> None:
    if t is None:
        digest.update(b"none")
        return
    t = t.detach().contiguous().cpu()
    digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def key(step, what) -> str:
    """The hash of everything `step`'s references of kind `what` read, and of how they are computed."""
    digest = hashlib.sha256()
    device = step.inputs[0].q.device
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    digest.update(repr((what, repr(step.plan.case), torch.__version__, device.type, where, _code())).encode())
    for r in step.plan.requests:
        digest.update(repr((r.n_old, r.n_new, r.q_pos)).encode())
        _tensor(digest, r.visible)
        _tensor(digest, r.selected)
    for layer in step.layers:
        digest.update(repr(layer).encode())
    for x in step.inputs:
        for t in (x.q, x.k_new, x.v_new, x.k_old, x.v_old):
            _tensor(digest, t)
    return digest.hexdigest()


def kept(step, what, compute: Callable[[], Dict]) -> Dict:
    """compute(), or what an earlier compute() of the same key left in the cache (on the step's
    device); with no cache, compute()."""
    folder = os.environ.get(ENV)
    if not folder:
        return compute()
    path = Path(folder) / f"{key(step, what)}.pt"
    if path.exists():
        return torch.load(path, map_location=step.inputs[0].q.device)
    made = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save({k: tuple(t if t is None else t.cpu() for t in pair) for k, pair in made.items()}, partial)
    os.replace(partial, path)  # another process reads it whole or not at all
    return made
