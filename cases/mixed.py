"""MIXED cases: extend rows then decode rows in one batch; `prefix` = extend_prefix_lens, `new` =
extend_seq_lens, the decode rows (the trailing rows of one token, after the first row) last, each
with its whole context cached (prefix = seq_len - 1)."""
from functools import partial

from cases.mla import SMALL_MLA, SMALL_SPARSE_MLA, deepseek, deepseek_v32
from kit.engine.case import GPT_OSS, GQA_32_8, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case, in_every_layout
from kit.modes import ForwardMode

C = partial(Case, mode=ForwardMode.MIXED)
S = partial(C, heads=SMOKE_GQA)  # a smoke line: the smoke heads (kit.engine.case) unless it names others

# A fresh prompt (prefix 0: a paged pass over nothing, the ragged one alone) beside long decode rows;
# decode rows whose prefixes are unaligned to the page while the chunk's is page-aligned (SGLang PR
# 38180: a backend assuming every extend prefix page-aligned); a chunk crossing the window while the
# decode rows sit far past it; every row of one token (an extend of one, then decode rows).
SMOKE = [
    S("gqa_fresh_prompt_p16_fp32", prefix=(0, 40, 17), new=(20, 1, 1), page=16, dtype="fp32", head_dim=64),
    S("mqa_chunk_p1_shuf", prefix=(12, 30, 5), new=(7, 1, 1), heads=SMOKE_MQA, dtype="fp32", head_dim=64,
      layout="shuffled_pages"),
    S("mha_window_p64_inter", prefix=(64, 150), new=(20, 1), heads=SMOKE_MHA, page=64, window=8, dtype="fp32",
      head_dim=64, layout="interleaved_pages"),
    S("gqa_bs9_cap_p1_nonmono", prefix=(3, 9, 1, 27, 12, 40, 33, 6, 2), new=(5, 1, 3, 1, 1, 1, 1, 1, 1), cap=20.0,
      dtype="fp32", head_dim=64, layout="non_monotonic_extend"),
    S("gqa_bf16_p16", prefix=(32, 33), new=(9, 1), page=16, dtype="bf16"),
    S("gqa32_scale_fp16_p16_shuf", prefix=(16, 5, 18), new=(9, 1, 1), heads=GQA_32_8, page=16, scale=0.1,
      dtype="fp16", head_dim=64, layout="shuffled_pages"),
    S("mha_long_decode_cap_p1", prefix=(30, 1100), new=(70, 1), heads=SMOKE_MHA, cap=5.0, scale=0.25, dtype="fp32",
      head_dim=64),
    S("gqa_hybrid_p16_fp32", prefix=(12, 30, 17), new=(6, 1, 1), page=16, dtype="fp32", head_dim=64, hybrid=True),
    S("gqa_fused_p16_fp32", prefix=(0, 17), new=(3, 1), page=16, dtype="fp32", head_dim=64, inputs="fused_qkv"),
    S("gptoss_window_sinks_hybrid_p16_fp32", prefix=(0, 30), new=(9, 1), page=16, heads=GPT_OSS, head_dim=64,
      dtype="fp32", window=8, hybrid=True, sinks=True),
    S("gqa_all_ones_bs9_p16_fp32", prefix=(0, 1, 15, 16, 17, 31, 32, 100, 64), new=(1,) * 9, page=16, dtype="fp32",
      head_dim=64),
    S("mla_r32_h16_p16_fp32", prefix=(0, 17, 33), new=(5, 1, 1), page=16, dtype="fp32", **SMALL_MLA),
    S("mla_deepseek_h128_p64_fp16", prefix=(5, 9), new=(3, 1), page=64, dtype="fp16", **deepseek(128)),
    S("gqa_fp8_e5m2_p16_fp16", prefix=(17, 33), new=(5, 1), page=16, dtype="fp16", head_dim=64, kv_dtype="fp8_e5m2"),
    # Decode rows verifying two drafts (3 tokens) beside a fresh prompt and a chunk: vLLM's speculative decoding
    # with chunked prefill (an engine that verifies in steps of their own reads it unsupported).
    S("gqa_spec2_beside_prefill_p16_fp32", prefix=(0, 40, 17, 9), new=(20, 5, 3, 3), steps=2, page=16, dtype="fp32",
      head_dim=64),
    S("mla_deepseek_h128_spec1_beside_prefill_p64_fp16", prefix=(5, 9, 12), new=(3, 2, 2), steps=1, page=64,
      dtype="fp16", **deepseek(128)),
]

