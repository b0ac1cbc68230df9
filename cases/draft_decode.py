"""DRAFT_DECODE cases: `prefix` = each request's committed length (seq_lens), `new` = the server's
draft token count, `topk` = its lanes, `steps` = the draft's steps (None: new - 1, a chain's). Each
lane decodes steps - 1 tokens (kit/engine/modes/draft_decode.py); trees at page 1 only."""
from functools import partial

from cases.mla import SMALL_MLA, deepseek
from kit.engine.case import GPT_OSS, GQA_32_8, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case, in_every_layout
from kit.modes import ForwardMode

C = partial(Case, mode=ForwardMode.DRAFT_DECODE)
S = partial(C, heads=SMOKE_GQA)  # a smoke line: the smoke heads (kit.engine.case) unless it names others

# Trees whose draft count is not steps + 1 (SGLang's tree configs); a window shorter than the
# context plus the lanes (the window rail); a full bucket of long rows, K lanes each: a graph
# kv_indices row missing the topk factor is written past (sgl-project/sglang#27338, #27460), while
# its average row stays `steps` short of the model's context length (one short request); every
# committed length within `steps` of the model's context length in a full bucket (at the context
# edge: the model's context length is the run's longest committed sequence), so that buffers sized
# by the model's context length instead of the request pool's rows overflow (#29695: the steps'
# lanes lie past the context length, in each req_to_token row's headroom).
SMOKE = [
    S("gqa_chain3_p16_fp32", prefix=(1, 15, 16, 33), new=4, page=16, dtype="fp32", head_dim=64),
    S("mqa_tree4_draft8_p1_shuf", prefix=(5, 30, 12), new=8, topk=4, steps=3, heads=SMOKE_MQA, dtype="fp32", head_dim=64,
      layout="shuffled_pages"),
    S("mha_bs1_chain4_window_p64_inter", prefix=(70,), new=5, heads=SMOKE_MHA, page=64, window=2, dtype="fp32",
      head_dim=64, layout="interleaved_pages"),
    S("gqa_bs9_tree2_cap_p1_nonmono", prefix=(3, 9, 1, 27, 12, 40, 33, 6, 2), new=5, topk=2, steps=3, cap=20.0,
      dtype="fp32", head_dim=64, layout="non_monotonic_extend"),
    S("gqa_bf16_chain3_p16", prefix=(20, 33), new=4, page=16, dtype="bf16"),
    S("gqa32_tree3_window_scale_fp16_p1_shuf", prefix=(9, 33), new=4, topk=3, steps=2, heads=GQA_32_8, window=4,
      scale=0.1, dtype="fp16", head_dim=64, layout="shuffled_pages"),
    S("mha_bs1_long_cap_p1", prefix=(1100,), new=3, heads=SMOKE_MHA, cap=5.0, scale=0.25, dtype="fp32", head_dim=64),
    S("gqa_hybrid_tree2_p1_fp32", prefix=(12, 30), new=4, topk=2, steps=3, dtype="fp32", head_dim=64, hybrid=True),
    S("gqa_chain3_fused_p16_fp32", prefix=(5, 17), new=4, page=16, dtype="fp32", head_dim=64, inputs="fused_qkv"),
    S("gptoss_chain3_window_sinks_hybrid_p16_fp16", prefix=(12, 30), new=4, page=16, heads=GPT_OSS, head_dim=64,
      dtype="fp16", window=8, hybrid=True, sinks=True),
    S("mla_r32_h16_chain4_p16_fp32", prefix=(1, 17, 33), new=5, page=16, dtype="fp32", **SMALL_MLA),
    S("mla_deepseek_h128_bs1_chain3_p64_fp16", prefix=(5,), new=4, page=64, dtype="fp16", **deepseek(128)),
    S("gqa_fp8_e4m3_tree2_p1_fp16", prefix=(5, 30), new=4, topk=2, steps=3, dtype="fp16", head_dim=64,
      kv_dtype="fp8_e4m3"),
    S("gqa_tree4_full_bucket_p1_fp32", prefix=(30, 30, 30, 4), new=8, topk=4, steps=3, dtype="fp32", head_dim=64),
    S("gqa_context_edge_chain6_p1_fp32", prefix=(40, 40, 40), new=7, dtype="fp32", head_dim=64, context_edge=True),
]

