"""Standalone repro of KF-95 (attention conformance kit): SGLang's FlashInfer backend merges its two
extend passes (the new tokens' ragged pass, the cached prefix's paged pass) with SGLang's Triton
merge_state_triton when the heads exceed FlashInfer's merge kernel (flashinfer_backend.py:102-113);
that kernel weighs the passes by exp() of their LSEs (merge_state.py), while FlashInfer's
forward_return_lse returns base-2 LSEs (its default lse_base 'log2').
Imports only torch and SGLang. Builds two partial attentions over disjoint key sets with their LSEs in
base 2, as FlashInfer hands them, merges them with merge_state_triton, and judges the result against
attention over all keys: PASS / FAIL, exit status 1 on FAIL. The same merge with natural-log LSEs
passes, which shows the kernel's convention.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
import math
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from sglang.kernels.ops.attention.merge_state import merge_state_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOKENS, HEADS, DIM, PREFIX, NEW = 4, 128, 128, 40, 9  # 128 heads: past FlashInfer's 64 at head_dim 128
g = torch.Generator().manual_seed(0)
q = torch.randn(TOKENS, HEADS, DIM, generator=g, dtype=torch.float64)
k = torch.randn(PREFIX + NEW, HEADS, DIM, generator=g, dtype=torch.float64)
v = torch.randn(PREFIX + NEW, HEADS, DIM, generator=g, dtype=torch.float64)
scale = DIM ** -0.5


def attend(keys):
    logits = torch.einsum("thd,khd->thk", q, k[keys]) * scale
    lse = torch.logsumexp(logits, dim=-1)  # natural log, [T, H]
    return torch.einsum("thk,khd->thd", torch.softmax(logits, dim=-1), v[keys]), lse


full, _ = attend(slice(0, PREFIX + NEW))
(o1, s1), (o2, s2) = attend(slice(PREFIX, PREFIX + NEW)), attend(slice(0, PREFIX))
failed = False
BASES = (("natural log (the kernel's convention)", 1.0), ("base 2 (FlashInfer's lse_base='log2')", 1 / math.log(2)))
for base, to_base in BASES:
    args = [t.to(DEVICE, torch.float32).contiguous() for t in (o1, s1 * to_base, o2, s2 * to_base)]
    merged, _ = merge_state_triton(args[0].to(torch.bfloat16), args[1], args[2].to(torch.bfloat16), args[3])
    err = (merged.double().cpu() - full).abs().max().item()
    ok = err <= 0.05
    failed |= not ok
    print(f"merge_state_triton, LSEs in {base}: max error {err:.3g} against attention over every key "
          f"(expected <= 0.05, bf16): {'PASS' if ok else 'FAIL'}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
