"""What vLLM needs of the process on a machine without CUDA, and nothing where CUDA is present.

vLLM decides two things once, at its first import, and keeps them for the process:
- its platform (backends/engine_process.py sets it, where either engine is first imported);
- whether Triton is usable (vllm/triton_utils/importing.py:56-78): with no active GPU driver
  (Triton's interpreter) it swaps Triton for a placeholder, every kernel a no-op, unless
  CUDA_VISIBLE_DEVICES is set and empty. That variable is set only around that one import
  (`import_triton_utils`), so nothing else in the process sees it.

Its Triton KV writer asks torch for the device's compute capability (a tile size heuristic,
triton_reshape_and_cache_flash.py:445), which CPU torch refuses; `cuda_capability_answered`
answers for non-CUDA devices while vLLM runs, and puts torch's function back after. Its flex
backend compiles flex attention; `flex_compiles` keeps PyTorch's CPU recompiles static while it
runs.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

import torch

from backends import engine_process

NO_CUDA = engine_process.NO_CUDA
# The capability the Triton KV writer is told for a CPU tensor: it picks its tile size from it
# (Hopper's: the widest tile); the interpreter computes the same at any tile size.
CPU_CAPABILITY = (9, 0)


def import_triton_utils():
    """vllm.triton_utils, imported with CUDA_VISIBLE_DEVICES set and empty where there is no CUDA
    (so vLLM keeps the real Triton for the interpreter), the variable as it was after. Raises
    where it was imported before with the placeholder (nothing here can undo that)."""
    engine_process.prepare()
    if NO_CUDA and "vllm.triton_utils" not in sys.modules:
        had = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            import vllm.triton_utils  # noqa: F401
        finally:
            if had is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = had
    import vllm.triton_utils as triton_utils
    if not triton_utils.HAS_TRITON:
        raise RuntimeError("vLLM replaced Triton with its placeholder: vllm.triton_utils was imported before the "
                           "vLLM adapter set CUDA_VISIBLE_DEVICES='' for it (load backends.vllm first)")
    return triton_utils


@contextlib.contextmanager
def cuda_capability_answered() -> Iterator[None]:
    """While vLLM runs without CUDA: torch.cuda.get_device_capability answers CPU_CAPABILITY for a
    device that is not a CUDA one (CPU torch raises "Torch not compiled with CUDA enabled");
    torch's own function is back after. Where CUDA is present nothing changes."""
    if not NO_CUDA:
        yield
        return
    real = torch.cuda.get_device_capability

    def get_device_capability(device=None):
        if device is None or torch.device(device).type != "cuda":
            return CPU_CAPABILITY
        return real(device)

    torch.cuda.get_device_capability = get_device_capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


# Compiles of one function a process keeps (torch's default: 8), as SGLang's flex backend raises
# its cache's (torch_flex_backend.py:27): a process runs many shapes.
RECOMPILES = 1024


@contextlib.contextmanager
def flex_compiles() -> Iterator[None]:
    """While vLLM's flex backend runs: torch.compile may recompile a function up to RECOMPILES times.
    A server compiles flex attention for its one model; the kit's process runs many models (head
    counts, widths, dtypes, windows), each a recompile of the same function, past dynamo's default
    limit of 8 (FailOnRecompileLimitHit under fullgraph=True, depending on what ran before).
    Without CUDA, recompiles also keep the new shape's static sizes (automatic_dynamic_shapes off):
    PyTorch's CPU flex attention template generates C++ that does not compile for a recompile with
    dynamic shapes (torch 2.13: "'cur_kvSplitSize4' was not declared in this scope")."""
    import torch._dynamo  # here: seconds of imports, and only vLLM's flex backend compiles

    static = {"automatic_dynamic_shapes": False} if NO_CUDA else {}
    with torch._dynamo.config.patch(recompile_limit=RECOMPILES, accumulated_recompile_limit=RECOMPILES, **static):
        yield