# Cap cases use cap 5 at scale 0.25: the cap bites. Three window cases (mutant 7).
FULL = in_every_layout([
    C("mha_bs1_long_chain4_p1", prefix=(1100,), new=5, heads=MHA),
    C("gqa_chain3_p16", prefix=(1, 15, 16, 17, 33, 64, 100, 257), new=4, page=16),
    C("gqa_fp32_tree4_draft8_p1", prefix=(1, 17, 33, 64), new=8, topk=4, steps=3, dtype="fp32"),
    C("mqa_chain5_bs9_p64_fp16", prefix=(63, 64, 65, 1, 200, 130, 7, 1500, 300), new=6, heads=MQA, page=64,
      dtype="fp16"),
    C("gqa32_tree8_long_p1", prefix=(1024, 2047, 1500), new=16, topk=8, steps=4, heads=GQA_32_8),
    C("gqa_d64_bs12_tree2_p1_fp16", prefix=(5, 90, 1, 300, 17, 64, 2, 129, 40, 8, 77, 250), new=7, topk=2, steps=5,
      head_dim=64, dtype="fp16"),
    C("gqa_window_chain5_p16", prefix=(100, 40, 31, 7), new=6, page=16, window=8),
    C("gqa_cap_tree3_p1", prefix=(50, 700, 3), new=6, topk=3, steps=3, cap=5.0, scale=0.25),
    C("gqa_context_edge_chain6_bs8_p1", prefix=(300,) * 8, new=7, context_edge=True),
    C("gqa_tree4_full_bucket_p1", prefix=(500,) * 7 + (20,), new=9, topk=4, steps=4),
    C("mha_window_long_tree2_p1", prefix=(1100, 600), new=5, topk=2, steps=3, heads=MHA, window=128),
    C("gqa_window_cap_chain3_p64_fp16", prefix=(63, 64, 130, 7), new=4, page=64, window=4, cap=5.0, scale=0.25,
      dtype="fp16"),
    C("gqa_hybrid_window_tree2_p1", prefix=(100, 40, 31), new=5, topk=2, steps=3, window=8, hybrid=True),
])

# q, k and v as a model's fused QKV projection hands them (views of one row per token).
FULL += in_every_layout([
    C("gqa_chain4_fused_p16", prefix=(1, 17, 33, 64), new=5, page=16, inputs="fused_qkv"),
    C("mha_tree2_fused_p1_fp16", prefix=(300, 30), new=5, topk=2, steps=3, heads=MHA, dtype="fp16",
      inputs="fused_qkv"),
    C("mqa_chain3_fused_d64_p64", prefix=(63, 64, 200), new=4, heads=MQA, head_dim=64, page=64, inputs="fused_qkv"),
])

# Attention sinks (gpt-oss): plain, with a window, and gpt-oss's own model.
FULL += in_every_layout([
    C("gqa_tree2_sinks_p1", prefix=(1, 17, 33, 64), new=4, topk=2, steps=3, sinks=True),
    C("mqa_chain3_window_sinks_p64_fp16", prefix=(63, 200, 7, 1500), new=4, heads=MQA, page=64, window=8,
      dtype="fp16", sinks=True),
    C("gptoss_chain3_window_sinks_hybrid_p16", prefix=(300, 129, 1000), new=4, page=16, heads=GPT_OSS, head_dim=64,
      window=128, hybrid=True, sinks=True),
])

# MLA at DeepSeek-V3's shapes, chains (SGLang's MLA draft is topk 1: flashinfer_mla_backend.py:1197).
FULL += in_every_layout([
    C("mla_h128_chain4_p16", prefix=(1, 17, 33, 64), new=5, page=16, **deepseek(128)),
    C("mla_h16_chain3_long_p64", prefix=(4097, 63, 700), new=4, page=64, **deepseek(16)),
    C("mla_h16_chain5_bs9_p1_fp16", prefix=(63, 64, 65, 1, 200, 130, 7, 1500, 300), new=6, dtype="fp16",
      **deepseek(16)),
])

# fp8 KV caches (kit.engine.kv_quant): K and V stored quantized, with scales per layer, K's != V's.
FULL += in_every_layout([
    C("gqa_fp8_e4m3_tree2_p1", prefix=(1, 17, 33, 64), new=4, topk=2, steps=3, kv_dtype="fp8_e4m3"),
    C("mha_fp8_e4m3_long_chain3_p1_fp16", prefix=(1100, 5), new=4, heads=MHA, dtype="fp16", kv_dtype="fp8_e4m3"),
    C("gqa_fp8_e4m3_bs9_chain5_p64", prefix=(63, 64, 65, 1, 200, 130, 7, 500, 300), new=6, page=64,
      kv_dtype="fp8_e4m3"),
])

