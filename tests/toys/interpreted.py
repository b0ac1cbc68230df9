"""A Triton kernel calling @triton.jit helpers in its loop: its own (which sees `tl`) and
Triton's tl.sum (which sees `triton.language.core`). Run by the interpreter without CUDA."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _scaled(x, s):
    return tl.where(x > 0, x * s, -x)


@triton.jit
def row_sums_kernel(X, Out, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = 0.0
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * N + cols, mask=cols < N, other=0.0)
        acc += tl.sum(_scaled(x, 2.0), 0)
    tl.store(Out + row, acc)


def row_sums(x: torch.Tensor, block: int = 4) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=torch.float32)
    row_sums_kernel[(x.shape[0],)](x, out, x.shape[1], block)
    return out
