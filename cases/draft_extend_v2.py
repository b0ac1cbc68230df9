"""DRAFT_EXTEND_V2 cases: `prefix` = tokens before the drafts, `new` = num_draft_tokens
(seq_lens = prefix + new, bumped)."""
from functools import partial

from cases.mla import SMALL_MLA, deepseek
from kit.engine.case import GPT_OSS, GQA_32_8, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case, in_every_layout
from kit.modes import ForwardMode

C = partial(Case, mode=ForwardMode.DRAFT_EXTEND_V2)
S = partial(C, heads=SMOKE_GQA)  # a smoke line: the smoke heads (kit.engine.case) unless it names others

SMOKE = [
    S("gqa_draft4_p16_fp32", prefix=(0, 17, 16, 33), new=4, page=16, dtype="fp32", head_dim=64),
    S("mqa_draft3_p1_shuf", prefix=(5, 30, 12), new=3, heads=SMOKE_MQA, dtype="fp32", head_dim=64,
      layout="shuffled_pages"),
    S("mha_bs1_window_p64_inter", prefix=(70,), new=4, heads=SMOKE_MHA, page=64, window=2, dtype="fp32", head_dim=64,
      layout="interleaved_pages"),
    S("gqa_bs8_cap_p1_nonmono", prefix=(3, 9, 1, 27, 12, 0, 33, 6), new=3, cap=20.0, dtype="fp32",
      head_dim=64, layout="non_monotonic_extend"),
    S("gqa_bf16_p16", prefix=(20, 33), new=3, page=16, dtype="bf16"),
    S("gqa32_scale_fp16_p16_shuf", prefix=(9, 33), new=3, heads=GQA_32_8, page=16, scale=0.1, dtype="fp16",
      head_dim=64, layout="shuffled_pages"),
    S("mha_bs1_long_cap_p1", prefix=(1100,), new=3, heads=SMOKE_MHA, cap=5.0, scale=0.25, dtype="fp32", head_dim=64),
    S("gqa_hybrid_draft3_p16_fp32", prefix=(12, 30), new=3, page=16, dtype="fp32", head_dim=64, hybrid=True),
    S("gqa_draft2_fused_p16_fp32", prefix=(5, 17), new=2, page=16, dtype="fp32", head_dim=64, inputs="fused_qkv"),
    S("gptoss_draft3_window_sinks_hybrid_p16_fp16", prefix=(12, 30), new=3, page=16, heads=GPT_OSS, head_dim=64,
      dtype="fp16", window=8, hybrid=True, sinks=True),
    S("mla_r32_h16_draft4_p16_fp32", prefix=(0, 17, 33), new=4, page=16, dtype="fp32", **SMALL_MLA),
    S("mla_deepseek_h128_bs1_draft3_p64_fp16", prefix=(5,), new=3, page=64, dtype="fp16", **deepseek(128)),
    # A tree's drafts (topk 2, steps 3, 6 drafts): the draft count is not steps + 1 (sgl-project/sglang#27545).
    S("gqa_tree2_draft6_steps3_p1_fp32", prefix=(5, 30, 12), new=6, topk=2, steps=3, dtype="fp32", head_dim=64),
]

# Cap cases use cap 5 at scale 0.25 (scores of std ~2.8): the cap bites, so a dropped cap
# moves bf16 output past tolerance. At cap 30 and the default scale it never did (mutant 12).
# Window cases reach into the prefix: positions off by the draft count (seq_lens counted
# twice, mutant 14) move every window. Three of them, so that no single case stands
# between the kit and a window bug (mutant 7).
FULL = in_every_layout([
    C("mha_bs1_long_p1", prefix=(1100,), new=3, heads=MHA),
    C("gqa_draft4_p16", prefix=(0, 17, 33, 64), new=4, page=16),
    C("gqa_fp32_draft4_p16", prefix=(0, 17, 33, 64), new=4, page=16, dtype="fp32"),
    C("mqa_draft3_bs9_p64_fp16", prefix=(63, 64, 65, 1, 200, 130, 7, 1500, 300), new=3, heads=MQA, page=64,
      dtype="fp16"),
    C("gqa32_long_p16", prefix=(2048, 1023, 1500), new=8, heads=GQA_32_8, page=16),
    C("gqa_d64_bs12_p1_fp16", prefix=(5, 90, 1, 300, 17, 64, 2, 129, 40, 8, 77, 250), new=5, head_dim=64,
      dtype="fp16"),
    C("gqa_window_p16", prefix=(100, 40, 31, 7), new=6, page=16, window=8),
    C("gqa_cap_p1", prefix=(50, 700, 3), new=4, cap=5.0, scale=0.25),
    C("gqa_page_cross_p16", prefix=(14, 15, 30), new=4, page=16),
    C("mha_window_long_p1", prefix=(1100,), new=3, heads=MHA, window=64),
    C("gqa_window_cap_p64_fp16", prefix=(63, 64, 130, 7), new=5, page=64, window=4, cap=5.0, scale=0.25,
      dtype="fp16"),
    C("gqa_hybrid_window_p16", prefix=(100, 40, 31), new=4, page=16, window=8, hybrid=True),
    C("gqa_tree4_draft8_steps3_p1", prefix=(0, 17, 33, 64), new=8, topk=4, steps=3),
])