# Cap cases use cap 5 at scale 0.25: the cap bites. Three window cases (mutant 7), fresh prompts
# beside long decode rows, decode prefixes off the page (16 and 64) beside page-aligned chunks.
FULL = in_every_layout([
    C("mha_long_decode_p1", prefix=(0, 1100), new=(100, 1), heads=MHA),
    C("gqa_fresh_prompt_p16", prefix=(0, 17, 33, 100), new=(64, 1, 1, 1), page=16),
    C("gqa_fp32_chunk_p16", prefix=(32, 17, 33, 64), new=(16, 1, 1, 1), page=16, dtype="fp32"),
    C("mqa_unaligned_decode_p64_fp16", prefix=(64, 0, 63, 65, 130, 1, 500), new=(64, 65, 1, 1, 1, 1, 1), heads=MQA,
      page=64, dtype="fp16"),
    C("gqa32_long_p16", prefix=(1024, 0, 2000, 3001), new=(256, 1024, 1, 1), heads=GQA_32_8, page=16),
    C("gqa_d64_bs9_p1_fp16", prefix=(5, 90, 1, 300, 17, 64, 2, 129, 40), new=(3, 40, 1, 1, 1, 1, 1, 1, 1),
      head_dim=64, dtype="fp16"),
    C("gqa_window_p16", prefix=(100, 0, 300, 41), new=(80, 200, 1, 1), page=16, window=64),
    C("gqa_window_off_page_edge_p16", prefix=(100, 40), new=(3, 1), page=16, window=20),
    C("gqa_cap_p1", prefix=(50, 0, 700), new=(30, 60, 1), cap=5.0, scale=0.25),
    C("gqa_all_ones_bs9_p16", prefix=(0, 1, 15, 16, 17, 31, 32, 100, 64), new=(1,) * 9, page=16),
    C("mha_window_long_p1", prefix=(0, 1000, 1300), new=(300, 1, 1), heads=MHA, window=256),
    C("gqa_window_cap_p64_fp16", prefix=(64, 0, 130, 70), new=(40, 100, 1, 1), page=64, window=16, cap=5.0,
      scale=0.25, dtype="fp16"),
    C("gqa_hybrid_window_p16", prefix=(96, 0, 37), new=(40, 60, 1), page=16, window=32, hybrid=True),
    # A one-token extend row before longer ones (a split that takes rows of more than one token for the extend rows).
    C("gqa_one_token_extend_first_p16", prefix=(40, 17, 0, 100, 33), new=(1, 30, 64, 1, 1), page=16),
])

# q, k and v as a model's fused QKV projection hands them (views of one row per token).
FULL += in_every_layout([
    C("gqa_fused_p16", prefix=(0, 17, 33, 64), new=(5, 16, 1, 1), page=16, inputs="fused_qkv"),
    C("mha_fused_p1_fp16", prefix=(0, 300), new=(100, 1), heads=MHA, dtype="fp16", inputs="fused_qkv"),
    C("mqa_fused_d64_p64", prefix=(64, 130, 7), new=(64, 1, 1), heads=MQA, head_dim=64, page=64, inputs="fused_qkv"),
])

# Attention sinks (gpt-oss): plain, with a window, and gpt-oss's own model.
FULL += in_every_layout([
    C("gqa_sinks_p16", prefix=(0, 100, 37), new=(60, 1, 1), page=16, sinks=True),
    C("mqa_window_sinks_p64_fp16", prefix=(64, 0, 130), new=(40, 100, 1), heads=MQA, page=64, window=16,
      dtype="fp16", sinks=True),
    C("gptoss_window_sinks_hybrid_p16", prefix=(0, 300, 1000), new=(200, 1, 1), page=16, heads=GPT_OSS, head_dim=64,
      window=128, hybrid=True, sinks=True),
])

