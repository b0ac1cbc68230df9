"""KF-65 and KF-92: vLLM 0.33 FLASHINFER with an fp8_e4m3 KV cache on Hopper (SM90). Imports only torch and vLLM
(FlashInfer through it). Needs an NVIDIA GPU.

KF-65, decode: the builder keeps the decode query in the model's dtype, for XQA (flashinfer.py:1142-1154:
`force_use_trtllm_attention() is not False`, the option unset by default), but picks XQA only where FlashInfer's
TRT-LLM kernels can be had (can_use_trtllm_attention: NVIDIA's cubins installed, flashinfer-cubin, or their
artifactory reachable: utils/flashinfer.py:647-697). Without them it plans FlashInfer's native decode wrapper
(flashinfer.py:996-1006), and the impl runs it with q_scale=layer._q_scale_float (:2635-2643) on that unquantized
query; BatchDecodeWithPagedKVCacheWrapper.run multiplies sm_scale by q_scale (flashinfer/decode.py:2907-2908):
every logit comes out q_scale times too large. vLLM's loader leaves q_scale at 1.0 unless the checkpoint carries
one (quantization/kv_cache.py:171-198): a checkpoint with a calibrated q_scale meets the bug.

KF-92, prefill: SM90 prefill quantizes the query to fp8 (flashinfer.py:1157-1166) and runs FlashInfer's FA3 fp8
kernel, whose variant (DefaultFP8Attention = StandardFP8Attention, flashinfer/jit/attention/modules.py:1091-1106,
data/include/flashinfer/attention/hopper/variants.cuh:128-169) has no logit soft cap: the cap the wrapper was
planned with is dropped.

Each scenario runs two layers alike but for one setting, k_scale = v_scale = 1 (the cache holds fp8(k), fp8(v)),
and prints, per layer, the path vLLM took and the output's error (a head's worst, over its RMS) against the float64
attention it should compute (`right`) and against the one the bug computes (`bug`):
- decode (one new token per request), q_scale 1.0 and 2.0: `right` is the attention of the query as handed over
  the cache's K and V, `bug` the same with every logit times q_scale. Expected: `right` within 2% for both.
- prefill (several new tokens per request), no cap and cap 0.5, q_scale 1.0: `right` is the capped attention of
  fp8(q) over the cache's K and V (the query as vLLM quantizes it), `bug` the uncapped one. Expected: `right`
  within 10% (the fp8 probabilities of the PV product) for both.
With the bugs, the second layer of each is FAIL, far from `right` and near `bug`: exit status 1. Where vLLM
takes XQA for decode (the cubins present) the decode path reads FlashInferTrtllmAPIDecode and decode passes.
Run: python THIS_FILE"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile

import torch

logging.getLogger("vllm").setLevel(logging.ERROR)
from vllm.config import (CacheConfig, CompilationConfig, ModelConfig, SchedulerConfig, VllmConfig,  # noqa: E402
                         set_current_vllm_config)
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention import Attention  # noqa: E402
from vllm.model_executor.models.registry import ModelRegistry  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout  # noqa: E402

BACKEND, CACHE_DTYPE, KV_DTYPE, DTYPE, DEVICE = "FLASHINFER", "fp8_e4m3", torch.float8_e4m3fn, torch.bfloat16, "cuda"
HEADS, KV_HEADS, HEAD_DIM, PAGE, MAX_LEN = 8, 2, 128, 16, 512
SCALE = HEAD_DIM ** -0.5
# name: (per layer (q_scale, cap), per request (cached tokens, new tokens), tolerance)
SCENARIOS = {"decode (KF-65)": (((1.0, 0.0), (2.0, 0.0)), ((40, 1), (77, 1), (130, 1), (9, 1)), 0.02),
             "prefill (KF-92)": (((1.0, 0.0), (1.0, 0.5)), ((16, 9), (0, 20), (40, 5)), 0.10)}


class StandIn(torch.nn.Module):
    """The methods vLLM's model registry looks for in a text-generation model class; never built."""
    def __init__(self, *, vllm_config, prefix=""): super().__init__()  # noqa: E704
    def embed_input_ids(self, input_ids): ...  # noqa: E704
    def forward(self, input_ids, positions): ...  # noqa: E704
    def compute_logits(self, hidden_states): ...  # noqa: E704


