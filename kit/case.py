"""A case: one declarative line describing a batch and a layer to test."""
from __future__ import annotations

import dataclasses
import zlib
from typing import Optional, Tuple, Union

import torch

from kit.modes import ForwardMode

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAYOUTS = ("contiguous", "shuffled_pages", "interleaved_pages", "non_monotonic_extend")

# (num_q_heads, num_kv_heads) presets
MHA = (8, 8)
GQA = (8, 2)
MQA = (8, 1)
GQA_32_8 = (32, 8)


@dataclasses.dataclass(frozen=True)
class Case:
    """One batch shape + layer config for one runner mode.

    prefix: per request, the tokens whose KV is already in the pool
            (DECODE: seq_len - 1; EXTEND: extend_prefix_lens;
            TARGET_VERIFY: seq_lens; DRAFT_EXTEND_V2: seq_lens - drafts).
    new:    EXTEND: per-request extend lengths (ragged); TARGET_VERIFY and
            DRAFT_EXTEND_V2: the fixed number of draft tokens; DECODE: 1.
    """

    name: str
    mode: ForwardMode
    prefix: Tuple[int, ...]
    new: Union[int, Tuple[int, ...]] = 1
    page: int = 1
    heads: Tuple[int, int] = GQA
    head_dim: int = 128
    dtype: str = "bf16"
    window: int = -1  # sliding window W: a query at p sees keys p-W..p
    cap: float = 0.0  # logit soft cap, 0 = off
    scale: Optional[float] = None  # sm_scale, None = 1/sqrt(head_dim)
    topk: int = 1  # TARGET_VERIFY: 1 = chain, >1 = tree
    layout: str = "contiguous"
    seed: int = 0
    # The model's other layer (layer 0, run first each step) has another config: no window
    # if this case has one (else a window of 8), half the scale, and the cap off (else 10).
    # Otherwise it repeats this case's config (kit.layer.model_layers).
    hybrid: bool = False

    def __post_init__(self):
        if not self.name or "-" in self.name or " " in self.name:
            raise ValueError(f"case name {self.name!r}: use letters, digits and _ (test ids split on '-')")
        if self.dtype not in DTYPES:
            raise ValueError(f"case {self.name}: dtype {self.dtype!r} not in {list(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"case {self.name}: layout {self.layout!r} not in {LAYOUTS}")
        if self.page < 1 or not self.prefix or min(self.prefix) < 0:
            raise ValueError(f"case {self.name}: bad page size or prefix lengths")
        if not isinstance(self.mode, ForwardMode):
            raise ValueError(f"case {self.name}: mode {self.mode!r} is not a ForwardMode (e.g. ForwardMode.DECODE)")
        problem = self.mode.rules.validate(self)
        if problem:
            raise ValueError(f"case {self.name}: {problem}")

    @property
    def bs(self) -> int:
        return len(self.prefix)

    @property
    def new_lens(self) -> Tuple[int, ...]:
        return tuple(self.new) if not isinstance(self.new, int) else (self.new,) * self.bs

    @property
    def num_q_heads(self) -> int:
        return self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.heads[1]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def sm_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    def rng_seed(self, salt: int = 0) -> int:
        """Deterministic across processes (xdist workers must agree)."""
        return zlib.crc32(f"{self.mode.value}/{self.name}/{self.seed}/{salt}".encode())

    def with_(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)


_LAYOUT_SUFFIX = {"contiguous": "", "shuffled_pages": "_shuf", "interleaved_pages": "_inter",
                  "non_monotonic_extend": "_nonmono"}


def in_every_layout(cases):
    """Each case once per layout (SPEC: every mode runs on every layout)."""
    return [c.with_(name=c.name + _LAYOUT_SUFFIX[layout], layout=layout) for c in cases for layout in LAYOUTS]
