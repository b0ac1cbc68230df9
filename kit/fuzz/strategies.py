"""Hypothesis strategies that draw valid cases (always through `Case`, which validates) of one
mode, over every feature the kit has (kit.engine.features). Each draw is one entry of DRAWS: a
function that draws its fields given those drawn before it. A new case feature is one more row
there and one more entry here.

Choices are ordered simplest first (the first of a `sampled_from`, the first branch of a
`one_of`, the lower end of an `integers`): Hypothesis shrinks toward them, so a shrunk case
keeps only what its failure needs. Lengths and windows are drawn at and around page boundaries
(k * page - 1, k * page, k * page + 1) besides anywhere, and batch sizes and EXTEND token counts
at and around the graph buckets of the backend's engine (its profile's: vLLM's capture sizes for
vLLM's backends), so padded graph rows appear. A backend's declarations
(`Takes`: attention kinds, quantized KV caches, features) bound the draws: a case it refuses by
declaration alone is never drawn, so an MLA-only backend gets MLA cases, not rejections.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Dict, Tuple

from hypothesis import strategies as st

from kit.engine.case import KV_DTYPES, Case
from kit.engine.draws import CAPS, SCALES, SEEDS, SIZES, Drawing, Takes, around, length
from kit.engine.features import BY_NAME, features_of
from kit.engine.kinds import KINDS
from kit.engine.kinds import recurrent
from kit.engine.layouts import PAGE_LAYOUTS
from kit.engine.modes import rules_for
from kit.modes import ForwardMode

Feature = Callable[[Callable, Drawing], Dict]  # (draw, drawing) -> the fields it sets


def _batch(draw, d: Drawing) -> Dict:
    s, page = d.size, d.fields["page"]
    bs = draw(st.one_of(st.integers(1, s.max_bs), st.sampled_from(around(d.batch_sizes, 1, s.max_bs))))
    return dict(prefix=tuple(draw(st.lists(length(page, 0, s.max_len), min_size=bs, max_size=bs))))


def _new(draw, d: Drawing) -> Dict:
    """What `new` (and topk) hold: the mode's own draw (kit/engine/modes/<mode>.py)."""
    return rules_for(d.mode).draw_new(draw, d)


def _heads(draw, d: Drawing) -> Dict:
    kv, group = draw(st.sampled_from(d.size.kv_heads)), draw(st.sampled_from(d.size.groups))
    return dict(heads=(kv * group, kv), head_dim=draw(st.sampled_from(d.size.head_dims)))


