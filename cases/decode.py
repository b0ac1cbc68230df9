"""DECODE cases: `prefix` = tokens cached before the step (seq_len = prefix + 1)."""
from functools import partial

from cases.mla import SMALL_MLA, SMALL_SPARSE_MLA, deepseek, deepseek_v32
from kit.engine.case import GPT_OSS, GQA_32_8, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case, in_every_layout
from kit.modes import ForwardMode

C = partial(Case, mode=ForwardMode.DECODE)
S = partial(C, heads=SMOKE_GQA)  # a smoke line: the smoke heads (kit.engine.case) unless it names others

SMOKE = [
    S("gqa_ragged_p16_fp32", prefix=(0, 15, 16, 17, 40), page=16, dtype="fp32", head_dim=64),
    S("mqa_p1_shuf", prefix=(5, 30, 1), heads=SMOKE_MQA, dtype="fp32", head_dim=64, layout="shuffled_pages"),
    S("mha_bs1_window_p64_inter", prefix=(70,), heads=SMOKE_MHA, page=64, window=8, dtype="fp32", head_dim=64,
      layout="interleaved_pages"),
    S("gqa_bs8_cap_p1_nonmono", prefix=(3, 9, 1, 27, 12, 0, 33, 6), cap=20.0, dtype="fp32", head_dim=64,
      layout="non_monotonic_extend"),
    S("gqa_bf16_p16", prefix=(20, 33), page=16, dtype="bf16"),
    S("gqa32_scale_fp16_p16_shuf", prefix=(9, 33), heads=GQA_32_8, page=16, scale=0.1, dtype="fp16", head_dim=64,
      layout="shuffled_pages"),
    S("mha_bs1_long_cap_p1", prefix=(1100,), heads=SMOKE_MHA, cap=5.0, scale=0.25, dtype="fp32", head_dim=64),
    S("gqa_hybrid_p16_fp32", prefix=(9, 30, 17), page=16, dtype="fp32", head_dim=64, hybrid=True),
    S("gqa_fused_p16_fp32", prefix=(5, 17), page=16, dtype="fp32", head_dim=64, inputs="fused_qkv"),
    S("gqa_window_sinks_hybrid_p16_fp16", prefix=(40, 3), page=16, dtype="fp16", head_dim=64, window=8, hybrid=True,
      sinks=True),
    S("gptoss_sinks_p16_fp32", prefix=(70, 9), page=16, heads=GPT_OSS, head_dim=64, dtype="fp32", sinks=True),
    S("mla_r32_h16_ragged_p16_fp32", prefix=(0, 15, 40, 17), page=16, dtype="fp32", **SMALL_MLA),
    S("mla_deepseek_h128_bs1_p64_fp16", prefix=(70,), page=64, dtype="fp16", **deepseek(128)),
    # Past one KV split of a split-KV MLA decode (vLLM's TRITON_MLA: one per 512 keys, a power of two), at a
    # length two splits do not divide.
    S("mla_deepseek_h128_bs1_long_p64_fp16", prefix=(1100,), page=64, dtype="fp16", **deepseek(128)),
    # Each request's window starts on its page's last slot (positions 23 and 39, window 8, pages of 16).
    S("gqa_window_page_edge_p16_fp32", prefix=(23, 39), page=16, window=8, dtype="fp32", head_dim=64),
    # A cap of the case's own at 16-token pages (vLLM's TRITON_ATTN takes no 1-token pages).
    S("gqa_cap_p16_fp32", prefix=(40, 9, 70), page=16, cap=5.0, scale=0.25, dtype="fp32", head_dim=64),
]