# MLA at DeepSeek-V3's shapes (rank 512 + rope 64; 128 heads on one GPU, 16 per rank on 8).
FULL += in_every_layout([
    C("mla_h16_p1", prefix=(0, 17, 300), new=(64, 1, 1), **deepseek(16)),
    C("mla_h16_long_p64", prefix=(64, 0, 4200), new=(30, 20, 1), page=64, **deepseek(16)),
    C("mla_h128_p16_fp16", prefix=(0, 16, 33, 64, 5), new=(17, 33, 1, 1, 1), page=16, dtype="fp16", **deepseek(128)),
])

# fp8 KV caches (kit.engine.kv_quant): K and V stored quantized, with scales per layer, K's != V's.
FULL += in_every_layout([
    C("gqa_fp8_e5m2_p16", prefix=(0, 17, 33, 64), new=(16, 5, 1, 1), page=16, kv_dtype="fp8_e5m2"),
    C("mha_fp8_e5m2_long_p1_fp16", prefix=(30, 1100), new=(100, 1), heads=MHA, dtype="fp16", kv_dtype="fp8_e5m2"),
    C("gqa_fp8_e5m2_bs6_p64", prefix=(0, 64, 63, 130, 1, 500), new=(64, 65, 1, 1, 1, 1), page=64,
      kv_dtype="fp8_e5m2"),
])