ModelRegistry.register_model("StandInForCausalLM", StandIn)
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(dict(architectures=["StandInForCausalLM"], model_type="llama", hidden_size=HEADS * HEAD_DIM,
                   num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                   vocab_size=128, intermediate_size=128, max_position_embeddings=MAX_LEN, torch_dtype="bfloat16"), f)
NUM_BLOCKS = 64
config = VllmConfig(model_config=ModelConfig(model=folder, tokenizer=folder, skip_tokenizer_init=True, dtype=DTYPE,
                                             max_model_len=MAX_LEN),
                    cache_config=CacheConfig(block_size=PAGE, cache_dtype=CACHE_DTYPE),
                    scheduler_config=SchedulerConfig(max_model_len=MAX_LEN, max_num_seqs=8,
                                                     max_num_batched_tokens=MAX_LEN, is_encoder_decoder=False),
                    compilation_config=CompilationConfig(max_cudagraph_capture_size=512))
config.cache_config.num_gpu_blocks = NUM_BLOCKS
backend = AttentionBackendEnum[BACKEND].get_class()
gen = torch.Generator().manual_seed(0)


def build(name, settings):
    """Two layers of (q_scale, cap), their caches, and a metadata builder each (FlashInfer's builder plans one cap
    for all the layers it serves)."""
    with set_current_vllm_config(config):
        default = torch.get_default_dtype()
        torch.set_default_dtype(DTYPE)  # vLLM's layers take the activation dtype from it
        layers = [Attention(HEADS, HEAD_DIM, SCALE, num_kv_heads=KV_HEADS, cache_config=config.cache_config,
                            logits_soft_cap=cap or None, prefix=f"{name}.layers.{i}.self_attn.attn",
                            attn_backend=backend).to(DEVICE) for i, (_, cap) in enumerate(settings)]
        torch.set_default_dtype(default)
        for attn, (q_scale, _) in zip(layers, settings):  # a checkpoint's q scale, as vLLM's loader sets it
            attn._q_scale.fill_(q_scale)
            attn._q_scale_float = q_scale
        spec = layers[0].get_kv_cache_spec(config)
        resolve_kv_cache_layout(config, [[layout.name for layout in get_supported_kv_cache_layouts([backend])]], [spec])
        builders = [backend.get_builder_cls()(spec, [a.layer_name], config, torch.device(DEVICE)) for a in layers]
    # vLLM's cache per layer: [blocks, block, kv heads, K|V], bound as the [blocks, kv heads, block, 2 * d] view
    # its runner hands, as bytes (vLLM allocates an fp8 cache as uint8).
    caches = [torch.zeros((NUM_BLOCKS, PAGE, KV_HEADS, 2 * HEAD_DIM), dtype=KV_DTYPE, device=DEVICE) for _ in layers]
    for attn, cache in zip(layers, caches):
        attn.bind_kv_cache(cache.permute(0, 2, 1, 3).view(torch.uint8))
    return layers, caches, builders