# Cap cases use cap 5 at scale 0.25 (scores of std ~2.8): the cap bites, so a dropped cap
# moves bf16 output past tolerance. At cap 30 and the default scale it never did (mutant 12).
# Three window cases, so that no single case stands between the kit and a window bug (mutant 7).
# One fp32 case per mode (a model served in fp32): its dot products must be IEEE fp32, not TF32.
FULL = in_every_layout([
    C("mha_bs1_long_p1", prefix=(1100,), heads=MHA),
    C("gqa_ragged_p16", prefix=(0, 15, 16, 17, 33, 64, 100, 257), page=16),
    C("gqa_fp32_ragged_p16", prefix=(0, 15, 16, 17, 33, 64, 100, 257), page=16, dtype="fp32"),
    C("mqa_ragged_p64_fp16", prefix=(63, 64, 65, 1, 200, 130, 7, 1500, 300), heads=MQA, page=64, dtype="fp16"),
    C("gqa32_long_p16", prefix=(1024, 2047, 1500, 3000), heads=GQA_32_8, page=16),
    C("gqa_d64_bs12_p1_fp16", prefix=(5, 90, 1, 300, 17, 64, 2, 129, 40, 8, 77, 250), head_dim=64, dtype="fp16"),
    C("gqa_window_p16", prefix=(100, 40, 31, 7, 300), page=16, window=32),
    C("gqa_cap_p1", prefix=(50, 700, 3), cap=5.0, scale=0.25),
    C("gqa_scale_p16_fp16", prefix=(64, 128, 9), page=16, scale=0.05, dtype="fp16"),
    C("mha_bs16_p16", prefix=tuple(range(3, 3 + 16 * 37, 37)), heads=MHA, page=16, head_dim=64),
    C("mha_window_long_p1", prefix=(1100, 600), heads=MHA, window=128),
    C("gqa_window_cap_p64_fp16", prefix=(70, 200, 5, 129), page=64, window=64, cap=5.0, scale=0.25, dtype="fp16"),
    C("gqa_hybrid_window_p16", prefix=(100, 40, 31, 300), page=16, window=32, hybrid=True),
])

# q, k and v as a model's fused QKV projection hands them (views of one row per token): a
# backend reading them with a dense stride reads other heads' and other tokens' values.
FULL += in_every_layout([
    C("gqa_fused_ragged_p16", prefix=(0, 15, 16, 17, 33, 64, 100, 257), page=16, inputs="fused_qkv"),
    C("mha_fused_p1_fp16", prefix=(300, 30), heads=MHA, dtype="fp16", inputs="fused_qkv"),
    C("mqa_fused_d64_p64", prefix=(63, 64, 65, 200), heads=MQA, head_dim=64, page=64, inputs="fused_qkv"),
])

# Attention sinks (gpt-oss): plain, with a window, over an fp8 cache, at gpt-oss's heads (64 / 8 of 64 on one
# GPU), and in gpt-oss's own model (window 128 on every other layer: hybrid, its full-attention layer with sinks
# of its own).
FULL += in_every_layout([
    C("gqa_sinks_p16", prefix=(100, 40, 31, 7, 300), page=16, sinks=True),
    C("mha_bs1_sinks_long_p1", prefix=(1100,), heads=MHA, sinks=True),
    C("mqa_window_sinks_p64_fp16", prefix=(63, 200, 5, 1500), heads=MQA, page=64, window=64, dtype="fp16", sinks=True),
    C("gptoss_sinks_p16", prefix=(90, 17, 640), page=16, heads=GPT_OSS, head_dim=64, sinks=True),
    C("gqa_fp8_e4m3_sinks_p16", prefix=(100, 33, 5), page=16, kv_dtype="fp8_e4m3", sinks=True),
    C("gptoss_window_sinks_hybrid_p16", prefix=(300, 129, 1000, 17), page=16, heads=GPT_OSS, head_dim=64, window=128,
      hybrid=True, sinks=True),
])

# MLA at DeepSeek-V3's shapes (rank 512 + rope 64; 128 heads on one GPU, 16 per rank on 8).
FULL += in_every_layout([
    C("mla_h16_long_p1", prefix=(4500, 1, 300), **deepseek(16)),
    C("mla_h128_p64", prefix=(1500, 63, 64, 700), page=64, **deepseek(128)),
    C("mla_h16_bs12_p16_fp16", prefix=(5, 90, 0, 300, 17, 64, 2, 129, 40, 8, 77, 250), page=16, dtype="fp16",
      **deepseek(16)),
    C("mla_h128_ragged_p16", prefix=(16, 33, 1, 1500), page=16, **deepseek(128)),
])

