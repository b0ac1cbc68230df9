"""Hypothesis strategies that draw valid cases (always through `Case`, which validates) of one
mode, over every feature the kit has. Each feature is one entry of FEATURES: a function that
draws its fields given those drawn before it. A new case feature is one more entry.

Choices are ordered simplest first (the first of a `sampled_from`, the first branch of a
`one_of`, the lower end of an `integers`): Hypothesis shrinks toward them, so a shrunk case
keeps only what its failure needs. Lengths and windows are drawn at and around page boundaries
(k * page - 1, k * page, k * page + 1) besides anywhere, and batch sizes and EXTEND token counts
at and around the graph buckets, so padded graph rows appear. A backend's declarations
(`Takes`: attention kinds, quantized KV caches, features) bound the draws: a case it refuses by
declaration alone is never drawn, so an MLA-only backend gets MLA cases, not rejections.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Dict, FrozenSet, Tuple

from hypothesis import strategies as st

from kit.engine.case import INPUT_FORMS, KV_DTYPES, Case
from kit.engine.kinds import KINDS
from kit.engine.layouts import LAYOUTS, PAGE_LAYOUTS
from kit.harness.schedule import BS_BUCKETS, TOKEN_BUCKETS
from kit.modes import ForwardMode


@dataclasses.dataclass(frozen=True)
class Size:
    """How large a drawn case may get (`--size`): small runs fast on CPU."""

    max_bs: int
    max_len: int  # longest cached prefix
    max_new: int  # longest EXTEND request
    max_drafts: int  # TARGET_VERIFY / DRAFT_EXTEND_V2 draft tokens
    pages: Tuple[int, ...]
    kv_heads: Tuple[int, ...]
    groups: Tuple[int, ...]  # q heads per kv head
    head_dims: Tuple[int, ...]
    max_tokens: int  # EXTEND token bucket totals drawn up to this
    mla: Tuple[Tuple[int, int], ...]  # MLA (kv_lora_rank, rope_dim) pairs


SIZES: Dict[str, Size] = {
    # DeepSeek's 512 + 64 besides a small latent: the width some MLA kernels are built for only.
    "small": Size(max_bs=9, max_len=40, max_new=17, max_drafts=6, pages=(1, 4, 16), kv_heads=(1, 2),
                  groups=(1, 2, 4), head_dims=(16, 32, 64), max_tokens=33, mla=((32, 16), (512, 64))),
    "medium": Size(max_bs=17, max_len=300, max_new=70, max_drafts=8, pages=(1, 16, 64), kv_heads=(1, 2, 8),
                   groups=(1, 4, 8), head_dims=(64, 128), max_tokens=129, mla=((128, 32), (512, 64))),
    "large": Size(max_bs=65, max_len=4200, max_new=600, max_drafts=16, pages=(1, 16, 64), kv_heads=(1, 2, 8),
                  groups=(1, 4, 8), head_dims=(64, 128, 256), max_tokens=1025, mla=((512, 64),)),
}

CAPS = (5.0, 20.0, 30.0)
SCALES = (0.05, 0.1, 0.25, 1.0)
MAX_TOPK = 4
SEEDS = 4  # input data draws per shape
DTYPE_ORDER = ("fp32", "fp16", "bf16")  # shrinks toward the exact one


@dataclasses.dataclass(frozen=True)
class Takes:
    """What a backend declares it takes (kit.harness.capabilities.Capabilities): drawn cases stay
    within it. The default takes everything the kit has."""

    kinds: FrozenSet[str] = frozenset(KINDS)
    kv_dtypes: FrozenSet[str] = frozenset(KV_DTYPES)
    features: FrozenSet[str] = frozenset(("sinks",))

    @classmethod
    def of(cls, caps) -> "Takes":
        return cls(caps.attention_kinds, caps.kv_dtypes, caps.attention_features)


@dataclasses.dataclass(frozen=True)
class Drawing:
    """What a feature's draw sees: the size, the mode, what the backend takes and the fields drawn so far."""

    size: Size
    mode: ForwardMode
    takes: Takes
    fields: Dict
    scales: Tuple[float, ...] = ()  # SCALES, for a kind's draws


Feature = Callable[[Callable, Drawing], Dict]  # (draw, drawing) -> the fields it sets


def around(values, low: int, high: int) -> Tuple[int, ...]:
    """v - 1, v, v + 1 of each value, within [low, high]."""
    return tuple(sorted({n for v in values for n in (v - 1, v, v + 1) if low <= n <= high}))


