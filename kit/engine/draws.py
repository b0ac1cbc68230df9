"""What a fuzz draw sees (kit.fuzz.strategies draws cases; a mode's rules and an attention kind
draw their own fields with these): how large a case may get, what the backend takes, the fields
drawn so far, and the shapes lengths are drawn around (page boundaries, graph buckets)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, FrozenSet, Tuple

from hypothesis import strategies as st

from kit.engine.case import KV_DTYPES
from kit.engine.kinds import KINDS
from kit.engine.profile import EngineProfile
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


@dataclasses.dataclass(frozen=True)
class Takes:
    """What a backend declares it takes (kit.harness.capabilities.Capabilities): drawn cases stay
    within it, their batch sizes and token counts drawn around its engine's graph buckets. The
    default takes everything the kit has."""

    profile: EngineProfile  # the backend's engine: the graph buckets draws target
    kinds: FrozenSet[str] = frozenset(KINDS)
    kv_dtypes: FrozenSet[str] = frozenset(KV_DTYPES)
    features: FrozenSet[str] = frozenset(("sinks",))

    @classmethod
    def of(cls, caps) -> "Takes":
        return cls(caps.profile, caps.attention_kinds, caps.kv_dtypes, caps.attention_features)


def around(values, low: int, high: int) -> Tuple[int, ...]:
    """v - 1, v, v + 1 of each value, within [low, high]."""
    return tuple(sorted({n for v in values for n in (v - 1, v, v + 1) if low <= n <= high}))


def length(page: int, low: int, high: int) -> st.SearchStrategy:
    """A length in [low, high]: anywhere, 0 or 1, or at and around a page boundary."""
    boundary = st.builds(lambda k, d: k * page + d, st.integers(1, max(1, (high + 1) // page)),
                         st.sampled_from((-1, 0, 1)))
    return st.one_of(st.integers(low, high), st.sampled_from((0, 1)), boundary).map(
        lambda n: min(max(n, low), high))


@dataclasses.dataclass(frozen=True)
class Drawing:
    """What a feature's draw sees: the size, the mode, what the backend takes and the fields drawn so far."""

    size: Size
    mode: ForwardMode
    takes: Takes
    fields: Dict
    scales: Tuple[float, ...] = SCALES  # sm_scale values drawn (an attention kind may need one)
    max_topk: int = MAX_TOPK
    seeds: int = SEEDS  # input data draws per shape (a kind drawing its whole case draws its seed)

    @property
    def batch_sizes(self) -> Tuple[int, ...]:
        """The batch sizes the backend's engine captures graphs for: batch sizes are drawn around them."""
        return self.takes.profile.batch_sizes

    @property
    def token_buckets(self) -> Tuple[int, ...]:
        """The token counts its engine captures graphs for: EXTEND token totals are drawn around them."""
        return self.takes.profile.token_buckets
    # What a mode's or a kind's draws use (they import nothing of the fuzzer's).
    around = staticmethod(around)
    length = staticmethod(length)


Feature = Callable[[Callable, Drawing], Dict]  # (draw, drawing) -> the fields it sets