def step(layers, caches, builders, requests):
    """One step of `requests` (cached, new): each layer's output [new tokens, heads, d] (float64, CPU), and per
    request its q [new, heads, d] and K, V [cached + new, kv heads, d] as handed; each layer's metadata."""
    pages = [-(-(cached + new) // PAGE) for cached, new in requests]
    first = [1 + sum(pages[:r]) for r in range(len(requests))]  # block 0 unused
    slots = [[(first[r] + t // PAGE) * PAGE + t % PAGE for t in range(c + n)] for r, (c, n) in enumerate(requests)]
    qs = [torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(DTYPE) for _, n in requests]
    kvs = [torch.randn(c + n, 2, KV_HEADS, HEAD_DIM, generator=gen).to(DTYPE) for c, n in requests]
    for cache in caches:  # the cached tokens as the cache stores them (scale 1): fp8(k), fp8(v)
        for r, (cached, _) in enumerate(requests):
            for t in range(cached):
                cache[slots[r][t] // PAGE, slots[r][t] % PAGE] = torch.cat(list(kvs[r][t]), -1).to(KV_DTYPE)
    block_table = torch.zeros(len(requests), -(-MAX_LEN // PAGE), dtype=torch.int32)
    for r, n in enumerate(pages):
        block_table[r, :n] = torch.arange(first[r], first[r] + n)
    slot_mapping = torch.tensor([s for r, (c, _) in enumerate(requests) for s in slots[r][c:]], dtype=torch.int64,
                                device=DEVICE)
    new = torch.tensor([n for _, n in requests], dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in requests], dtype=torch.int32)
    query_start = torch.cat([torch.zeros(1, dtype=torch.int32), new.cumsum(0, dtype=torch.int32)])
    common = CommonAttentionMetadata(
        query_start_loc=query_start.to(DEVICE), query_start_loc_cpu=query_start, seq_lens=seq_lens.to(DEVICE),
        num_reqs=len(requests), num_actual_tokens=int(new.sum()), max_query_len=int(new.max()),
        max_seq_len=int(seq_lens.max()), block_table_tensor=block_table.to(DEVICE), slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=seq_lens)
    metadata = [b.build(common_prefix_len=0, common_attn_metadata=common) for b in builders]
    t = int(new.sum())
    q = torch.cat(qs).to(DEVICE).reshape(t, -1)
    k, v = (torch.cat([x[c:, i] for x, (c, _) in zip(kvs, requests)]).to(DEVICE).reshape(t, -1) for i in (0, 1))
    names = [a.layer_name for a in layers]
    with set_forward_context(dict(zip(names, metadata)), config, slot_mapping={n: slot_mapping for n in names}):
        outs = [attn(q, k, v).view(t, HEADS, HEAD_DIM).double().cpu() for attn in layers]
    return outs, qs, kvs, metadata


def reference(requests, qs, kvs, logit_factor, cap, q_fp8):
    """float64 attention of each new token over its request's keys up to its own (K and V as the fp8 cache
    holds them), every logit times `logit_factor`, then capped (cap > 0), the query fp8(q) where `q_fp8`."""
    rows = []
    for (cached, new), q, x in zip(requests, qs, kvs):
        q = (q.to(KV_DTYPE) if q_fp8 else q).double()
        k, v = (x[:, i].to(KV_DTYPE).double().repeat_interleave(HEADS // KV_HEADS, dim=1) for i in (0, 1))
        logits = torch.einsum("qhd,khd->hqk", q, k) * SCALE * logit_factor
        if cap > 0:
            logits = cap * torch.tanh(logits / cap)
        seen = torch.arange(cached + new)[None, :] <= torch.arange(cached, cached + new)[:, None]
        probs = torch.softmax(logits.masked_fill(~seen, float("-inf")), dim=-1)
        rows.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(rows)


def head_error(out, expected):
    """The worst head's error over its expected output's RMS."""
    err = (out - expected).pow(2).mean(dim=(0, 2)).sqrt() / expected.pow(2).mean(dim=(0, 2)).sqrt()
    return err.nan_to_num(nan=float("inf")).max().item()


failed = False
for name, (settings, requests, tolerance) in SCENARIOS.items():
    layers, caches, builders = build(name.split()[0], settings)
    outs, qs, kvs, metadata = step(layers, caches, builders, requests)
    for i, (out, (q_scale, cap), meta) in enumerate(zip(outs, settings, metadata)):
        path = (f"decode {type(meta.decode).__name__}, query in {meta.q_data_type_decode}" if meta.decode is not None
                else f"prefill {type(meta.prefill).__name__}, query in {meta.q_data_type_prefill}")
        prefill = meta.decode is None
        right = head_error(out, reference(requests, qs, kvs, 1.0, cap, prefill))
        bug = head_error(out, reference(requests, qs, kvs, q_scale, 0.0 if prefill else cap, prefill))
        ok = right <= tolerance
        failed |= not ok
        print(f"{name} layer {i} (q_scale {q_scale}, cap {cap or 'none'}; {path}): error {right:.3g} of a head's RMS "
              f"against the right attention ({'<=' if ok else '>'} limit {tolerance}), {bug:.3g} against the bug's: "
              f"{'PASS' if ok else 'FAIL'}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
