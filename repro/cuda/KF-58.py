"""Standalone repro: flex_attention compiled and called as SGLang 0.5.23's TorchFlexAttnBackend does for an EXTEND
batch (KNOWN_FAILURES.md KF-58: inductor's NoValidChoicesError). Imports only torch.

SGLang (srt/layers/attention/torch_flex_backend.py) compiles `torch.compile(flex_attention, dynamic=True)` once,
with dynamo's cache limits raised to 1024, then per request of a batch, in order: a causal block mask of L x L
(L = the request's seq_lens entry, a 0-d device tensor, create_block_mask(..., _compile=False)), the query padded
to L rows (its new tokens last, the rest uninitialized), keys and values of the request's L tokens gathered from
the KV pool ([tokens, kv heads, head dim]) by their slots and moved to [kv heads, L, head dim] (a transposed
view: strides head dim, kv heads x head dim, 1), enable_gqa where the heads differ. This script
makes the same calls for the kit's failing cases' batches (heads, head dim, dtype, prefix and new lengths) and
for cases that pass in the kit's records, each case in a fresh compile (torch._dynamo.reset(), as a worker's
first EXTEND), and judges each request's new rows against a float64 reference. Run on the GPU the entry names
(torch 2.11): python repro/cuda/KF-58.py
- a case that raises NoValidChoicesError here: PyTorch's inductor alone fails to lower flex_attention for that
  batch (the bug is PyTorch's; the line printed names the request length at which the lowering failed, the static
  pass (dynamic=False) of its failing request whether dynamic shapes are needed for it, its int32 pass whether the
  int32 lengths the kit renders matter).
- a case the kit's records fail that PASSES here: its failure there takes more than this batch: the batches its
  run gave the backend before it (the kit's eager sequence starts with other lengths), or what that process had
  compiled before (a worker of the kit's matrix runs many models, an engine's worker one).
Its last pass makes the same calls with K and V contiguous ([kv heads, L, head dim] copied), to tell whether
SGLang's transposed K/V views are what inductor fails to lower. Exit status 1 when a case fails SGLang's calls."""
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

dev = "cuda"
# name: (q heads, kv heads, head dim, dtype, cached prefixes, new tokens, in the kit's records)
CASES = {
    "gqa_ragged_p16": (8, 2, 128, torch.bfloat16, (0, 17, 33, 64), (5, 1, 16, 3), "fails in the kit"),
    "gqa_all_ones_bs9_p16": (8, 2, 128, torch.bfloat16, (0, 1, 15, 16, 17, 31, 32, 100, 64), (1,) * 9,
                             "fails in the kit"),
    "gqa_zero_prefix_p64": (8, 2, 128, torch.bfloat16, (0, 0, 0, 0), (64, 65, 1, 130), "fails in the kit (H200)"),
    "mqa_ragged_p64_fp16": (8, 1, 128, torch.float16, (0, 64, 63, 130, 1, 500), (1, 64, 65, 7, 128, 3),
                            "fails in the kit"),
    "mqa_fused_d64_p64": (8, 1, 64, torch.bfloat16, (0, 64, 130), (64, 1, 7), "fails in the kit"),
    "gqa_d64_bs8_p1_fp16": (8, 2, 64, torch.float16, (5, 90, 1, 300, 17, 64, 2, 129), (3, 1, 40, 2, 16, 9, 1, 70),
                            "passes in the kit"),
    "gqa_fp32_ragged_p16": (8, 2, 128, torch.float32, (0, 17, 33, 64), (5, 1, 16, 3), "passes in the kit"),
    "gqa32_long_p16": (32, 8, 128, torch.bfloat16, (1024, 0, 2000), (256, 1024, 17), "passes in the kit"),
    "mha_fused_p1_fp16": (8, 8, 128, torch.float16, (300, 0), (100, 30), "passes in the kit"),
}


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def reference(q, k, v, scale):
    """float64 causal attention of q [Hq, n, D] (the last n of L positions) over k, v [Hkv, L, D]."""
    g = q.shape[0] // k.shape[0]
    k, v = (x.double().repeat_interleave(g, dim=0) for x in (k, v))
    n, L = q.shape[1], k.shape[1]
    s = torch.einsum("hqd,hkd->hqk", q.double(), k) * scale
    seen = torch.arange(L, device=dev)[None, :] <= torch.arange(L - n, L, device=dev)[:, None]
    return torch.einsum("hqk,hkd->hqd", torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1), v)


def run_case(hq, hkv, d, dtype, prefix, new, dynamic, lens_dtype, only=None, contiguous=False):
    """SGLang's per-request calls for one batch (`only`: that request alone; `contiguous`: K and V copied
    contiguous); returns (whether it passed, the failing request or None, a verdict line)."""
    torch._dynamo.reset()
    torch._dynamo.config.cache_size_limit = 1024  # as TorchFlexAttnBackend.__init__ sets them
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    compiled = torch.compile(flex_attention, dynamic=dynamic)
    seq_lens = torch.tensor([p + n for p, n in zip(prefix, new)], device=dev, dtype=lens_dtype)
    scale = d ** -0.5
    worst = 0.0
    for i, (p, n) in enumerate(zip(prefix, new)):
        if only is not None and i != only:
            continue
        L = seq_lens[i]
        torch.manual_seed(i)
        q_new = torch.randn(hq, n, d, device=dev, dtype=dtype)
        slots = torch.randperm(p + n, device=dev)  # the request's row of req_to_token: its tokens' pool slots
        k, v = (torch.randn(p + n, hkv, d, device=dev, dtype=dtype)[slots].movedim(0, 1) for _ in range(2))
        if contiguous:
            k, v = k.contiguous(), v.contiguous()
        mask = create_block_mask(causal, None, None, L, L, device=dev, _compile=False)
        q = torch.empty((hq, L, d), device=dev, dtype=dtype)
        q[:, p:, :] = q_new
        try:
            out = compiled(q[None], k[None], v[None], block_mask=mask, scale=scale, enable_gqa=hq != hkv)[0]
        except Exception as exc:  # noqa: BLE001 - the lowering's error is the finding: name it
            what = "NoValidChoicesError" if "NoValidChoicesError" in str(exc) else type(exc).__name__
            return False, i, f"request {i + 1} (L={p + n}, {n} new): {what}"
        worst = max(worst, (out[:, p:].double() - reference(q_new, k, v, scale)).abs().max().item())
    return worst <= 0.05, None, f"max error {worst:.3g}"


failed = {}  # case -> the request its dynamic compile failed at, with SGLang's calls
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
# seq_lens as SGLang's scheduler makes them (int64) over every case; then each case that failed again with them as
# its graph runner and the kit hold them (int32), and its failing request compiled static; then every case with K
# and V contiguous.
for dynamic, lens_dtype, contiguous in ((True, torch.int64, False), (True, torch.int32, False),
                                        (False, torch.int64, False), (True, torch.int64, True)):
    for name, (hq, hkv, d, dtype, prefix, new, kit) in CASES.items():
        if lens_dtype is torch.int64 and dynamic or name in failed:
            ok, at, what = run_case(hq, hkv, d, dtype, prefix, new, dynamic, lens_dtype,
                                    only=None if dynamic else failed[name], contiguous=contiguous)
            if not ok and not contiguous:
                failed.setdefault(name, at)
            kv = "K/V contiguous" if contiguous else "K/V as SGLang's"
            print(f"dynamic={dynamic} seq_lens {lens_dtype} {kv} {name} ({kit}): {what}: {'PASS' if ok else 'FAIL'}",
                  flush=True)
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