def length(page: int, low: int, high: int) -> st.SearchStrategy:
    """A length in [low, high]: anywhere, 0 or 1, or at and around a page boundary."""
    boundary = st.builds(lambda k, d: k * page + d, st.integers(1, max(1, (high + 1) // page)),
                         st.sampled_from((-1, 0, 1)))
    return st.one_of(st.integers(low, high), st.sampled_from((0, 1)), boundary).map(
        lambda n: min(max(n, low), high))


def _batch(draw, d: Drawing) -> Dict:
    s, page = d.size, d.fields["page"]
    bs = draw(st.one_of(st.integers(1, s.max_bs), st.sampled_from(around(BS_BUCKETS, 1, s.max_bs))))
    return dict(prefix=tuple(draw(st.lists(length(page, 0, s.max_len), min_size=bs, max_size=bs))))


def _new(draw, d: Drawing) -> Dict:
    """What `new` holds in each mode (kit/engine/modes/<mode>.py); TARGET_VERIFY's drafts are a chain or a tree."""
    s, bs = d.size, len(d.fields["prefix"])
    if d.mode is ForwardMode.EXTEND:
        new = draw(st.lists(length(d.fields["page"], 1, s.max_new), min_size=bs, max_size=bs))
        if draw(st.booleans()):  # the batch's token count at or around a token bucket
            total = draw(st.sampled_from(around(TOKEN_BUCKETS, sum(new[:-1]) + 1, s.max_tokens) or (sum(new),)))
            new[-1] = total - sum(new[:-1])
        return dict(new=tuple(new))
    if d.mode is ForwardMode.DECODE:
        return dict(new=1)
    drafts = draw(st.integers(1, s.max_drafts))
    topk = draw(st.integers(1, MAX_TOPK)) if d.mode is ForwardMode.TARGET_VERIFY else 1
    return dict(new=drafts, topk=topk)


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


FEATURES: Tuple[Tuple[str, Feature], ...] = (
    ("page", lambda draw, d: dict(page=draw(st.sampled_from(d.size.pages)))),
    ("batch", _batch),  # batch size at and around the graph buckets; ragged cached lengths
    ("new", _new),  # per mode: extend lengths (token buckets), draft count, chain or tree
    ("heads", _heads),  # GQA group and head_dim
    ("dtype", lambda draw, d: dict(dtype=draw(st.sampled_from(DTYPE_ORDER)))),
    ("layout", lambda draw, d: dict(layout=draw(st.sampled_from(LAYOUTS)))),
    ("window", _window),
    ("cap", lambda draw, d: dict(cap=draw(st.one_of(st.just(0.0), st.sampled_from(CAPS))))),
    ("scale", lambda draw, d: dict(scale=draw(st.one_of(st.just(None), st.sampled_from(SCALES))))),
    ("hybrid", lambda draw, d: dict(hybrid=draw(st.booleans()))),
    ("seed", lambda draw, d: dict(seed=draw(st.integers(0, SEEDS - 1)))),
    ("inputs", lambda draw, d: dict(inputs=draw(st.sampled_from(INPUT_FORMS)))),  # views of a fused QKV row
    ("kind", _kind),  # an attention kind other than dense (MLA), where the backend takes one
    ("kv_dtype", _kv_dtype),
    ("sinks", _sinks),  # last: the draws before it stay those of seeds recorded before it
)


def case_name(fields: Dict, mode: ForwardMode) -> str:
    """A name in the catalog's style (heads kind, batch size, drafts, window, cap, scale, hybrid,
    fused inputs, sinks, page, dtype, layout), so KNOWN_FAILURES.md's case patterns (`*window*`) match
    it, made unique by a checksum of the fields."""
    q, kv = fields["heads"]
    kind = "mla" if fields.get("kv_lora_rank") else "mha" if q == kv else "mqa" if kv == 1 else "gqa"
    parts = [kind, f"bs{len(fields['prefix'])}"]
    if mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2):
        parts.append(("tree" if fields.get("topk", 1) > 1 else "chain" if mode is ForwardMode.TARGET_VERIFY
                      else "draft") + str(fields["new"]))
    parts += [flag for flag, on in (("window", fields["window"] >= 0), ("cap", fields["cap"] > 0),
                                    ("scale", fields["scale"] is not None), ("hybrid", fields["hybrid"]),
                                    ("fused", fields.get("inputs") == "fused_qkv"),
                                    ("sinks", fields.get("sinks", False))) if on]
    parts += [f"p{fields['page']}", fields["dtype"]] + ([fields["kv_dtype"]] if fields.get("kv_dtype") else [])
    checksum = zlib.crc32(repr(sorted(fields.items())).encode()) & 0xFFFFFF
    return "_".join(parts) + PAGE_LAYOUTS[fields["layout"]].suffix + f"_fz{checksum:06x}"


@st.composite
def cases(draw, mode: ForwardMode, size: str = "small", takes: Takes = Takes()) -> Case:
    """A valid case of `mode` within `takes`, every feature drawn."""
    fields: Dict = {}
    for _, feature in FEATURES:
        fields.update(feature(draw, Drawing(SIZES[size], mode, takes, dict(fields), SCALES)))
    return Case(case_name(fields, mode), mode, **fields)


def any_case(modes, size: str = "small", takes: Takes = Takes()) -> st.SearchStrategy:
    """A case of any of `modes` within `takes` (the first mode is where shrinking goes)."""
    return st.one_of([cases(mode, size, takes) for mode in modes])
