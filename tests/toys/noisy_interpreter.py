"""torch_native, after a Triton kernel that computes NaN in masked lanes (-inf, the fill past a
row's end, times 0), as attention kernels do on lanes past a sequence's end: on CPU the
interpreter warns, the output is right."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from backends.torch_native import TorchNativeBackend  # noqa: E402


@triton.jit
def _masked_softmax_row(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """The row's softmax numerator over its n lanes; the lanes past n hold -inf, and a term
    computed from them is NaN, in lanes no store keeps."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
    tail = tl.where(offs >= n, x, 0.0)
    dropped = tail - tl.max(tail, axis=0)
    tl.store(out_ptr + offs, tl.exp(x - tl.max(x, axis=0)) + dropped * 0, mask=offs < 0)
    tl.store(out_ptr + offs, tl.exp(x - tl.max(x, axis=0)), mask=offs < n)


def masked_softmax_row(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _masked_softmax_row[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()) * 2)
    return out


class NoisyInterpreterBackend(TorchNativeBackend):
    name = "toy_noisy_interpreter"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        masked_softmax_row(torch.ones(3, dtype=torch.float32, device=q.device))
        return super().forward(q, k, v, layer, batch, save_kv_cache)
