"""EXTEND cases: `prefix` = extend_prefix_lens, `new` = extend_seq_lens (ragged, may be 1)."""
from functools import partial

from cases.mla import SMALL_MLA, SMALL_SPARSE_MLA, deepseek, deepseek_v32
from kit.engine.case import GPT_OSS, GQA_32_8, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case, in_every_layout
from kit.modes import ForwardMode

C = partial(Case, mode=ForwardMode.EXTEND)
S = partial(C, heads=SMOKE_GQA)  # a smoke line: the smoke heads (kit.engine.case) unless it names others

SMOKE = [
    S("gqa_ragged_p16_fp32", prefix=(0, 17, 33, 16), new=(5, 1, 16, 3), page=16, dtype="fp32", head_dim=64),
    S("mqa_p1_shuf", prefix=(3, 0, 12), new=(4, 7, 1), heads=SMOKE_MQA, dtype="fp32", head_dim=64,
      layout="shuffled_pages"),
    S("mha_bs1_window_p64_inter", prefix=(70,), new=(20,), heads=SMOKE_MHA, page=64, window=8, dtype="fp32",
      head_dim=64, layout="interleaved_pages"),
    S("gqa_bs8_cap_p1_nonmono", prefix=(3, 9, 1, 27, 12, 0, 33, 6), new=(2, 1, 5, 3, 1, 4, 2, 6), cap=20.0,
      dtype="fp32", head_dim=64, layout="non_monotonic_extend"),
    S("gqa_bf16_p16", prefix=(20, 0), new=(9, 17), page=16, dtype="bf16"),
    S("gqa32_scale_fp16_p16_shuf", prefix=(17, 5), new=(9, 1), heads=GQA_32_8, page=16, scale=0.1,
      dtype="fp16", head_dim=64, layout="shuffled_pages"),
    S("mha_bs1_long_cap_p1", prefix=(1000,), new=(70,), heads=SMOKE_MHA, cap=5.0, scale=0.25, dtype="fp32", head_dim=64),
    S("gqa_hybrid_p16_fp32", prefix=(12, 30), new=(6, 11), page=16, dtype="fp32", head_dim=64, hybrid=True),
    S("gqa_fused_p16_fp32", prefix=(5, 0), new=(3, 2), page=16, dtype="fp32", head_dim=64, inputs="fused_qkv"),
    S("gptoss_window_sinks_hybrid_p16_fp32", prefix=(12, 0), new=(6, 9), page=16, heads=GPT_OSS, head_dim=64,
      dtype="fp32", window=8, hybrid=True, sinks=True),
    S("mla_r32_h16_ragged_p16_fp32", prefix=(0, 17, 33), new=(5, 1, 16), page=16, dtype="fp32", **SMALL_MLA),
    S("mla_deepseek_h128_bs1_p64_fp16", prefix=(5,), new=(3,), page=64, dtype="fp16", **deepseek(128)),
    S("gqa_cap_p16_fp32", prefix=(40, 0, 9), new=(7, 12, 1), page=16, cap=5.0, scale=0.25, dtype="fp32", head_dim=64),
]

# Cap cases use cap 5 at scale 0.25 (scores of std ~2.8): the cap bites, so a dropped cap
# moves bf16 output past tolerance. At cap 30 and the default scale it never did (mutant 12).
# Three window cases, so that no single case stands between the kit and a window bug (mutant 7).
FULL = in_every_layout([
    C("mha_bs1_long_p1", prefix=(1000,), new=(100,), heads=MHA),
    C("gqa_ragged_p16", prefix=(0, 17, 33, 64), new=(5, 1, 16, 3), page=16),
    C("gqa_fp32_ragged_p16", prefix=(0, 17, 33, 64), new=(5, 1, 16, 3), page=16, dtype="fp32"),
    C("mqa_ragged_p64_fp16", prefix=(0, 64, 63, 130, 1, 500), new=(1, 64, 65, 7, 128, 3), heads=MQA, page=64,
      dtype="fp16"),
    C("gqa32_long_p16", prefix=(1024, 0, 2000), new=(256, 1024, 17), heads=GQA_32_8, page=16),
    C("gqa_d64_bs8_p1_fp16", prefix=(5, 90, 1, 300, 17, 64, 2, 129), new=(3, 1, 40, 2, 16, 9, 1, 70),
      head_dim=64, dtype="fp16"),
    C("gqa_window_p16", prefix=(100, 0, 300), new=(80, 200, 5), page=16, window=64),
    C("gqa_window_off_page_edge_p16", prefix=(100, 40), new=(3, 2), page=16, window=20),
    C("gqa_cap_p1", prefix=(50, 0, 3), new=(30, 60, 1), cap=5.0, scale=0.25),
    C("gqa_all_ones_bs9_p16", prefix=(0, 1, 15, 16, 17, 31, 32, 100, 64), new=(1,) * 9, page=16),
    C("gqa_zero_prefix_p64", prefix=(0, 0, 0, 0), new=(64, 65, 1, 130), page=64),
    C("mha_window_long_p1", prefix=(1000, 0), new=(100, 300), heads=MHA, window=256),
    C("gqa_window_cap_p64_fp16", prefix=(70, 0, 130), new=(40, 100, 3), page=64, window=16, cap=5.0, scale=0.25,
      dtype="fp16"),
    C("gqa_hybrid_window_p16", prefix=(100, 0, 37), new=(40, 60, 9), page=16, window=32, hybrid=True),
])