# fp8 KV caches (kit.engine.kv_quant): K and V stored quantized, with scales per layer, K's != V's.
SMOKE += [S("gqa_fp8_e4m3_p16_fp16", prefix=(0, 17, 33), page=16, dtype="fp16", head_dim=64, kv_dtype="fp8_e4m3")]
FULL += in_every_layout([
    C("gqa_fp8_e4m3_ragged_p16", prefix=(0, 15, 16, 17, 100, 257), page=16, kv_dtype="fp8_e4m3"),
    C("mha_fp8_e4m3_long_p1_fp16", prefix=(1100, 3), heads=MHA, dtype="fp16", kv_dtype="fp8_e4m3"),
    C("gqa_fp8_e4m3_bs12_p64", prefix=(5, 90, 1, 300, 17, 64, 2, 129, 40, 8, 77, 250), page=64, kv_dtype="fp8_e4m3"),
    C("mla_h16_fp8_e4m3_p16", prefix=(16, 33, 1, 700), page=16, kv_dtype="fp8_e4m3", **deepseek(16)),
])

# Pairs (kit.engine.pairs: every pair of feature values is some case's, tests/test_kit_catalog.py): a bug that
# needs two features (an e5m2 cache in DECODE, fp8 read through a window, fp8 with fused QKV inputs) is
# reached only by a case that has both. Dense cases, each reaching many pairs; the common features (fp8, window,
# cap, fused inputs) apart from the rarer ones (fp32, hybrid layers, sinks), so that a backend without those runs them.
FULL += [
    C("gqa_fp8_e5m2_window_cap_fused_p64_fp16", prefix=(70, 200, 5, 129), page=64, window=64, cap=5.0, scale=0.25,
      dtype="fp16", inputs="fused_qkv", kv_dtype="fp8_e5m2"),
    C("gqa_fp8_e4m3_window_fused_p16_shuf", prefix=(100, 40, 31, 7, 300), page=16, window=32, inputs="fused_qkv",
      kv_dtype="fp8_e4m3", layout="shuffled_pages"),
    C("gptoss_fp32_fp8_e5m2_window_cap_sinks_hybrid_fused_p1_inter", prefix=(300, 17, 129), heads=GPT_OSS,
      head_dim=64, window=128, cap=5.0, scale=0.25, dtype="fp32", sinks=True, hybrid=True, inputs="fused_qkv",
      kv_dtype="fp8_e5m2", layout="interleaved_pages"),
    C("mla_h16_fp32_fp8_e5m2_p64_nonmono", prefix=(1500, 63, 700), page=64, dtype="fp32", kv_dtype="fp8_e5m2",
      layout="non_monotonic_extend", **deepseek(16)),
    C("gqa_fp8_e5m2_cap_hybrid_p16_shuf", prefix=(100, 40, 31, 300), page=16, cap=5.0, scale=0.25, hybrid=True,
      kv_dtype="fp8_e5m2", layout="shuffled_pages"),
    C("mha_fp8_e4m3_cap_hybrid_p64_fp16", prefix=(1100, 63), heads=MHA, page=64, cap=5.0, scale=0.25, hybrid=True,
      dtype="fp16", kv_dtype="fp8_e4m3"),
    C("gqa_fp32_fp8_e4m3_p16", prefix=(0, 17, 33, 257), page=16, dtype="fp32", kv_dtype="fp8_e4m3"),
]
SMOKE += [
    S("gqa_fp8_e5m2_window_cap_sinks_hybrid_fused_p64_shuf", prefix=(70, 9), page=64, head_dim=64, window=8, cap=5.0,
      scale=0.25, sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e5m2", layout="shuffled_pages"),
    S("gqa_fp8_e4m3_window_cap_sinks_hybrid_fused_p1_inter_fp16", prefix=(40, 3), head_dim=64, window=8, cap=5.0,
      scale=0.25, dtype="fp16", sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e4m3",
      layout="interleaved_pages"),
    S("gqa_fp8_e5m2_window_cap_sinks_hybrid_fused_p16_nonmono_fp16", prefix=(17, 0, 33), page=16, head_dim=64,
      window=8, cap=5.0, scale=0.25, dtype="fp16", sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e5m2",
      layout="non_monotonic_extend"),
    S("gqa_fp32_fp8_e5m2_p1", prefix=(9, 200), head_dim=64, dtype="fp32", kv_dtype="fp8_e5m2"),
    S("gqa_p16_inter_fp16", prefix=(20, 33), page=16, head_dim=64, dtype="fp16", layout="interleaved_pages"),
    S("mla_r32_h16_fp8_e5m2_p1_inter", prefix=(0, 17, 33), kv_dtype="fp8_e5m2", layout="interleaved_pages",
      **SMALL_MLA),
    S("mla_r32_h16_fp8_e4m3_p64_nonmono", prefix=(70, 5), page=64, kv_dtype="fp8_e4m3", layout="non_monotonic_extend",
      **SMALL_MLA),
    S("mla_r32_h16_fp8_e4m3_p1_shuf_fp32", prefix=(17, 40), dtype="fp32", kv_dtype="fp8_e4m3", layout="shuffled_pages",
      **SMALL_MLA),
]

# Sparse MLA (DeepSeek-V3.2's DSA, kit/engine/kinds/sparse_mla.py): each query attends the keys its indexer
# selected (kit.engine.sparse draws them: page edges first, -1 padding after or among them, every key where a
# context is shorter than the top-k). Contexts below and above the top-k in each case.
SMOKE += [
    S("smla_r32_h16_ragged_p16_fp32", prefix=(0, 11, 40, 17, 100), page=16, dtype="fp32", **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e4m3_p1_shuf_fp16", prefix=(5, 30, 70), dtype="fp16", kv_dtype="fp8_e4m3",
      layout="shuffled_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e5m2_p64_inter", prefix=(70, 3), page=64, kv_dtype="fp8_e5m2",
      layout="interleaved_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_p16_nonmono_fp32", prefix=(33, 8, 64), page=16, dtype="fp32",
      layout="non_monotonic_extend", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e4m3_p64_fp32", prefix=(130, 0), page=64, dtype="fp32", kv_dtype="fp8_e4m3",
      index_scatter=True, **SMALL_SPARSE_MLA),
    # every query sees more keys than the top-k: each row a selection, page edges first, no -1
    S("smla_r32_h16_selects_p16_fp32", prefix=(20, 47), page=16, dtype="fp32", **SMALL_SPARSE_MLA),
]
# bf16 at 64-token pages (h128 _p64 lines): what the engines' sparse kernels take (vLLM's FLASHMLA_SPARSE).
FULL += in_every_layout([
    C("smla_h128_p64", prefix=(3000, 63, 2047, 2048, 5000), page=64, **deepseek_v32(128)),
    C("smla_h16_scatter_fp8_e4m3_p64_fp16", prefix=(4100, 64, 2500), page=64, dtype="fp16", kv_dtype="fp8_e4m3",
      index_scatter=True, **deepseek_v32(16)),
    C("smla_h16_scatter_fp8_e5m2_p1_fp32", prefix=(2100, 1, 3000), dtype="fp32", kv_dtype="fp8_e5m2",
      index_scatter=True, **deepseek_v32(16)),
    C("smla_h128_scatter_bs12_p16", prefix=(5, 90, 0, 3000, 17, 2049, 2, 129, 4000, 8, 77, 250), page=16,
      index_scatter=True, **deepseek_v32(128)),
    C("smla_h128_scatter_bs9_p64", prefix=(63, 64, 65, 1, 2100, 130, 7, 4000, 300), page=64, index_scatter=True,
      **deepseek_v32(128)),
    C("smla_h128_selects_p64", prefix=(2100, 4000), page=64, **deepseek_v32(128)),  # no query under the top-k
    # DeepSeek-V3.2's heads at tensor-parallel 8 (16 a rank), in the model's dtype: kernels padding the heads
    C("smla_h16_p64", prefix=(4100, 64, 2500, 1), page=64, **deepseek_v32(16)),
])
# A window starting on a page's last slot (kit.engine.features: window_page_edge), beside the layer features
# and layouts no other such case of the set has.
SMOKE += [
    S("gqa_window_page_edge_fp8_e5m2_p16_shuf_bf16", prefix=(23, 40), page=16, window=8, dtype="bf16",
      kv_dtype="fp8_e5m2", layout="shuffled_pages", head_dim=64),
    S("gqa_window_page_edge_p16_nonmono_fp32", prefix=(39, 10), page=16, window=8, dtype="fp32", head_dim=64,
      layout="non_monotonic_extend"),
]
FULL += [C("gqa_window_page_edge_fp8_e4m3_p16_fp16", prefix=(1055, 300), page=16, window=32, dtype="fp16",
           kv_dtype="fp8_e4m3")]
