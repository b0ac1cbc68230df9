"""Triton kernels run by the interpreter without CUDA: one calling @triton.jit helpers in its loop
(its own, which sees `tl`, and Triton's tl.sum, which sees `triton.language.core`); one loading
under a mask that ANDs a scalar comparison with a block's, as SGLang's causal conv1d kernels do;
one calling a module-level alias of a builtin, as SGLang's fla ops do (`exp = tl.exp`); one
multiplying two bfloat16 loads, as SGLang's causal conv1d update does (`x * w`); one casting to an
fp8 dtype, as SGLang's attention kernels cast q and p to an fp8 cache's (`q.to(k.dtype)`)."""
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


@triton.jit
def gather_row_kernel(Rows, Index, Out, n_rows: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.load(Index).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(Rows + row * N + cols, mask=(row < n_rows) & (cols < N), other=0.0)
    tl.store(Out + cols, x, mask=cols < N)


def gather_row(rows: torch.Tensor, index: int, block: int = 8) -> torch.Tensor:
    """rows[index] (zeros where index is past the last row), read under the combined mask."""
    out = torch.zeros(rows.shape[1], dtype=torch.float32)
    gather_row_kernel[(1,)](rows, torch.tensor([index], dtype=torch.int32), out, rows.shape[0], rows.shape[1], block)
    return out


exp_alias = tl.exp


@triton.jit
def exp_kernel(X, Out, N: tl.constexpr):
    cols = tl.arange(0, N)
    tl.store(Out + cols, exp_alias(tl.load(X + cols)))


def exp_of(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    exp_kernel[(1,)](x, out, x.numel())
    return out


@triton.jit
def product_kernel(X, W, Out, N: tl.constexpr):
    cols = tl.arange(0, N)
    tl.store(Out + cols, tl.load(X + cols) * tl.load(W + cols))


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x * w elementwise, in their dtype."""
    out = torch.empty_like(x)
    product_kernel[(1,)](x, w, out, x.numel())
    return out


@triton.jit
def cast_kernel(X, Out, N, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(Out + cols, tl.load(X + cols, mask=cols < N).to(Out.dtype.element_ty), mask=cols < N)


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (1-d) cast to `dtype` inside a kernel."""
    out = torch.empty(x.shape, dtype=dtype)
    cast_kernel[(1,)](x, out, x.numel(), triton.next_power_of_2(x.numel()))
    return out