# q, k and v as a model's fused QKV projection hands them (views of one row per token): a
# backend reading them with a dense stride reads other heads' and other tokens' values.
FULL += in_every_layout([
    C("gqa_fused_ragged_p16", prefix=(0, 17, 33, 64), new=(5, 1, 16, 3), page=16, inputs="fused_qkv"),
    C("mha_fused_p1_fp16", prefix=(300, 0), new=(100, 30), heads=MHA, dtype="fp16", inputs="fused_qkv"),
    C("mqa_fused_d64_p64", prefix=(0, 64, 130), new=(64, 1, 7), heads=MQA, head_dim=64, page=64, inputs="fused_qkv"),
])

# Attention sinks (gpt-oss): plain, with a window, over an fp8 cache, at gpt-oss's heads (64 / 8 of 64 on one
# GPU), and in gpt-oss's own model (window 128 on every other layer: hybrid, its full-attention layer with sinks
# of its own).
FULL += in_every_layout([
    C("gqa_sinks_p16", prefix=(100, 0, 37), new=(40, 60, 9), page=16, sinks=True),
    C("mha_bs1_sinks_long_p1", prefix=(1000,), new=(100,), heads=MHA, sinks=True),
    C("mqa_window_sinks_p64_fp16", prefix=(70, 0, 130), new=(40, 100, 3), heads=MQA, page=64, window=16, dtype="fp16",
      sinks=True),
    C("gptoss_sinks_p16", prefix=(90, 0, 640), new=(30, 17, 5), page=16, heads=GPT_OSS, head_dim=64, sinks=True),
    C("gqa_fp8_e4m3_sinks_p16", prefix=(100, 0, 5), new=(20, 33, 9), page=16, kv_dtype="fp8_e4m3", sinks=True),
    C("gptoss_window_sinks_hybrid_p16", prefix=(300, 0, 1000), new=(64, 200, 17), page=16, heads=GPT_OSS, head_dim=64,
      window=128, hybrid=True, sinks=True),
])

# MLA at DeepSeek-V3's shapes (rank 512 + rope 64; 128 heads on one GPU, 16 per rank on 8), with
# and without a prefix.
FULL += in_every_layout([
    C("mla_h16_p1", prefix=(0, 17, 300), new=(5, 64, 1), **deepseek(16)),
    C("mla_h16_long_p64", prefix=(4200, 0, 63), new=(20, 130, 2), page=64, **deepseek(16)),
    C("mla_h16_ragged_p16_fp16", prefix=(0, 16, 33, 64, 5, 100), new=(1, 16, 17, 70, 3, 9), page=16,
      dtype="fp16", **deepseek(16)),
    C("mla_zero_prefix_p16", prefix=(0, 0, 0), new=(30, 64, 5), page=16, **deepseek(128)),
])