# Pairs (kit.engine.pairs; cases/decode.py says why): dense cases, the common features apart from the rarer ones.
FULL += [
    C("gqa_fp8_e4m3_window_cap_sinks_hybrid_fused_p1_fp32", prefix=(0, 33, 300), new=(40, 7, 1), kv_dtype="fp8_e4m3",
      window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", dtype="fp32"),
    C("gqa_fp8_e4m3_hybrid_p64_fp16_shuf", prefix=(0, 100, 300), new=(40, 60, 1), kv_dtype="fp8_e4m3", hybrid=True,
      page=64, dtype="fp16", layout="shuffled_pages"),
    C("gqa_fp8_e5m2_window_cap_sinks_hybrid_fused_p16_fp32", prefix=(0, 100, 300), new=(40, 60, 1), kv_dtype="fp8_e5m2",
      window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=16, dtype="fp32"),
    C("mla_h16_fp8_e4m3_p16_bf16_inter", prefix=(0, 100, 300), new=(40, 60, 1), kv_dtype="fp8_e4m3", page=16,
      dtype="bf16", layout="interleaved_pages", **deepseek(16)),
    C("mla_h16_fp8_e4m3_p64_fp32_nonmono", prefix=(0, 100, 300), new=(40, 60, 1), kv_dtype="fp8_e4m3", page=64,
      dtype="fp32", layout="non_monotonic_extend", **deepseek(16)),
    C("mla_h16_fp8_e5m2_p1_bf16", prefix=(0, 33, 300), new=(40, 7, 1), kv_dtype="fp8_e5m2", dtype="bf16",
      **deepseek(16)),
]
SMOKE += [
    S("gqa_fp8_e4m3_window_cap_sinks_hybrid_fused_p64_bf16_shuf", prefix=(0, 70), new=(20, 1), kv_dtype="fp8_e4m3",
      window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", page=64, dtype="bf16",
      layout="shuffled_pages", head_dim=64),
    S("gqa_fp8_e5m2_window_cap_sinks_hybrid_fused_p1_fp16_inter", prefix=(17, 40), new=(9, 1), kv_dtype="fp8_e5m2",
      window=8, cap=5.0, sinks=True, hybrid=True, scale=0.25, inputs="fused_qkv", dtype="fp16",
      layout="interleaved_pages", head_dim=64),
    S("mla_r32_h16_fp8_e4m3_p1_bf16_inter", prefix=(17, 40), new=(9, 1), kv_dtype="fp8_e4m3", dtype="bf16",
      layout="interleaved_pages", **SMALL_MLA),
    S("gqa_fp8_e5m2_sinks_fused_p64_bf16_nonmono", prefix=(0, 70), new=(20, 1), kv_dtype="fp8_e5m2", sinks=True,
      inputs="fused_qkv", page=64, dtype="bf16", layout="non_monotonic_extend", head_dim=64),
    S("gqa_fp8_e4m3_window_cap_hybrid_p16_fp16_nonmono", prefix=(17, 40), new=(9, 1), kv_dtype="fp8_e4m3", window=8,
      cap=5.0, hybrid=True, scale=0.25, page=16, dtype="fp16", layout="non_monotonic_extend", head_dim=64),
    S("mla_r32_h16_fp8_e5m2_p1_fp32_shuf", prefix=(17, 40), new=(9, 1), kv_dtype="fp8_e5m2", dtype="fp32",
      layout="shuffled_pages", **SMALL_MLA),
    S("gqa_fp8_e4m3_p1_fp32", prefix=(17, 40), new=(9, 1), kv_dtype="fp8_e4m3", dtype="fp32", head_dim=64),
    S("gqa_p16_bf16_inter", prefix=(17, 40), new=(9, 1), page=16, dtype="bf16", layout="interleaved_pages",
      head_dim=64),
    S("mla_r32_h16_p1_bf16_nonmono", prefix=(17, 40), new=(9, 1), dtype="bf16", layout="non_monotonic_extend",
      **SMALL_MLA),
]

# Sparse MLA (DeepSeek-V3.2's DSA, kit/engine/kinds/sparse_mla.py): prefill chunks beside decode rows, each
# query over its indexer's selection (kit.engine.sparse).
SMOKE += [
    S("smla_r32_h16_p16_fp32", prefix=(0, 17, 33), new=(5, 1, 1), page=16, dtype="fp32", **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e4m3_p1_shuf_fp16", prefix=(5, 30), new=(9, 1), dtype="fp16", kv_dtype="fp8_e4m3",
      layout="shuffled_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e5m2_p64_inter", prefix=(3, 70), new=(7, 1), page=64, kv_dtype="fp8_e5m2",
      layout="interleaved_pages", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_p16_nonmono_fp32", prefix=(8, 33, 2), new=(17, 1, 1), page=16, dtype="fp32",
      layout="non_monotonic_extend", index_scatter=True, **SMALL_SPARSE_MLA),
    S("smla_r32_h16_scatter_fp8_e4m3_p64_fp32", prefix=(0, 64), new=(20, 1), page=64, dtype="fp32",
      kv_dtype="fp8_e4m3", index_scatter=True, **SMALL_SPARSE_MLA),
    # every query sees more keys than the top-k: each row a selection, page edges first, no -1
    S("smla_r32_h16_selects_p16_fp32", prefix=(20, 33), new=(4, 1), page=16, dtype="fp32", **SMALL_SPARSE_MLA),
]
# bf16 at 64-token pages (h128 _p64 lines): what the engines' sparse kernels take (vLLM's FLASHMLA_SPARSE).
FULL += in_every_layout([
    C("smla_h128_p64", prefix=(0, 3000, 63, 2048), new=(2100, 20, 1, 1), page=64, **deepseek_v32(128)),
    C("smla_h16_scatter_fp8_e4m3_p64_fp16", prefix=(64, 4100), new=(300, 1), page=64, dtype="fp16",
      kv_dtype="fp8_e4m3", index_scatter=True, **deepseek_v32(16)),
    C("smla_h16_scatter_fp8_e5m2_p1_fp32", prefix=(17, 2040, 5), new=(30, 1, 1), dtype="fp32", kv_dtype="fp8_e5m2",
      index_scatter=True, **deepseek_v32(16)),
    C("smla_h128_scatter_p16", prefix=(2500, 16, 100), new=(64, 1, 1), page=16, index_scatter=True,
      **deepseek_v32(128)),
    C("smla_h128_scatter_p64", prefix=(2047, 0, 64, 4000), new=(300, 65, 1, 1), page=64, index_scatter=True,
      **deepseek_v32(128)),
    C("smla_h128_selects_p64", prefix=(2100, 4000), new=(9, 1), page=64, **deepseek_v32(128)),  # no query under k
    # 32 heads: what SGLang's Triton sparse prefill takes (triton_sparse_mla, at most 32 a rank)
    C("smla_h32_p64", prefix=(0, 3000, 2048), new=(2100, 20, 1), page=64, **deepseek_v32(32)),
])
# A window starting on a page's last slot (kit.engine.features: window_page_edge), beside the layer features
# and layouts no other such case of the set has.
SMOKE += [
    S("gqa_window_page_edge_p16_bf16", prefix=(0, 23), new=(9, 1), page=16, window=8, dtype="bf16", head_dim=64),
    S("gqa_window_page_edge_p16_shuf_fp32", prefix=(0, 39), new=(5, 1), page=16, window=8, dtype="fp32", head_dim=64,
      layout="shuffled_pages"),
]
