"""The case features, once: a property of a case a backend's code branches on, with its values
(the plain one first), a case's value, and the fields that give a case a value. The catalog's
pairs check (kit.engine.pairs), the fuzzer's names and shrinking (kit.fuzz) all read this table;
a new feature is one row."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

from kit.engine.case import DTYPES, INPUT_FORMS, KV_DTYPES, Case
from kit.engine.kinds import KINDS
from kit.engine.layouts import LAYOUTS

# The page sizes engines run: SGLang's default 1, FlashInfer's and vLLM's 16, 64 (FlashMLA's, trtllm's).
PAGE_SIZES = (1, 16, 64)


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    values: Tuple  # every value the pairs check pairs, the plain one first
    of: Callable[[Case], object]  # a case's value
    fields: Callable[[object], Dict]  # the case fields that give a case the value (kind: see pairs.Probe)
    paired: bool = True  # every pair of its values with another feature's must be some catalog case's
    dropped: bool = True  # a found case is tried without it (set plain) where its failure may not need it
    sized: bool = True  # a found case with it on is larger (the fuzzer keeps the smallest)
    tag: Optional[str] = None  # what a drawn case's name says when it is on

    def on(self, case: Case) -> bool:
        return self.of(case) != self.values[0]


FEATURES: Tuple[Feature, ...] = (
    Feature("kind", tuple(sorted(KINDS, key=lambda k: k != "dense")), lambda c: c.kind, lambda value: {},
            dropped=False, sized=False),
    Feature("dtype", tuple(DTYPES), lambda c: c.dtype, lambda value: dict(dtype=value), dropped=False),
    Feature("kv_dtype", (None,) + tuple(KV_DTYPES), lambda c: c.kv_dtype, lambda value: dict(kv_dtype=value)),
    Feature("window", (False, True), lambda c: c.window >= 0, lambda value: dict(window=8 if value else -1),
            tag="window"),
    Feature("cap", (False, True), lambda c: c.cap > 0, lambda value: dict(cap=5.0 if value else 0.0), tag="cap"),
    Feature("scale", (False, True), lambda c: c.scale is not None, lambda value: dict(scale=0.25 if value else None),
            paired=False, tag="scale"),
    Feature("hybrid", (False, True), lambda c: c.hybrid, lambda value: dict(hybrid=value), tag="hybrid"),
    Feature("inputs", INPUT_FORMS, lambda c: c.inputs, lambda value: dict(inputs=value), tag="fused"),
    Feature("sinks", (False, True), lambda c: c.sinks, lambda value: dict(sinks=value), tag="sinks"),
    Feature("context_edge", (False, True), lambda c: c.context_edge, lambda value: dict(context_edge=value),
            paired=False, dropped=False, sized=False, tag="context_edge"),
    Feature("layout", LAYOUTS, lambda c: c.layout, lambda value: dict(layout=value)),
    Feature("page", PAGE_SIZES, lambda c: c.page, lambda value: dict(page=value), dropped=False, sized=False),
    Feature("tree", (False, True), lambda c: c.topk > 1, lambda value: dict(topk=2 if value else 1)),
    Feature("seed", (0, 1), lambda c: c.seed, lambda value: dict(seed=value), paired=False, dropped=False),
)
BY_NAME = {f.name: f for f in FEATURES}
