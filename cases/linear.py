"""Cases of the recurrent kinds, GDN, Mamba2 and KDA, every mode in one file (kit.engine.kinds.recurrent:
`prefix` the tokens a request's saved state has consumed, 0 for a new request; `new` as the softmax
cases'; TARGET_VERIFY's `accepted`, the drafts each request keeps). Run by kit.harness.recurrent."""
from functools import partial

from kit.engine.kinds.gdn import QWEN3_NEXT
from kit.engine.kinds.kda import KIMI_LINEAR
from kit.engine.kinds.recurrent import FULL, LINEAR, SMOKE_HEADS, RecurrentCase
from kit.modes import ForwardMode

D, E, MX, TV = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY
# The smoke set: the fewest heads that keep value heads sharing a key head, narrow heads whose state
# is not square (K != V: a transposed state shows); each mode, new and saved states side by side,
# fp32 and a half dtype, a chunk longer than the conv window; and every pair of the recurrent features'
# values (kit.engine.features: batches of new states only, a saved window spanning new rows, a request
# one token past the kernels' 64-token chunk, verifies keeping every draft) per kind and mode.
S = partial(RecurrentCase, heads=SMOKE_HEADS, head_k_dim=16, head_v_dim=32)
M = partial(S, kind="mamba2", head_k_dim=8, head_v_dim=16)  # (groups, heads), d_state, head_dim
K = partial(S, kind="kda", heads=(2, 2))  # Kimi Linear's q, k and v heads alike
# A hybrid model: a full-attention layer after each linear one (the KV pool's two, dense GQA of the
# smoke set's heads), every layer over the same requests.
H = partial(S, layer_pattern=(LINEAR, FULL, LINEAR, FULL))

