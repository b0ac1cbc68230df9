"""TARGET_VERIFY cases: `prefix` = seq_lens (committed), `new` = draft_token_num,
topk 1 = chain, topk 2 = tree."""
from functools import partial

from cases.mla import SMALL_MLA, SMALL_SPARSE_MLA, deepseek, deepseek_v32
from kit.engine.case import GPT_OSS, GQA_32_8, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case, in_every_layout
from kit.modes import ForwardMode

C = partial(Case, mode=ForwardMode.TARGET_VERIFY)
S = partial(C, heads=SMOKE_GQA)  # a smoke line: the smoke heads (kit.engine.case) unless it names others

SMOKE = [
    S("gqa_chain4_p16_fp32", prefix=(17, 16, 1, 33), new=4, page=16, dtype="fp32", head_dim=64),
    S("mqa_tree6_p1_shuf", prefix=(5, 30, 12), new=6, topk=2, heads=SMOKE_MQA, dtype="fp32", head_dim=64,
      layout="shuffled_pages"),
    S("mha_bs1_chain4_window_p64_inter", prefix=(70,), new=4, heads=SMOKE_MHA, page=64, window=8, dtype="fp32",
      head_dim=64, layout="interleaved_pages"),
    S("gqa_bs8_tree4_cap_p1_nonmono", prefix=(3, 9, 1, 27, 12, 2, 33, 6), new=4, topk=2, cap=20.0,
      dtype="fp32", head_dim=64, layout="non_monotonic_extend"),
    S("gqa_bf16_chain3_p16", prefix=(20, 33), new=3, page=16, dtype="bf16"),
    S("gqa32_chain3_scale_fp16_p16_shuf", prefix=(9, 33), new=3, heads=GQA_32_8, page=16, scale=0.1,
      dtype="fp16", head_dim=64, layout="shuffled_pages"),
    S("mha_bs1_long_tree6_cap_p1", prefix=(1100,), new=6, topk=2, heads=SMOKE_MHA, cap=5.0, scale=0.25, dtype="fp32",
      head_dim=64),
    S("gqa_tree8_window4_p16_inter", prefix=(20, 9, 33), new=8, topk=2, page=16, window=4, dtype="fp32",
      head_dim=64, layout="interleaved_pages"),
    S("gqa_hybrid_tree4_p16_fp32", prefix=(12, 30), new=4, topk=2, page=16, dtype="fp32", head_dim=64, hybrid=True),
    S("gqa_chain2_fused_p16_fp32", prefix=(5, 17), new=2, page=16, dtype="fp32", head_dim=64, inputs="fused_qkv"),
    S("gqa_chain4_window_sinks_hybrid_p16_fp32", prefix=(12, 30), new=4, page=16, dtype="fp32", head_dim=64, window=8,
      hybrid=True, sinks=True),
    S("gptoss_tree4_sinks_p16_fp16", prefix=(20, 33), new=4, topk=2, page=16, heads=GPT_OSS, head_dim=64, dtype="fp16",
      sinks=True),
    S("mla_r32_h16_chain4_p16_fp32", prefix=(17, 1, 33), new=4, page=16, dtype="fp32", **SMALL_MLA),
    S("mla_deepseek_h128_bs1_tree4_p64_fp16", prefix=(70,), new=4, topk=2, page=64, dtype="fp16", **deepseek(128)),
    # An fp16 MLA verify chain (the CPU runs no bf16 Triton): vLLM's MLA verifies at DeepSeek's width only.
    S("mla_deepseek_h128_chain3_p64_fp16", prefix=(70, 9), new=3, page=64, dtype="fp16", **deepseek(128)),
]