# q, k and v as a model's fused QKV projection hands them (views of one row per token): a
# backend reading them with a dense stride reads other heads' and other tokens' values.
FULL += in_every_layout([
    C("gqa_draft4_fused_p16", prefix=(0, 17, 33, 64), new=4, page=16, inputs="fused_qkv"),
    C("mha_draft3_fused_p1_fp16", prefix=(300, 30), new=3, heads=MHA, dtype="fp16", inputs="fused_qkv"),
    C("mqa_draft5_fused_d64_p64", prefix=(63, 64, 200), new=5, heads=MQA, head_dim=64, page=64, inputs="fused_qkv"),
])

# Attention sinks (gpt-oss): plain, with a window, and gpt-oss's own shape (64 / 8 heads of 64 on one
# GPU, window 128 on every other layer: hybrid, its full-attention layer with sinks of its own).
FULL += in_every_layout([
    C("gqa_draft4_sinks_p16", prefix=(0, 17, 33, 64), new=4, page=16, sinks=True),
    C("mha_bs1_sinks_long_p1", prefix=(1100,), new=3, heads=MHA, sinks=True),
    C("mqa_draft3_window_sinks_p64_fp16", prefix=(63, 200, 7, 1500), new=3, heads=MQA, page=64, window=8,
      dtype="fp16", sinks=True),
    C("gptoss_draft3_window_sinks_hybrid_p16", prefix=(300, 129, 1000), new=3, page=16, heads=GPT_OSS, head_dim=64,
      window=128, hybrid=True, sinks=True),
])

# MLA at DeepSeek-V3's shapes (rank 512 + rope 64; 128 heads on one GPU, 16 per rank on 8).
FULL += in_every_layout([
    C("mla_h128_draft4_p16", prefix=(0, 17, 33, 64), new=4, page=16, **deepseek(128)),
    C("mla_h16_draft3_long_p64", prefix=(4097, 63, 700), new=3, page=64, **deepseek(16)),
    C("mla_h16_draft5_bs9_p1_fp16", prefix=(63, 64, 65, 1, 200, 130, 7, 1500, 300), new=5, dtype="fp16",
      **deepseek(16)),
])

# fp8 KV caches (kit.engine.kv_quant): K and V stored quantized, with scales per layer, K's != V's.
SMOKE += [S("gqa_fp8_e5m2_draft3_p16_fp16", prefix=(5, 30), new=3, page=16, dtype="fp16", head_dim=64,
            kv_dtype="fp8_e5m2")]
FULL += in_every_layout([
    C("gqa_fp8_e5m2_draft4_p16", prefix=(0, 17, 33, 64), new=4, page=16, kv_dtype="fp8_e5m2"),
    C("mha_fp8_e5m2_long_p1_fp16", prefix=(1100, 5), new=3, heads=MHA, dtype="fp16", kv_dtype="fp8_e5m2"),
    C("gqa_fp8_e5m2_bs9_draft5_p64", prefix=(63, 64, 65, 1, 200, 130, 7, 500, 300), new=5, page=64,
      kv_dtype="fp8_e5m2"),
])