# fp8 KV caches (kit.engine.kv_quant): K and V stored quantized, with scales per layer, K's != V's.
# Prefixes in the pool and ragged new tokens: a backend that attends the new tokens from k/v as
# handed (ragged) and the prefix from the pool must dequantize the prefix and only the prefix.
SMOKE += [
    S("gqa_fp8_e5m2_prefix_p16_fp16", prefix=(17, 0), new=(5, 9), page=16, dtype="fp16", head_dim=64,
      kv_dtype="fp8_e5m2"),
    S("mla_r32_h16_fp8_e4m3_p16_fp32", prefix=(17, 0), new=(5, 9), page=16, dtype="fp32", kv_dtype="fp8_e4m3",
      **SMALL_MLA),
]
FULL += in_every_layout([
    C("gqa_fp8_e5m2_ragged_p16", prefix=(0, 17, 33, 64), new=(5, 1, 16, 3), page=16, kv_dtype="fp8_e5m2"),
    C("mha_fp8_e4m3_long_p1_fp16", prefix=(1000,), new=(100,), heads=MHA, dtype="fp16", kv_dtype="fp8_e4m3"),
    C("gqa_fp8_e5m2_bs6_p64", prefix=(0, 64, 63, 130, 1, 500), new=(1, 64, 65, 7, 128, 3), page=64,
      kv_dtype="fp8_e5m2"),
    C("mla_h16_fp8_e4m3_p16", prefix=(16, 0, 300), new=(9, 40, 3), page=16, kv_dtype="fp8_e4m3", **deepseek(16)),
])