# Cap cases use cap 5 at scale 0.25 (scores of std ~2.8): the cap bites, so a dropped cap
# moves bf16 output past tolerance. At cap 30 and the default scale it never did (mutant 12).
# Trees with a window: a draft sits at seq_len + its depth, not seq_len + its index, and
# only a window shows which one a backend used (mutant 13). Three cases of each bug's
# feature (cap, window, tree with window), so that no single case stands between the kit
# and a miss.
FULL = in_every_layout([
    C("mha_bs1_tree6_long_p1", prefix=(1100,), new=6, topk=2, heads=MHA),
    C("gqa_chain4_p16", prefix=(17, 64, 1, 33), new=4, page=16),
    C("gqa_fp32_chain4_p16", prefix=(17, 64, 1, 33), new=4, page=16, dtype="fp32"),
    C("gqa_tree8_p16", prefix=(17, 64, 1, 33, 250), new=8, topk=2, page=16),
    C("mqa_chain3_bs9_p64_fp16", prefix=(63, 64, 65, 1, 200, 130, 7, 1500, 300), new=3, heads=MQA, page=64,
      dtype="fp16"),
    C("gqa32_tree8_long_p16", prefix=(2048, 1023, 1500), new=8, topk=2, heads=GQA_32_8, page=16),
    C("gqa_d64_chain5_bs12_p1_fp16", prefix=(5, 90, 1, 300, 17, 64, 2, 129, 40, 8, 77, 250), new=5,
      head_dim=64, dtype="fp16"),
    C("gqa_window_chain4_p16", prefix=(100, 40, 31, 7), new=4, page=16, window=16),
    C("gqa_cap_tree6_p16", prefix=(50, 700, 3), new=6, topk=2, page=16, cap=5.0, scale=0.25),
    C("gqa_page_exact_chain4_p16", prefix=(16, 32, 48), new=4, page=16),
    C("gqa_tree8_window_p16", prefix=(17, 64, 1, 33, 250), new=8, topk=2, page=16, window=6),
    C("mha_bs1_tree6_window_long_p1", prefix=(1100,), new=6, topk=2, heads=MHA, window=100),
    C("gqa32_tree8_window_cap_p16", prefix=(300, 45, 1023), new=8, topk=4, heads=GQA_32_8, page=16, window=24,
      cap=5.0, scale=0.25),
    C("mqa_tree6_cap_p64_fp16", prefix=(63, 64, 200, 7), new=6, topk=3, heads=MQA, page=64, cap=5.0, scale=0.25,
      dtype="fp16"),
    C("gqa_hybrid_window_chain4_p16", prefix=(100, 40, 31), new=4, page=16, window=16, hybrid=True),
])

# q, k and v as a model's fused QKV projection hands them (views of one row per token): a
# backend reading them with a dense stride reads other heads' and other tokens' values.
FULL += in_every_layout([
    C("gqa_chain4_fused_p16", prefix=(17, 64, 1, 33), new=4, page=16, inputs="fused_qkv"),
    C("mha_tree6_fused_p1_fp16", prefix=(300, 30), new=6, topk=2, heads=MHA, dtype="fp16", inputs="fused_qkv"),
    C("mqa_chain3_fused_d64_p64", prefix=(63, 64, 200), new=3, heads=MQA, head_dim=64, page=64, inputs="fused_qkv"),
])

# Attention sinks (gpt-oss): plain, with a window, and gpt-oss's own shape (64 / 8 heads of 64 on one
# GPU, window 128 on every other layer: hybrid, its full-attention layer with sinks of its own).
FULL += in_every_layout([
    C("gqa_tree8_sinks_p16", prefix=(17, 64, 1, 33, 250), new=8, topk=2, page=16, sinks=True),
    C("mha_bs1_tree6_sinks_long_p1", prefix=(1100,), new=6, topk=2, heads=MHA, sinks=True),
    C("mqa_chain4_window_sinks_p64_fp16", prefix=(63, 200, 7, 1500), new=4, heads=MQA, page=64, window=16,
      dtype="fp16", sinks=True),
    C("gptoss_chain4_window_sinks_hybrid_p16", prefix=(300, 129, 1000), new=4, page=16, heads=GPT_OSS, head_dim=64,
      window=128, hybrid=True, sinks=True),
])

# MLA at DeepSeek-V3's shapes (rank 512 + rope 64; 128 heads on one GPU, 16 per rank on 8):
# chains, and trees for backends that take topk > 1.
FULL += in_every_layout([
    C("mla_h16_chain4_p16", prefix=(17, 64, 1, 33), new=4, page=16, **deepseek(16)),
    C("mla_h16_chain3_long_p64", prefix=(4097, 63, 700), new=3, page=64, **deepseek(16)),
    C("mla_h16_tree6_p1", prefix=(50, 300, 3), new=6, topk=2, **deepseek(16)),
    C("mla_h128_tree8_p16_fp16", prefix=(17, 250, 1023), new=8, topk=2, page=16, dtype="fp16", **deepseek(128)),
])

