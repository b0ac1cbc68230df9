"""Sparse MLA (DeepSeek-V3.2's DSA): MLA's latent KV (kit/engine/kinds/mla.py), but each query
attends only the cache positions its indexer selected, at most `index_topk` of them, softmax over
those alone. The selection is part of the step: the kit draws it (kit.engine.sparse) and hands it
as `batch.topk_indices`. The case names the kind by index_topk > 0; `index_scatter` places a
row's -1 padding among its indices rather than after them."""
from __future__ import annotations

from kit.engine.kinds import mla

NAME = "sparse_mla"
LABEL = "sparse MLA (top-k selected keys)"
FIELDS = mla.FIELDS + ("index_topk", "index_scatter")
# The modes the engines serve sparse MLA in (vLLM's FLASHMLA_SPARSE, SGLang's DSA backend): the
# indexer runs in each; the multi-step draft modes are not served with a sparse target here.
MODES = ("decode", "extend", "mixed", "target_verify")
# Its parameters beyond MLA's, fields of every case (kit.engine.case): the indexer's top-k (> 0
# names the kind), and whether a row's -1 padding sits among its indices.
PARAMETERS = (("index_topk", 0), ("index_scatter", False))


def VALUES(case):
    """Its parameters' values are checked where the case is of the kind (PROBLEM)."""
    return None


def APPLIES(case) -> bool:
    return case.index_topk > 0


def PROBLEM(case):
    if not isinstance(case.index_topk, int) or isinstance(case.index_topk, bool) or case.index_topk < 1:
        return f"index_topk {case.index_topk!r} must be an int >= 1 (the indexer's top-k)"
    if not isinstance(case.index_scatter, bool):
        return f"index_scatter {case.index_scatter!r} must be True or False"
    if case.kv_lora_rank < 1:
        return "sparse MLA is latent attention: set kv_lora_rank and rope_dim as for MLA"
    if case.mode.value not in MODES:
        return f"sparse MLA runs in {', '.join(MODES)}, not {case.mode.value}"
    if case.topk > 1:
        return "sparse MLA verifies chains (topk 1): the engines' indexer has no tree mask"
    return mla.PROBLEM(case)


GEOMETRY = mla.GEOMETRY


def VARIANT_TAG(case) -> str:
    return f"{mla.VARIANT_TAG(case)}k{case.index_topk}"


def FUZZ(draw, d) -> dict:
    """Sparse MLA where the backend takes it and the mode serves it: MLA's fields, a top-k about
    the drawn lengths (smaller and larger than a context), padding at the tail or scattered."""
    from hypothesis import strategies as st

    kinds = d.takes.kinds
    if NAME not in kinds or d.mode.value not in MODES or d.fields.get("topk", 1) > 1:
        return {}
    if kinds - {NAME} and not draw(st.booleans()):
        return {}
    rank, rope = draw(st.sampled_from(d.size.mla))
    scale = d.fields["scale"] if d.fields["scale"] is not None else draw(st.sampled_from(d.scales))
    return dict(kv_lora_rank=rank, rope_dim=rope, heads=(d.fields["heads"][0], 1), head_dim=rank + rope,
                scale=scale, window=-1, cap=0.0, hybrid=False, inputs="contiguous",
                index_topk=draw(st.integers(1, max(2, d.size.max_len // 2))), index_scatter=draw(st.booleans()))