SMOKE = [
    S("gdn_decode_fp32", D, prefix=(0, 5, 1, 40), dtype="fp32"),
    S("gdn_decode_bf16_long", D, prefix=(300, 2), dtype="bf16"),
    S("gdn_extend_chunks_fp32", E, prefix=(0, 17, 2), new=(7, 1, 20), dtype="fp32"),
    S("gdn_extend_fp16", E, prefix=(9, 0), new=(3, 12), dtype="fp16", heads=(2, 4)),
    S("gdn_mixed_fp32", MX, prefix=(0, 33, 4, 7), new=(9, 5, 1, 1), dtype="fp32"),
    S("gdn_verify_fp32", TV, prefix=(12, 0, 30), new=4, accepted=(1, 4, 2), dtype="fp32"),
    S("gdn_verify_bf16", TV, prefix=(5, 64), new=3, accepted=(3, 1), dtype="bf16"),
    M("mamba2_decode_fp32", D, prefix=(0, 3, 50), dtype="fp32"),
    M("mamba2_decode_bf16_long", D, prefix=(300, 2), dtype="bf16"),  # every request prefilled, as SGLang decodes
    M("mamba2_extend_chunks_bf16", E, prefix=(0, 20), new=(11, 6), dtype="bf16"),
    M("mamba2_mixed_fp32", MX, prefix=(7, 0, 12), new=(5, 1, 1), dtype="fp32", heads=(2, 4)),
    M("mamba2_verify_fp32", TV, prefix=(4, 0), new=3, accepted=(2, 3), dtype="fp32"),
    K("kda_decode_fp32", D, prefix=(0, 9, 60), dtype="fp32"),
    K("kda_decode_bf16_long", D, prefix=(300, 2), dtype="bf16"),  # every request prefilled, as SGLang decodes
    K("kda_extend_chunks_bf16", E, prefix=(3, 0), new=(10, 7), dtype="bf16"),
    K("kda_mixed_fp32", MX, prefix=(0, 21, 5), new=(6, 1, 1), dtype="fp32"),
    K("kda_verify_fp32", TV, prefix=(8, 0), new=3, accepted=(1, 3), dtype="fp32"),
    S("gdn_decode_fresh_fp32", D, prefix=(0, 0, 0), dtype="fp32"),
    M("mamba2_decode_fresh_bf16", D, prefix=(0, 0), dtype="bf16"),
    K("kda_decode_fresh_fp32", D, prefix=(0, 0), dtype="fp32"),
    S("gdn_extend_fresh_chunk_bf16", E, prefix=(0, 0), new=(65, 6), dtype="bf16"),
    M("mamba2_extend_chunk_short_fp32", E, prefix=(1, 20), new=(65, 2), dtype="fp32"),
    M("mamba2_extend_fresh_bf16", E, prefix=(0, 0), new=(11, 6), dtype="bf16"),
    K("kda_extend_chunk_short_fp32", E, prefix=(1, 20), new=(65, 2), dtype="fp32"),
    K("kda_extend_fresh_bf16", E, prefix=(0, 0), new=(11, 6), dtype="bf16"),
    S("gdn_mixed_fresh_chunk_fp32", MX, prefix=(0, 0, 0), new=(65, 1, 1), dtype="fp32"),
    M("mamba2_mixed_chunk_fp32", MX, prefix=(7, 0, 12), new=(65, 1, 1), dtype="fp32"),
    M("mamba2_mixed_fresh_bf16", MX, prefix=(0, 0, 0), new=(5, 1, 1), dtype="bf16"),
    K("kda_mixed_fresh_chunk_fp32", MX, prefix=(0, 0, 0), new=(65, 1, 1), dtype="fp32"),
    K("kda_mixed_saved_extend_fp32", MX, prefix=(9, 0), new=(4, 1), dtype="fp32"),
    S("gdn_verify_fresh_fp32", TV, prefix=(0, 0), new=3, accepted=(3, 3), dtype="fp32"),
    M("mamba2_verify_keep_all_fp32", TV, prefix=(4, 0), new=3, accepted=(3, 3), dtype="fp32"),
    M("mamba2_verify_fresh_bf16", TV, prefix=(0, 0), new=3, accepted=(1, 3), dtype="bf16"),
    # every request saved, as vLLM verifies drafts only after a request's prefill
    M("mamba2_verify_saved_bf16", TV, prefix=(6, 70), new=3, accepted=(3, 1), dtype="bf16"),
    K("kda_verify_fresh_fp32", TV, prefix=(0, 0), new=3, accepted=(3, 3), dtype="fp32"),
    K("kda_verify_saved_bf16", TV, prefix=(40, 9), new=3, accepted=(1, 3), dtype="bf16"),  # as SGLang verifies
    H("hybrid_gdn_decode_fp32", D, prefix=(0, 5, 40), dtype="fp32"),
    H("hybrid_gdn_decode_saved_fp32", D, prefix=(5, 40), dtype="fp32"),  # every request prefilled, as SGLang decodes
    H("hybrid_gdn_extend_bf16", E, prefix=(9, 0), new=(3, 12), dtype="bf16"),
    H("hybrid_gdn_mixed_fp32", MX, prefix=(0, 17, 6), new=(5, 1, 1), dtype="fp32"),
    H("hybrid_gdn_verify_fp32", TV, prefix=(12, 30, 5), new=3, accepted=(1, 3, 2), dtype="fp32"),  # as SGLang verifies
    H("hybrid_gdn_verify_bf16", TV, prefix=(20, 9), new=4, accepted=(4, 2), dtype="bf16"),
]