# fp8 KV caches (kit.engine.kv_quant): K and V stored quantized, with scales per layer, K's != V's.
SMOKE += [S("gqa_fp8_e4m3_chain3_p16_fp16", prefix=(9, 33), new=3, page=16, dtype="fp16", head_dim=64,
            kv_dtype="fp8_e4m3")]
FULL += in_every_layout([
    C("gqa_fp8_e4m3_chain4_p16", prefix=(17, 16, 1, 300), new=4, page=16, kv_dtype="fp8_e4m3"),
    C("mha_fp8_e4m3_long_tree6_p1_fp16", prefix=(1100, 40), new=6, topk=2, heads=MHA, dtype="fp16",
      kv_dtype="fp8_e4m3"),
    C("gqa_fp8_e4m3_bs9_chain3_p64", prefix=(63, 64, 65, 1, 200, 130, 7, 500, 300), new=3, page=64,
      kv_dtype="fp8_e4m3"),
    C("mla_h16_fp8_e4m3_chain4_p16", prefix=(17, 1, 700), new=4, page=16, kv_dtype="fp8_e4m3", **deepseek(16)),
])

# Pairs (kit.engine.pairs; cases/decode.py says why): dense cases, the common features apart from the rarer ones.
FULL += [
    C("gqa_fp8_e5m2_tree6_window_cap_fused_p64_fp16", prefix=(63, 64, 200, 7), new=6, topk=2, page=64, window=16,
      cap=5.0, scale=0.25, dtype="fp16", inputs="fused_qkv", kv_dtype="fp8_e5m2"),
    C("gqa_fp8_e4m3_chain4_window_fused_p16_shuf", prefix=(100, 40, 31, 7), new=4, page=16, window=16,
      inputs="fused_qkv", kv_dtype="fp8_e4m3", layout="shuffled_pages"),
    C("gptoss_fp32_fp8_e5m2_chain4_window_cap_sinks_hybrid_fused_p1_inter", prefix=(300, 129, 17), new=4,
      heads=GPT_OSS, head_dim=64, window=128, cap=5.0, scale=0.25, dtype="fp32", sinks=True, hybrid=True,
      inputs="fused_qkv", kv_dtype="fp8_e5m2", layout="interleaved_pages"),
    C("mla_h16_fp32_fp8_e5m2_chain3_p64_nonmono", prefix=(4097, 63, 700), new=3, page=64, dtype="fp32",
      kv_dtype="fp8_e5m2", layout="non_monotonic_extend", **deepseek(16)),
    C("gqa_fp8_e5m2_chain4_cap_hybrid_p16_shuf", prefix=(17, 64, 1, 33), new=4, page=16, cap=5.0, scale=0.25,
      hybrid=True, kv_dtype="fp8_e5m2", layout="shuffled_pages"),
    C("mha_fp8_e4m3_tree6_cap_hybrid_p64_fp16", prefix=(1100, 63), new=6, topk=2, heads=MHA, page=64, cap=5.0,
      scale=0.25, hybrid=True, dtype="fp16", kv_dtype="fp8_e4m3"),
    C("gqa_fp32_fp8_e4m3_tree4_sinks_p16", prefix=(17, 64, 1, 300), new=4, topk=2, page=16, dtype="fp32", sinks=True,
      kv_dtype="fp8_e4m3"),
]
SMOKE += [
    S("gqa_fp8_e5m2_chain4_window_cap_sinks_hybrid_fused_p64_shuf", prefix=(70, 9), new=4, page=64, head_dim=64,
      window=8, cap=5.0, scale=0.25, sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e5m2",
      layout="shuffled_pages"),
    S("gqa_fp8_e4m3_chain3_window_sinks_hybrid_fused_p1_nonmono_fp16", prefix=(12, 30), new=3, head_dim=64, window=8,
      dtype="fp16", sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e4m3", layout="non_monotonic_extend"),
    S("gqa_fp8_e4m3_chain3_cap_sinks_hybrid_fused_p1_inter_fp16", prefix=(20, 9), new=3, head_dim=64, cap=5.0,
      scale=0.25, dtype="fp16", sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e4m3",
      layout="interleaved_pages"),
    S("gqa_fp32_fp8_e5m2_chain4_cap_p16_nonmono", prefix=(17, 1), new=4, page=16, head_dim=64, cap=5.0, scale=0.25,
      dtype="fp32", kv_dtype="fp8_e5m2", layout="non_monotonic_extend"),
    S("gqa_fp8_e5m2_tree4_fused_p1_fp16", prefix=(9, 33), new=4, topk=2, head_dim=64, dtype="fp16",
      inputs="fused_qkv", kv_dtype="fp8_e5m2"),
    S("mla_r32_h16_fp8_e5m2_chain4_p1_inter", prefix=(17, 1, 33), new=4, kv_dtype="fp8_e5m2",
      layout="interleaved_pages", **SMALL_MLA),
    S("mla_r32_h16_fp8_e4m3_tree4_p64_nonmono", prefix=(70, 5), new=4, topk=2, page=64, kv_dtype="fp8_e4m3",
      layout="non_monotonic_extend", **SMALL_MLA),
    S("mla_r32_h16_fp8_e4m3_chain3_p1_shuf_fp32", prefix=(5, 30), new=3, dtype="fp32", kv_dtype="fp8_e4m3",
      layout="shuffled_pages", **SMALL_MLA),
]

# Sparse MLA (DeepSeek-V3.2's DSA, kit/engine/kinds/sparse_mla.py): chains of drafts (its MTP), each draft over
# the keys its indexer selected among the committed tokens and the drafts before it (kit.engine.sparse).
SMOKE += [
    S("smla_r32_h16_chain2_p16_fp32", prefix=(10, 40, 0), new=2, page=16, dtype="fp32", **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_chain4_fp8_e4m3_p1_shuf_fp16", prefix=(5, 30), new=4, dtype="fp16",
      kv_dtype="fp8_e4m3", layout="shuffled_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_chain3_fp8_e5m2_p64_inter", prefix=(70, 3), new=3, page=64, kv_dtype="fp8_e5m2",
      layout="interleaved_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_chain2_p16_nonmono_fp32", prefix=(33, 8), new=2, page=16, dtype="fp32",
      layout="non_monotonic_extend", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_chain4_fp8_e4m3_p64_fp32", prefix=(130, 9), new=4, page=64, dtype="fp32",
      kv_dtype="fp8_e4m3", index_scatter=True, **SMALL_SPARSE_MLA),
    # every query sees more keys than the top-k: each row a selection, page edges first, no -1
    S("smla_r32_h16_selects_chain3_p16_fp32", prefix=(20, 40), new=3, page=16, dtype="fp32", **SMALL_SPARSE_MLA),
]
# bf16 at 64-token pages (h128 _p64 lines): what the engines' sparse kernels take (vLLM's FLASHMLA_SPARSE).
FULL += in_every_layout([
    C("smla_h128_chain2_p64", prefix=(3000, 63, 2047, 5000), new=2, page=64, **deepseek_v32(128)),
    C("smla_h16_scatter_chain4_fp8_e4m3_p64_fp16", prefix=(4100, 64, 2500), new=4, page=64, dtype="fp16",
      kv_dtype="fp8_e4m3", index_scatter=True, **deepseek_v32(16)),
    C("smla_h16_scatter_chain2_fp8_e5m2_p1_fp32", prefix=(2100, 1), new=2, dtype="fp32", kv_dtype="fp8_e5m2",
      index_scatter=True, **deepseek_v32(16)),
    C("smla_h128_scatter_chain3_p16", prefix=(5, 2049, 129, 4000), new=3, page=16, index_scatter=True,
      **deepseek_v32(128)),
    C("smla_h128_scatter_chain4_p64", prefix=(2047, 64, 1, 4000), new=4, page=64, index_scatter=True,
      **deepseek_v32(128)),
    C("smla_h128_selects_chain3_p64", prefix=(2100, 4000), new=3, page=64, **deepseek_v32(128)),  # no query under k
])
# A window starting on a page's last slot (kit.engine.features: window_page_edge), beside the layer features
# and layouts no other such case of the set has.
SMOKE += [S("gqa_chain3_window_page_edge_p16_fp32", prefix=(23, 40), new=3, page=16, window=8, dtype="fp32",
            head_dim=64)]
FULL += [C("gqa_window_page_edge_chain4_p16_fp16", prefix=(100, 55), new=4, page=16, window=40, dtype="fp16")]
