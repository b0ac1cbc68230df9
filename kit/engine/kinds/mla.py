"""MLA (multi-head latent attention, DeepSeek-V2/V3): one latent KV row per token, kv_lora_rank +
rope_dim wide (the compressed KV, then the rotary key part), one KV head; V and each head's output
are the latent's first kv_lora_rank columns. The case names it by kv_lora_rank > 0."""
from __future__ import annotations

NAME = "mla"
LABEL = "MLA (latent attention)"
FIELDS = ("kv_lora_rank", "rope_dim")
# Its parameters, fields of every case (kit.engine.case), 0 where it is not MLA: the latent's rank
# (kv_lora_rank > 0 names the kind), and the width of the rotary key part after it.
PARAMETERS = (("kv_lora_rank", 0), ("rope_dim", 0))


def VALUES(case):
    """What is wrong with its parameters' values whatever the case's kind, or None."""
    if not _count(case.kv_lora_rank) or not _count(case.rope_dim):
        return f"kv_lora_rank {case.kv_lora_rank!r} and rope_dim {case.rope_dim!r} must be ints >= 0"
    return None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def APPLIES(case) -> bool:
    return case.kv_lora_rank > 0


def PROBLEM(case):
    if case.heads[1] != 1:
        return f"MLA has one latent KV head: heads {case.heads!r} must be (q, 1)"
    if case.head_dim != case.kv_lora_rank + case.rope_dim:
        return f"MLA head_dim {case.head_dim} must be kv_lora_rank + rope_dim = {case.kv_lora_rank + case.rope_dim}"
    if case.scale is None:
        return ("MLA needs an explicit scale (DeepSeek: (qk_nope_head_dim + rope_dim) ** -0.5, e.g. "
                "DEEPSEEK_SCALE), never the latent's head_dim ** -0.5")
    if case.window >= 0 or case.cap > 0 or case.hybrid or case.sinks:
        return "MLA cases take no window, cap, hybrid layers or sinks (gpt-oss, the model with sinks, is dense)"
    if case.inputs != "contiguous":
        return ("MLA inputs are contiguous: the absorbed q and the latent row are concatenated "
                "(torch.cat), not views of one projection")
    return None


def GEOMETRY(case):
    from kit.engine.kinds import Geometry
    return Geometry(heads=1, k_width=case.head_dim, v_width=case.kv_lora_rank, v_in_k=True)


def VARIANT_TAG(case) -> str:
    return f"mla{case.kv_lora_rank}r{case.rope_dim}"


def FUZZ(draw, d) -> dict:
    """Dense, or MLA: one latent KV head as wide as the rank and the rope part, an explicit scale,
    no window, cap or hybrid layers."""
    from hypothesis import strategies as st

    kinds = d.takes.kinds
    if "mla" not in kinds or ("dense" in kinds and not draw(st.booleans())):
        return {}
    rank, rope = draw(st.sampled_from(d.size.mla))
    scale = d.fields["scale"] if d.fields["scale"] is not None else draw(st.sampled_from(d.scales))
    return dict(kv_lora_rank=rank, rope_dim=rope, heads=(d.fields["heads"][0], 1), head_dim=rank + rope,
                scale=scale, window=-1, cap=0.0, hybrid=False, inputs="contiguous")