# Qwen3-Next's GDN layer at TP 1 (16 key heads, 32 value heads of 128) and TP 4 (4 and 8);
# Mamba2 as NVIDIA Nemotron-H / Mamba2-2.7B run it: 8 groups of 128 heads (d_state 128, head_dim 64), TP 1;
# KDA as Kimi Linear's layer at TP 1.
F = partial(RecurrentCase, heads=QWEN3_NEXT)
FM = partial(RecurrentCase, kind="mamba2", heads=(8, 128), head_k_dim=128, head_v_dim=64)
FK = partial(RecurrentCase, kind="kda", heads=KIMI_LINEAR)
# Qwen3-Next's first eight layers (three GDN layers, then a full-attention one: 16 query heads, 2 KV
# heads of 256, TP 1).
FH = partial(F, layer_pattern=(LINEAR, LINEAR, LINEAR, FULL) * 2, attention_heads=(16, 2), attention_head_dim=256)
FULL = [
    F("gdn_decode_ragged", D, prefix=(0, 1, 3, 4, 17, 200, 1024, 5)),
    F("gdn_decode_tp4", D, prefix=(7, 0, 300), heads=(4, 8)),
    F("gdn_extend_chunks", E, prefix=(0, 64, 3, 1000), new=(100, 64, 1, 257)),
    F("gdn_extend_fp16_tp4", E, prefix=(5, 0), new=(300, 2), heads=(4, 8), dtype="fp16"),
    F("gdn_mixed", MX, prefix=(0, 128, 40, 9, 1), new=(65, 3, 1, 1, 1)),
    F("gdn_verify_chain4", TV, prefix=(10, 0, 500, 63), new=4, accepted=(1, 4, 2, 3)),
    F("gdn_verify_chain8_fp32", TV, prefix=(1, 77), new=8, accepted=(8, 5), dtype="fp32"),
    FM("mamba2_decode_ragged", D, prefix=(0, 1, 5, 300, 1024)),
    FM("mamba2_extend_chunks", E, prefix=(0, 256, 7), new=(300, 64, 1)),
    FM("mamba2_mixed", MX, prefix=(0, 90, 3), new=(129, 1, 1)),
    FM("mamba2_verify_chain4", TV, prefix=(33, 0, 200), new=4, accepted=(4, 1, 2)),
    FK("kda_decode_ragged", D, prefix=(0, 2, 17, 400, 1024)),
    FK("kda_extend_chunks", E, prefix=(0, 128, 9), new=(200, 64, 1)),
    FK("kda_mixed", MX, prefix=(0, 50, 3), new=(97, 1, 1)),
    FK("kda_verify_chain4", TV, prefix=(12, 0, 300), new=4, accepted=(2, 4, 1)),
    FK("kda_verify_saved_chain4", TV, prefix=(12, 300), new=4, accepted=(4, 2)),
    F("gdn_decode_fresh", D, prefix=(0, 0, 0, 0)),
    FM("mamba2_decode_fresh", D, prefix=(0, 0, 0)),
    FK("kda_decode_fresh", D, prefix=(0, 0, 0)),
    # every request prefilled, as SGLang decodes (it reads each row's slot): its decode graphs' batches
    F("gdn_decode_saved", D, prefix=(1, 3, 4, 17, 200, 1024, 5)),
    F("gdn_decode_saved_tp4_fp16", D, prefix=(7, 300, 64), heads=(4, 8), dtype="fp16"),
    FM("mamba2_decode_saved", D, prefix=(1, 5, 300, 1024)),
    FK("kda_decode_saved", D, prefix=(2, 17, 400, 1024)),
    F("gdn_extend_fresh_chunks", E, prefix=(0, 0), new=(300, 2)),
    F("gdn_extend_short_fp16", E, prefix=(5, 0), new=(2, 2), dtype="fp16"),
    FM("mamba2_extend_fresh", E, prefix=(0, 0), new=(64, 2)),
    FK("kda_extend_fresh", E, prefix=(0, 0), new=(64, 2)),
    F("gdn_mixed_fresh", MX, prefix=(0, 0, 0), new=(64, 1, 1)),
    FM("mamba2_mixed_short", MX, prefix=(1, 50, 3), new=(2, 1, 1)),
    FM("mamba2_mixed_fresh_chunks", MX, prefix=(0, 0, 0), new=(97, 1, 1)),
    FK("kda_mixed_fresh", MX, prefix=(0, 0, 0), new=(64, 1, 1)),
    FK("kda_mixed_saved_extend", MX, prefix=(40, 0), new=(70, 1)),
    F("gdn_verify_fresh_chain8_fp32", TV, prefix=(0, 0), new=8, accepted=(8, 8), dtype="fp32"),
    FM("mamba2_verify_keep_all", TV, prefix=(1, 77), new=4, accepted=(4, 4)),
    FM("mamba2_verify_fresh", TV, prefix=(0, 0), new=4, accepted=(1, 4)),
    FM("mamba2_verify_chain4_saved", TV, prefix=(33, 5, 200), new=4, accepted=(4, 1, 2)),  # as vLLM verifies
    FK("kda_verify_fresh", TV, prefix=(0, 0), new=4, accepted=(4, 4)),
    # value heads narrower than key heads: a model whose widths differ (Kimi Linear's are equal), where
    # a scale or a state taken by the wrong width shows (every decode row saved, as SGLang decodes)
    FK("kda_decode_kv_widths", D, prefix=(2, 9, 300), head_v_dim=64),
    FK("kda_mixed_kv_widths", MX, prefix=(0, 40, 3), new=(70, 1, 1), head_v_dim=64),
    FH("hybrid_gdn_decode", D, prefix=(1, 17, 300, 1024)),
    FH("hybrid_gdn_extend", E, prefix=(0, 64, 500), new=(100, 65, 1)),
    FH("hybrid_gdn_mixed", MX, prefix=(0, 128, 9), new=(97, 1, 1)),
    FH("hybrid_gdn_verify_chain4", TV, prefix=(17, 300, 1024, 64), new=4, accepted=(2, 4, 1, 3)),
]