# Pairs (kit.engine.pairs; cases/decode.py says why): dense cases, the common features apart from the rarer ones.
FULL += [
    C("gqa_chain3_fp8_e5m2_window_cap_sinks_hybrid_fused_p16_fp32", prefix=(100, 300, 17), new=4, kv_dtype="fp8_e5m2",
      window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=16, dtype="fp32"),
    C("mla_h16_tree2_fp8_e5m2_p1_bf16_shuf", prefix=(100, 300, 17), new=5, topk=2, steps=3, kv_dtype="fp8_e5m2",
      dtype="bf16", layout="shuffled_pages", **deepseek(16)),
    C("gqa_chain3_fp8_e4m3_cap_sinks_hybrid_fused_p16_fp16", prefix=(100, 300, 17), new=4, kv_dtype="fp8_e4m3", cap=5.0,
      sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=16, dtype="fp16"),
    C("gqa_chain3_fp8_e5m2_hybrid_p64_fp16_inter", prefix=(100, 300, 17), new=4, kv_dtype="fp8_e5m2", hybrid=True,
      page=64, dtype="fp16", layout="interleaved_pages"),
    C("mla_h16_chain3_fp8_e4m3_p64_fp32", prefix=(100, 300, 17), new=4, kv_dtype="fp8_e4m3", page=64, dtype="fp32",
      **deepseek(16)),
    C("gqa_chain3_fp8_e4m3_window_p1_bf16", prefix=(100, 300, 17), new=4, kv_dtype="fp8_e4m3", window=8, dtype="bf16"),
    C("gqa_chain3_fp8_e5m2_p1_bf16_nonmono", prefix=(100, 300, 17), new=4, kv_dtype="fp8_e5m2", dtype="bf16",
      layout="non_monotonic_extend"),
]
SMOKE += [
    S("gqa_tree2_fp8_e5m2_window_cap_sinks_hybrid_fused_p1_bf16_inter", prefix=(12, 30), new=5, topk=2, steps=3,
      kv_dtype="fp8_e5m2", window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", dtype="bf16",
      layout="interleaved_pages", head_dim=64),
    S("gqa_chain3_fp8_e4m3_cap_sinks_hybrid_fused_p64_bf16_shuf", prefix=(12, 30), new=4, kv_dtype="fp8_e4m3", cap=5.0,
      sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=64, dtype="bf16", layout="shuffled_pages",
      head_dim=64),
    S("gqa_chain3_fp8_e5m2_sinks_fused_p16_fp16_nonmono", prefix=(12, 30), new=4, kv_dtype="fp8_e5m2", sinks=True,
      inputs="fused_qkv", page=16, dtype="fp16", layout="non_monotonic_extend", head_dim=64),
    S("gqa_chain3_fp8_e4m3_window_cap_sinks_hybrid_p16_fp32_nonmono", prefix=(12, 30), new=4, kv_dtype="fp8_e4m3",
      window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, page=16, dtype="fp32", layout="non_monotonic_extend",
      head_dim=64),
    S("mla_r32_h16_tree2_fp8_e5m2_p1_bf16_shuf", prefix=(12, 30), new=5, topk=2, steps=3, kv_dtype="fp8_e5m2",
      dtype="bf16", layout="shuffled_pages", **SMALL_MLA),
    S("mla_r32_h16_chain3_fp8_e4m3_p16_fp16_inter", prefix=(12, 30), new=4, kv_dtype="fp8_e4m3", page=16, dtype="fp16",
      layout="interleaved_pages", **SMALL_MLA),
    S("mla_r32_h16_chain3_fp8_e5m2_p64_bf16_nonmono", prefix=(12, 30), new=4, kv_dtype="fp8_e5m2", page=64,
      dtype="bf16", layout="non_monotonic_extend", **SMALL_MLA),
    S("gqa_chain3_cap_p16_fp16_shuf", prefix=(12, 30), new=4, cap=5.0, scale=0.25, page=16, dtype="fp16",
      layout="shuffled_pages", head_dim=64),
    S("gqa_chain3_fp8_e5m2_p1_fp32", prefix=(12, 30), new=4, kv_dtype="fp8_e5m2", dtype="fp32", head_dim=64),
]
# A window starting on a page's last slot (kit.engine.features: window_page_edge), beside the layer features
# and layouts no other such case of the set has.
SMOKE += [
    S("gqa_chain3_window_page_edge_fp8_e4m3_p16_nonmono_fp32", prefix=(23, 40), new=4, page=16, window=8, dtype="fp32",
      head_dim=64, kv_dtype="fp8_e4m3", layout="non_monotonic_extend"),
    S("gqa_chain3_window_page_edge_p16_fp32", prefix=(23, 40), new=4, page=16, window=8, dtype="fp32", head_dim=64),
]
FULL += [C("gqa_chain3_fp8_e5m2_window_page_edge_sinks_fused_p16_fp32", prefix=(103, 300, 17), new=4, page=16, window=8,
           dtype="fp32", kv_dtype="fp8_e5m2", inputs="fused_qkv", sinks=True)]
