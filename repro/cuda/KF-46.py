"""Standalone repro: vLLM FLASH_ATTN (FA3) under a full CUDA graph of a ragged batch, head dim 64: a replay
whose requests all have one query token reads FA3 scheduler metadata planned for another kernel than the
graph holds, and returns inf rows (KNOWN_FAILURES.md KF-46). Imports only torch and vLLM.

What vLLM's runner does under cudagraph_mode=FULL (FLASH_ATTN's builder declares AttentionCGSupport.ALWAYS on
FA3, so mixed batches replay full graphs):
- it captures the graph of a token count T on its dummy batch: min(T, max_num_seqs) requests of one token,
  max_query_len = T (Model Runner V2, the default: v1/worker/gpu/cudagraph_utils.py, "Mixed graphs can replay a
  single prefill spanning the entire batch"; V1's _dummy_run the same), so FA3's kernel is recorded with
  max_seqlen_q = T;
- a later batch of T requests of one token each (a decode step) replays that graph (cudagraph_mode FULL has no
  separate decode routine), and the builder plans FA3's schedule for it with the batch's own max_query_len = 1
  (v1/worker/gpu/model_states/default.py; flash_attn.py build: _get_scheduler_metadata(max_query_len=...),
  copied into the persistent buffer by _store_scheduler_metadata);
- FA3's get_scheduler_metadata turns causal off for max_seqlen_q == 1 at head dim <= 64 (hopper/flash_api.cpp
  mha_fwd_get_scheduler_metadata, "causal=true is the same as causal=false in this case"), which drops the
  head-swizzle vector from the metadata (its layout shifts: the semaphore moves) and plans kBlockN 160 instead
  of 128 (hopper/tile_size.h): the recorded causal kernel then reads a layout it was not launched for.
At head dim 128 with a paged cache FA3 keeps causal on (the same lines), so the layouts agree.

The script captures FA3's call as vLLM's builder and impl make it, then replays a decode-shaped batch twice:
with the metadata the builder plans (max_seqlen_q = 1) and with metadata planned for the captured
max_seqlen_q; each against a float64 reference. Run on a Hopper GPU: python repro/cuda/KF-46.py [head_dim]
- "runner's metadata: FAIL" and "capture's max_seqlen_q: PASS" at head dim 64: vLLM's builder plans the
  schedule of another kernel than the graph's (the bug); PASS for both at head dim 128.
- PASS for both at 64: this FA3 build no longer changes the plan for a single query token (not reproduced).
- FAIL for both: the setup itself is wrong, no conclusion.
Exit status 1 when the runner's replay fails."""
import sys

import torch

from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

D = int(sys.argv[1]) if len(sys.argv) > 1 else 64
HQ, HKV, PAGE, BLOCKS, T = 8, 1, 16, 512, 16  # T: the graph's token count, as many one-token requests
MAX_MODEL_LEN, SPLITS = 4096, 32  # SPLITS: attention_config.flash_attn_max_num_splits_for_cuda_graph
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)

k_cache = torch.randn(BLOCKS, PAGE, HKV, D, device=dev, dtype=dt)
v_cache = torch.randn(BLOCKS, PAGE, HKV, D, device=dev, dtype=dt)
# The runner's persistent inputs, and the builder's persistent metadata buffer (flash_attn.py __init__: sized
# for max(max_num_seqs, max_cudagraph_capture_size) requests).
q = torch.zeros(T, HQ, D, device=dev, dtype=dt)
out = torch.zeros(T, HQ, D, device=dev, dtype=dt)
cu_q = torch.arange(T + 1, device=dev, dtype=torch.int32)  # one query token per request
seq_lens = torch.zeros(T, device=dev, dtype=torch.int32)
table = torch.zeros(T, MAX_MODEL_LEN // PAGE, device=dev, dtype=torch.int32)
held = torch.zeros(1 + -(-512 // 4) * 4 * 4, device=dev, dtype=torch.int32)


def plan(max_q: int, max_k: int) -> torch.Tensor:
    """FlashAttentionMetadataBuilder._get_scheduler_metadata then _store_scheduler_metadata."""
    fresh = get_scheduler_metadata(batch_size=T, max_seqlen_q=max_q, max_seqlen_k=max_k, num_heads_q=HQ,
                                   num_heads_kv=HKV, headdim=D, cache_seqlens=seq_lens, qkv_dtype=dt,
                                   cu_seqlens_q=cu_q, page_size=PAGE, causal=True, window_size=(-1, -1),
                                   num_splits=SPLITS)
    held[:fresh.shape[0]] = fresh
    held[fresh.shape[0]:] = 0
    return held[:fresh.shape[0]]


def attend(metadata: torch.Tensor, max_q: int, max_k: int) -> None:
    """FlashAttentionImpl.forward's FA3 call."""
    flash_attn_varlen_func(q, k_cache, v_cache, max_seqlen_q=max_q, cu_seqlens_q=cu_q, max_seqlen_k=max_k,
                           seqused_k=seq_lens, softmax_scale=D ** -0.5, causal=True, window_size=(-1, -1),
                           block_table=table, out=out, scheduler_metadata=metadata, num_splits=SPLITS, fa_version=3)


# Capture, as _dummy_run does for T tokens: T one-token requests of T tokens each, the null block, max_seq_len
# the model's; a warm-up first.
seq_lens.fill_(T)
metadata = plan(T, T)
attend(metadata, T, T)
torch.cuda.synchronize()
metadata = plan(T, MAX_MODEL_LEN)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    attend(metadata, T, MAX_MODEL_LEN)

# The replayed batch: T requests of one new token each over cached prefixes, each on pages of its own.
lens = torch.randint(20, 200, (T,))
pages = torch.randperm(BLOCKS - 1)[:T * 13].view(T, 13) + 1
queries = torch.randn(T, HQ, D, dtype=dt)


def reference() -> torch.Tensor:
    rows = []
    for i in range(T):
        n = int(lens[i])
        slots = pages[i].repeat_interleave(PAGE)[:n] * PAGE + torch.arange(n) % PAGE
        k = k_cache.view(-1, HKV, D)[slots.to(dev)].double().repeat_interleave(HQ // HKV, dim=1)
        v = v_cache.view(-1, HKV, D)[slots.to(dev)].double().repeat_interleave(HQ // HKV, dim=1)
        p = torch.softmax(torch.einsum("hd,khd->hk", queries[i].to(dev).double(), k) * D ** -0.5, dim=-1)
        rows.append(torch.einsum("hk,khd->hd", p, v))
    return torch.stack(rows)


expected = reference()
failed = False
for label, planned_q in (("runner's metadata (max_seqlen_q = 1, as build() plans it)", 1),
                         ("metadata planned for the capture's max_seqlen_q", T)):
    q.copy_(queries)
    seq_lens.copy_(lens)
    table.zero_()
    table[:, :13] = pages.to(dev, torch.int32)
    out.fill_(0)
    plan(planned_q, int(lens.max()))
    graph.replay()
    torch.cuda.synchronize()
    got = out.double()
    bad = (~torch.isfinite(got)).flatten(1).any(dim=1)
    err = (got - expected).abs().nan_to_num(nan=float("inf")).max().item()
    ok = err <= 0.05
    failed |= not ok and planned_q == 1
    print(f"head dim {D}, {label}: max error {err:.3g} (expected <= 0.05, bf16), {int(bad.sum())} of {T} rows "
          f"inf/NaN: {'PASS' if ok else 'FAIL'}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
