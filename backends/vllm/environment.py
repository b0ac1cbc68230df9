"""What vLLM needs of the process on a machine without CUDA, and nothing where CUDA is present.

vLLM decides two things once, at its first import, and keeps them for the process:
- its platform (vllm/platforms/__init__.py:240): without CUDA it finds none and takes
  UnspecifiedPlatform, on which FLEX_ATTENTION asks for pinned memory and TRITON_MLA for a compute
  unit count that platform cannot give; VLLM_TARGET_DEVICE=cpu makes it CpuPlatform. SGLang's
  import chain imports vllm too (its MoE code), so the variable is set when the in-box backends
  package is loaded (backends/__init__.py), before any backend of the process imports either;
- whether Triton is usable (vllm/triton_utils/importing.py:56-78): with no active GPU driver
  (Triton's interpreter) it swaps Triton for a placeholder, every kernel a no-op, unless
  CUDA_VISIBLE_DEVICES is set and empty. That variable is set only around that one import
  (`import_triton_utils`), so nothing else in the process sees it.

Its Triton KV writer asks torch for the device's compute capability (a tile size heuristic,
triton_reshape_and_cache_flash.py:445), which CPU torch refuses; `cuda_capability_answered`
answers for non-CUDA devices while vLLM runs, and puts torch's function back after. Its flex
backend compiles flex attention; `static_compiles` keeps PyTorch's CPU recompiles static while it
runs.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator

import torch

NO_CUDA = not torch.cuda.is_available()
# The capability the Triton KV writer is told for a CPU tensor: it picks its tile size from it
# (Hopper's: the widest tile); the interpreter computes the same at any tile size.
CPU_CAPABILITY = (9, 0)


def prepare() -> None:
    """Without CUDA: Triton's interpreter for vLLM's kernels (set before any kernel is defined) and
    vLLM's CPU platform. Everywhere: vLLM's loggers at errors only, unless VLLM_LOGGING_LEVEL says
    otherwise (outside a server vLLM configures no logging, and its import and config log warnings
    meant for a server's start, in every run, through Python's last-resort handler)."""
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("vllm").setLevel(logging.ERROR)
    if NO_CUDA:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def import_triton_utils():
    """vllm.triton_utils, imported with CUDA_VISIBLE_DEVICES set and empty where there is no CUDA
    (so vLLM keeps the real Triton for the interpreter), the variable as it was after. Raises
    where it was imported before with the placeholder (nothing here can undo that)."""
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
STATIC_RECOMPILES = 1024


@contextlib.contextmanager
def static_compiles() -> Iterator[None]:
    """Without CUDA: torch.compile recompiles a function for a new shape with that shape's static
    sizes (torch._dynamo.config.automatic_dynamic_shapes off), up to STATIC_RECOMPILES of them,
    while it lasts. PyTorch's CPU flex attention template generates C++ that does not compile for a
    recompile with dynamic shapes (torch 2.13: "'cur_kvSplitSize4' was not declared in this scope"),
    which every batch of another shape after the first is. Where CUDA is present nothing changes."""
    if not NO_CUDA:
        yield
        return
    import torch._dynamo  # here: seconds of imports, and only vLLM's flex backend compiles

    with torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=STATIC_RECOMPILES,
                                    accumulated_recompile_limit=STATIC_RECOMPILES):
        yield
