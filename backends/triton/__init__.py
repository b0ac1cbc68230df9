"""Our own Triton attention backend (kernels.py, metadata.py, backend.py).

Without CUDA the kernels run in Triton's interpreter on CPU tensors. The
interpreter is chosen when a kernel is defined, so kernels.py chooses it
(kit.harness.interpreter.choose) and is imported by the launches, when a
backend runs: loading the class sets nothing in the process.
"""
from backends.triton.backend import TritonBackend

__all__ = ["TritonBackend"]
