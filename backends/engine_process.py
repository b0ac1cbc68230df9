"""What vLLM, and SGLang (whose attention chain imports vllm: its MoE code), need of the process,
set before either is first imported (vllm/environment.py's import_triton_utils, SGLang's runtime),
never when a backend's class loads.

vLLM decides its platform once, at its first import (vllm/platforms/__init__.py:240): without
CUDA it finds none and takes UnspecifiedPlatform, on which FLEX_ATTENTION asks for pinned memory
and TRITON_MLA for a compute unit count that platform cannot give; VLLM_TARGET_DEVICE=cpu makes it
CpuPlatform. Both engines' kernels are Triton's, which runs them in its interpreter without CUDA.
"""
from __future__ import annotations

import logging
import os

import torch

from kit.harness import interpreter

NO_CUDA = not torch.cuda.is_available()


def prepare() -> None:
    """Without CUDA: Triton's interpreter for the engines' kernels (chosen before triton is first
    imported) and vLLM's CPU platform. Everywhere: vLLM's loggers at errors only, unless
    VLLM_LOGGING_LEVEL says otherwise (outside a server vLLM configures no logging, and its import
    and config log warnings meant for a server's start, in every run, through Python's last-resort
    handler)."""
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("vllm").setLevel(logging.ERROR)
    interpreter.choose()
    if NO_CUDA:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
