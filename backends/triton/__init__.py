"""Our own Triton attention backend (kernels.py, metadata.py, backend.py).

Without CUDA the kernels run in Triton's interpreter on CPU tensors; the
interpreter is chosen when a kernel is defined, so it is set before the
kernels are imported.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from backends.triton.backend import TritonBackend  # noqa: E402

__all__ = ["TritonBackend"]
