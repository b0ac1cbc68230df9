"""Standalone repro: SGLang 0.5.23 causal_conv1d_update (GDN decode's conv) in bf16 rounds each tap's
product x * w to bf16 before its float32 sum: both operands are bf16 loads, which Triton multiplies
in bf16 (sglang/kernels/ops/mamba/causal_conv1d_triton.py, `acc += matrix_x * matrix_w`).
Imports only torch and SGLang. CUDA (Triton's CPU interpreter multiplies bf16 as uint16 bits).
Exit 1 (FAIL) where the kernel is further from the exact conv than the exact conv rounded once to bf16."""
import sys

import torch
from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

dev = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator().manual_seed(0)
bs, dim, width = 8, 4096, 4
x = torch.randn(bs, dim, generator=gen).bfloat16().to(dev)
state = torch.randn(bs, dim, width - 1, generator=gen).bfloat16().to(dev)
w = (torch.randn(dim, width, generator=gen) / 2).bfloat16().to(dev)
window = torch.cat([state, x[:, :, None]], 2)
out = causal_conv1d_update(x.clone(), state.clone(), w, None, "silu",
                           conv_state_indices=torch.arange(bs, dtype=torch.int32, device=dev))


def silu(acc):
    return acc / (1 + torch.exp(-acc))


exact = silu((window.double() * w.double()).sum(-1))
acc = torch.zeros(bs, dim, dtype=torch.float32, device=dev)
for tap in range(width):
    acc = acc + (window[:, :, tap] * w[:, tap]).float()  # the product rounded to bf16, summed in fp32
err = (out.double() - exact).abs().max().item()
once = (exact.bfloat16().double() - exact).abs().max().item()
print(f"max |kernel - exact| {err:.4g}; exact rounded once to bf16: {once:.4g}")
print("kernel == products rounded to bf16, summed in fp32:", torch.equal(out, silu(acc).bfloat16()))
ok = err <= once
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