def _window(draw, d: Drawing) -> Dict:
    """Off, or a window anywhere, at and around page boundaries, or starting at and around one
    (seen from the first request's first query)."""
    page, first = d.fields["page"], d.fields["prefix"][0]
    starts = st.builds(lambda k, e: max(0, first - (k * page + e)), st.integers(0, max(0, first // page)),
                       st.sampled_from((-1, 0, 1)))
    window = st.one_of(st.integers(0, d.size.max_len), length(d.fields["page"], 0, d.size.max_len), starts)
    return dict(window=draw(st.one_of(st.just(-1), window)))


def _kind(draw, d: Drawing) -> Dict:
    """The attention kind's own fields (kit/engine/kinds/): each kind, in turn, may claim the case."""
    for kind in KINDS.values():
        fields = kind.fuzz(draw, d)
        if fields:
            return fields
    return {}


def _sinks(draw, d: Drawing) -> Dict:
    """Attention sinks (gpt-oss), on dense layers only."""
    if d.fields.get("kv_lora_rank") or "sinks" not in d.takes.features:
        return {}
    return dict(sinks=draw(st.booleans()))


def _kv_dtype(draw, d: Drawing) -> Dict:
    """The model's dtype, or a quantized cache the backend reads."""
    return dict(kv_dtype=draw(st.sampled_from((None,) + tuple(k for k in KV_DTYPES if k in d.takes.kv_dtypes))))


def _values(name: str) -> Feature:
    """A draw among a feature's values (kit.engine.features), the plain one first."""
    return lambda draw, d: {name: draw(st.sampled_from(BY_NAME[name].values))}


DRAWS: Tuple[Tuple[str, Feature], ...] = (
    ("page", lambda draw, d: dict(page=draw(st.sampled_from(d.size.pages)))),
    ("batch", _batch),  # batch size at and around the graph buckets; ragged cached lengths
    ("new", _new),  # per mode: extend lengths (token buckets), draft count, chain or tree
    ("heads", _heads),  # GQA group and head_dim
    ("dtype", _values("dtype")),  # the exact one first: shrinks toward it
    ("layout", _values("layout")),
    ("window", _window),
    ("cap", lambda draw, d: dict(cap=draw(st.one_of(st.just(0.0), st.sampled_from(CAPS))))),
    ("scale", lambda draw, d: dict(scale=draw(st.one_of(st.just(None), st.sampled_from(SCALES))))),
    ("hybrid", lambda draw, d: dict(hybrid=draw(st.booleans()))),
    ("seed", lambda draw, d: dict(seed=draw(st.integers(0, SEEDS - 1)))),
    ("inputs", _values("inputs")),  # views of a fused QKV row
    ("kind", _kind),  # an attention kind other than dense (MLA, sparse MLA), where the backend takes one
    ("kv_dtype", _kv_dtype),
    ("sinks", _sinks),
    # last: the draws before it stay those of seeds recorded before it
    ("context_edge", lambda draw, d: dict(context_edge=draw(st.booleans()))),  # the model's limit
)


def case_name(case, fields: Dict) -> str:
    """A name in the catalog's style (heads kind, batch size, the mode's tag, the features that are on
    in kit.engine.features' order, page, dtype, layout; a recurrent case's: its kind, batch size, the
    features on, dtype), so KNOWN_FAILURES.md's case patterns (`*window*`) match it, made unique by a
    checksum of `fields` (those drawn)."""
    checksum = zlib.crc32(repr(sorted(fields.items())).encode()) & 0xFFFFFF
    if isinstance(case, recurrent.RecurrentCase):
        parts = [case.kind, f"bs{case.bs}"] + [f.tag for f in features_of(case) if f.tag and f.on(case)]
        return "_".join(parts + [case.dtype, f"fz{checksum:06x}"])
    q, kv = case.heads
    kind = "smla" if case.index_topk else "mla" if case.is_mla else "mha" if q == kv else "mqa" if kv == 1 else "gqa"
    parts = [kind, f"bs{case.bs}"]
    tag = rules_for(case.mode).name_tag(fields)
    if tag:
        parts.append(tag)
    parts += [f.tag for f in features_of(case) if f.tag and f.on(case)]
    parts += [f"p{case.page}", case.dtype] + ([case.kv_dtype] if case.kv_dtype else [])
    return "_".join(parts) + PAGE_LAYOUTS[case.layout].suffix + f"_fz{checksum:06x}"


@st.composite
def cases(draw, mode: ForwardMode, size: str, takes: Takes) -> Case:
    """A valid case of `mode` within `takes`, every feature drawn."""
    fields: Dict = {}
    for _, feature in DRAWS:
        fields.update(feature(draw, Drawing(SIZES[size], mode, takes, dict(fields))))
    case = Case("drawn", mode, **fields)
    return case.with_(name=case_name(case, fields))


@st.composite
def recurrent_cases(draw, mode: ForwardMode, size: str, takes: Takes) -> recurrent.RecurrentCase:
    """A valid recurrent case of `mode` of a kind within `takes` (kit.engine.kinds.recurrent.draw_case)."""
    case = recurrent.draw_case(draw, Drawing(SIZES[size], mode, takes, {}))
    return case.with_(name=case_name(case, case_fields(case)))


def case_fields(case) -> Dict:
    """A case's fields, as its name's checksum is made from them (case_name)."""
    return {f.name: getattr(case, f.name) for f in dataclasses.fields(case) if f.name not in ("name", "mode")}


def any_case(modes, size: str, takes: Takes) -> st.SearchStrategy:
    """A case of any of `modes` within `takes`: of the softmax kinds where the backend takes one, of the
    recurrent kinds where it takes one and the mode serves them (the first mode is where shrinking goes)."""
    drawn = []
    for mode in modes:
        if takes.kinds & set(KINDS):
            drawn.append(cases(mode, size, takes))
        if takes.kinds & set(recurrent.KINDS) and mode in recurrent.MODES:
            drawn.append(recurrent_cases(mode, size, takes))
    if not drawn:
        raise ValueError(f"no case of the modes {[m.value for m in modes]} is of a kind the backend takes "
                         f"({', '.join(sorted(takes.kinds))})")
    return st.one_of(drawn)