# Pairs (kit.engine.pairs; cases/decode.py says why): dense cases, the common features apart from the rarer ones.
FULL += [
    C("gqa_fp8_e4m3_draft4_window_cap_fused_p64_fp16", prefix=(63, 64, 130, 7), new=4, page=64, window=8, cap=5.0,
      scale=0.25, dtype="fp16", inputs="fused_qkv", kv_dtype="fp8_e4m3"),
    C("gqa_fp8_e5m2_draft3_window_fused_p16_shuf", prefix=(100, 40, 31, 7), new=3, page=16, window=8,
      inputs="fused_qkv", kv_dtype="fp8_e5m2", layout="shuffled_pages"),
    C("gptoss_fp32_fp8_e4m3_draft3_window_cap_sinks_hybrid_fused_p1_inter", prefix=(300, 129, 17), new=3,
      heads=GPT_OSS, head_dim=64, window=128, cap=5.0, scale=0.25, dtype="fp32", sinks=True, hybrid=True,
      inputs="fused_qkv", kv_dtype="fp8_e4m3", layout="interleaved_pages"),
    C("mla_h16_fp32_fp8_e4m3_draft3_p64_nonmono", prefix=(4097, 63, 700), new=3, page=64, dtype="fp32",
      kv_dtype="fp8_e4m3", layout="non_monotonic_extend", **deepseek(16)),
    C("gqa_fp8_e4m3_draft4_cap_hybrid_p16_shuf", prefix=(0, 17, 33, 64), new=4, page=16, cap=5.0, scale=0.25,
      hybrid=True, kv_dtype="fp8_e4m3", layout="shuffled_pages"),
    C("mha_fp8_e5m2_draft3_cap_sinks_hybrid_p64_fp16", prefix=(1100, 63), new=3, heads=MHA, page=64, cap=5.0,
      scale=0.25, sinks=True, hybrid=True, dtype="fp16", kv_dtype="fp8_e5m2"),
    C("mla_h128_fp8_e5m2_draft4_p16_fp16", prefix=(0, 17, 33, 64), new=4, page=16, dtype="fp16", kv_dtype="fp8_e5m2",
      **deepseek(128)),
    C("gqa_fp32_fp8_e5m2_draft3_p1", prefix=(50, 700, 3), new=3, dtype="fp32", kv_dtype="fp8_e5m2"),
]
SMOKE += [
    S("gqa_fp8_e4m3_draft3_window_cap_sinks_hybrid_fused_p64_shuf", prefix=(70, 9), new=3, page=64, head_dim=64,
      window=8, cap=5.0, scale=0.25, sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e4m3",
      layout="shuffled_pages"),
    S("gqa_fp8_e5m2_draft3_cap_sinks_hybrid_fused_p1_inter_fp16", prefix=(20, 9), new=3, head_dim=64, cap=5.0,
      scale=0.25, dtype="fp16", sinks=True, hybrid=True, inputs="fused_qkv", kv_dtype="fp8_e5m2",
      layout="interleaved_pages"),
    S("gqa_fp32_fp8_e5m2_draft2_window_cap_sinks_fused_p16_nonmono", prefix=(17, 1), new=2, page=16, head_dim=64,
      window=2, cap=5.0, scale=0.25, dtype="fp32", sinks=True, inputs="fused_qkv", kv_dtype="fp8_e5m2",
      layout="non_monotonic_extend"),
    S("gqa_fp8_e4m3_draft3_hybrid_p64_nonmono_fp16", prefix=(70, 5), new=3, page=64, head_dim=64, hybrid=True,
      dtype="fp16", kv_dtype="fp8_e4m3", layout="non_monotonic_extend"),
    S("gqa_fp32_fp8_e4m3_draft3_window_p1", prefix=(9, 30), new=3, head_dim=64, window=2, dtype="fp32",
      kv_dtype="fp8_e4m3"),
    S("mla_r32_h16_draft3_p1_nonmono", prefix=(5, 30), new=3, layout="non_monotonic_extend", **SMALL_MLA),
    S("mla_r32_h16_fp8_e4m3_draft4_p16_inter", prefix=(0, 17, 33), new=4, page=16, kv_dtype="fp8_e4m3",
      layout="interleaved_pages", **SMALL_MLA),
    S("mla_r32_h16_fp8_e5m2_draft3_p64_shuf", prefix=(70, 5), new=3, page=64, kv_dtype="fp8_e5m2",
      layout="shuffled_pages", **SMALL_MLA),
]

# Pairs of a tree (its drafts, topk > 1) with the other features (kit.engine.pairs).
FULL += [
    C("gqa_tree2_draft6_fp8_e4m3_window_cap_sinks_hybrid_fused_p16_fp16", prefix=(100, 300, 17), new=6, topk=2, steps=3,
      kv_dtype="fp8_e4m3", window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=16,
      dtype="fp16"),
    C("mla_h16_tree2_draft6_fp8_e5m2_p64_fp32", prefix=(100, 300, 17), new=6, topk=2, steps=3, kv_dtype="fp8_e5m2",
      page=64, dtype="fp32", **deepseek(16)),
]
SMOKE += [
    S("gqa_tree2_draft6_fp8_e4m3_window_cap_sinks_hybrid_fused_p16_bf16_shuf", prefix=(12, 30), new=6, topk=2, steps=3,
      kv_dtype="fp8_e4m3", window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=16,
      dtype="bf16", layout="shuffled_pages", head_dim=64),
    S("mla_r32_h16_tree2_draft6_fp8_e5m2_p64_fp16_inter", prefix=(12, 30), new=6, topk=2, steps=3, kv_dtype="fp8_e5m2",
      page=64, dtype="fp16", layout="interleaved_pages", **SMALL_MLA),
    S("gqa_tree2_draft6_p1_bf16_nonmono", prefix=(12, 30), new=6, topk=2, steps=3, dtype="bf16",
      layout="non_monotonic_extend", head_dim=64),
]
# A window starting on a page's last slot (kit.engine.features: window_page_edge), beside the layer features
# and layouts no other such case of the set has.
SMOKE += [S("gqa_tree2_draft6_window_page_edge_p16_inter_fp16", prefix=(23, 40), new=6, topk=2, steps=3, page=16,
            window=8, dtype="fp16", head_dim=64, layout="interleaved_pages")]
FULL += [C("gqa_fp8_e5m2_draft3_window_page_edge_p16", prefix=(103, 40, 31), new=3, page=16, window=8,
           kv_dtype="fp8_e5m2")]