# Pairs (kit.engine.pairs; cases/decode.py says why): dense cases, the common features apart from the rarer ones.
FULL += [
    C("gqa_fp8_e5m2_window_cap_fused_p64_fp16", prefix=(70, 0, 130), new=(40, 100, 3), page=64, window=16, cap=5.0,
      scale=0.25, dtype="fp16", inputs="fused_qkv", kv_dtype="fp8_e5m2"),
    C("gqa_fp8_e4m3_window_fused_p16_shuf", prefix=(100, 0, 37), new=(40, 60, 9), page=16, window=32,
      inputs="fused_qkv", kv_dtype="fp8_e4m3", layout="shuffled_pages"),
    C("gptoss_fp32_fp8_e5m2_window_cap_sinks_hybrid_fused_p1_inter", prefix=(300, 0, 17), new=(64, 100, 5),
      heads=GPT_OSS, head_dim=64, window=128, cap=5.0, scale=0.25, dtype="fp32", sinks=True, hybrid=True,
      inputs="fused_qkv", kv_dtype="fp8_e5m2", layout="interleaved_pages"),
    C("mla_h16_fp32_fp8_e5m2_p64_nonmono", prefix=(4200, 0, 63), new=(20, 130, 2), page=64, dtype="fp32",
      kv_dtype="fp8_e5m2", layout="non_monotonic_extend", **deepseek(16)),
    C("mha_fp8_e4m3_cap_hybrid_p64_fp16", prefix=(1000, 63), new=(100, 2), heads=MHA, page=64, cap=5.0, scale=0.25,
      hybrid=True, dtype="fp16", kv_dtype="fp8_e4m3"),
    C("gqa_fp32_fp8_e4m3_cap_p16", prefix=(0, 17, 33, 64), new=(5, 1, 16, 3), page=16, cap=5.0, scale=0.25,
      dtype="fp32", kv_dtype="fp8_e4m3"),
]
SMOKE += [
    S("gqa_fp8_e4m3_window_cap_sinks_hybrid_fused_p64_shuf", prefix=(70, 0), new=(20, 9), page=64, head_dim=64,
      window=8, cap=5.0, scale=0.25, sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e4m3",
      layout="shuffled_pages"),
    S("gqa_fp8_e5m2_window_sinks_hybrid_fused_p1_inter_fp16", prefix=(12, 0), new=(6, 9), head_dim=64, window=8,
      dtype="fp16", sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e5m2", layout="interleaved_pages"),
    S("gqa_fp8_e5m2_window_hybrid_fused_p64_nonmono", prefix=(70, 5), new=(3, 9), page=64, head_dim=64, window=8,
      hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e5m2", layout="non_monotonic_extend"),
    # a fresh prompt before a cached request: a decode-first engine (vLLM) hands them the other way round
    S("gqa_window_sinks_hybrid_fused_fresh_first_p64_fp32", prefix=(0, 70), new=(9, 20), page=64, head_dim=64,
      window=8, sinks=True, hybrid=True, inputs="fused_qkv", dtype="fp32"),
    S("gqa_fp8_e5m2_cap_p16_inter_fp16", prefix=(17, 5), new=(9, 1), page=16, head_dim=64, cap=5.0, scale=0.25,
      dtype="fp16", kv_dtype="fp8_e5m2", layout="interleaved_pages"),
    S("gqa_sinks_p1_nonmono_fp16", prefix=(9, 0), new=(4, 7), head_dim=64, dtype="fp16", sinks=True,
      layout="non_monotonic_extend"),
    S("mla_r32_h16_fp8_e4m3_p1_inter", prefix=(0, 17), new=(5, 9), kv_dtype="fp8_e4m3", layout="interleaved_pages",
      **SMALL_MLA),
    S("mla_r32_h16_fp8_e5m2_p1_shuf_fp32", prefix=(17, 0), new=(5, 9), dtype="fp32", kv_dtype="fp8_e5m2",
      layout="shuffled_pages", **SMALL_MLA),
    S("mla_r32_h16_fp8_e4m3_p16_nonmono_fp16", prefix=(33, 5), new=(4, 16), page=16, dtype="fp16",
      kv_dtype="fp8_e4m3", layout="non_monotonic_extend", **SMALL_MLA),
]

# Sparse MLA (DeepSeek-V3.2's DSA, kit/engine/kinds/sparse_mla.py): each query attends the keys its indexer
# selected within its causal view (kit.engine.sparse); a chunk's first queries see fewer keys than the top-k.
SMOKE += [
    S("smla_r32_h16_ragged_p16_fp32", prefix=(0, 17, 33), new=(5, 1, 16), page=16, dtype="fp32", **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e4m3_p1_shuf_fp16", prefix=(5, 0), new=(9, 20), dtype="fp16", kv_dtype="fp8_e4m3",
      layout="shuffled_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e5m2_p64_inter", prefix=(70, 3), new=(3, 7), page=64, kv_dtype="fp8_e5m2",
      layout="interleaved_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_p16_nonmono_fp32", prefix=(33, 8), new=(4, 17), page=16, dtype="fp32",
      layout="non_monotonic_extend", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e4m3_p64_fp32", prefix=(64, 0), new=(2, 70), page=64, dtype="fp32",
      kv_dtype="fp8_e4m3", index_scatter=True, **SMALL_SPARSE_MLA),
    # every query sees more keys than the top-k: each row a selection, page edges first, no -1
    S("smla_r32_h16_selects_p16_fp32", prefix=(30, 16), new=(3, 2), page=16, dtype="fp32", **SMALL_SPARSE_MLA),
]
# bf16 at 64-token pages (h128 _p64 lines): what the engines' sparse kernels take (vLLM's FLASHMLA_SPARSE).
FULL += in_every_layout([
    C("smla_h128_p64", prefix=(0, 3000, 63), new=(2100, 20, 130), page=64, **deepseek_v32(128)),
    C("smla_h16_scatter_fp8_e4m3_p64_fp16", prefix=(4100, 0, 64), new=(9, 300, 2), page=64, dtype="fp16",
      kv_dtype="fp8_e4m3", index_scatter=True, **deepseek_v32(16)),
    C("smla_h16_scatter_fp8_e5m2_p1_fp32", prefix=(2040, 17), new=(30, 1), dtype="fp32", kv_dtype="fp8_e5m2",
      index_scatter=True, **deepseek_v32(16)),
    C("smla_h128_scatter_p16", prefix=(16, 2500, 0, 100), new=(17, 1, 64, 9), page=16, index_scatter=True,
      **deepseek_v32(128)),
    C("smla_h128_scatter_p64", prefix=(64, 0, 2047), new=(300, 2050, 1), page=64, index_scatter=True,
      **deepseek_v32(128)),
    # no query under the top-k; rows a decode-first engine keeps in their order (both with a cached prefix)
    C("smla_h16_selects_fp8_e5m2_p64_fp32", prefix=(2100, 3000), new=(5, 9), page=64, dtype="fp32",
      kv_dtype="fp8_e5m2", **deepseek_v32(16)),
    # 32 heads: what SGLang's Triton sparse prefill takes (triton_sparse_mla, at most 32 a rank)
    C("smla_h32_p64", prefix=(0, 3000), new=(2100, 20), page=64, **deepseek_v32(32)),
])

# 128 query heads on one rank (Llama 3.1 405B's 128 over 8 at TP 1, as DP attention runs it): more heads than
# FlashInfer's merge kernel launches in one block at head_dim 128 in 16 bits (64), where a backend merging a
# cached prefix's pass with the new tokens' takes another merge path.
FULL += [C("gqa128_prefix_p16", prefix=(300, 0, 40), new=(64, 20, 9), heads=(128, 8), page=16)]
