"""The case features, once: a property of a case a backend's code branches on, with its values
(the plain one first), a case's value, and the fields that give a case a value. The catalog's
pairs check (kit.engine.pairs), the fuzzer's names and shrinking (kit.fuzz) all read this table;
a new feature is one row."""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Dict, Optional, Tuple

from kit.engine.case import DTYPES, INPUT_FORMS, KV_DTYPES, Case
from kit.engine.kinds import KINDS
from kit.engine.kinds import recurrent
from kit.engine.kinds.recurrent import CHUNK, RecurrentCase
from kit.engine.layouts import LAYOUTS
from kit.engine.plan import plan_case, row_order
from kit.engine.profile import DECODE_FIRST
from kit.engine.sparse import PAD

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
    # The fields that give a case, built with the other features' values, this one where it depends on
    # the case's lengths, page or window ({} where it has it already, or no change of those can give it);
    # None: `fields` alone.
    fit: Optional[Callable[[Case, object], Dict]] = None
    case: type = Case  # the cases it is a property of (softmax, or recurrent: kit.engine.kinds.recurrent)

    def on(self, case: Case) -> bool:
        return self.of(case) != self.values[0]


def _reordered(case: Case) -> bool:
    """Whether an engine handing decode rows first (vLLM) hands the case's rows in another order than
    an engine handing them as scheduled (SGLang): only then do the two orders run different batches."""
    return row_order(case, DECODE_FIRST) != list(range(case.bs))


def _fit_row_order(case: Case, reordered: bool) -> Dict:
    """Rows a decode-first engine reorders (a fresh prompt before requests with a cached prefix), or
    the case's rows in that engine's own order."""
    if _reordered(case) == reordered or case.bs < 2:
        return {}
    if reordered:
        return dict(prefix=(0,) + tuple(max(p, 1) for p in case.prefix[1:]))
    order = row_order(case, DECODE_FIRST)
    new = case.new if isinstance(case.new, int) else tuple(case.new[i] for i in order)
    return dict(prefix=tuple(case.prefix[i] for i in order), new=new)


@functools.lru_cache(maxsize=4096)
def _planned(case: Case):
    """The case's requests as planned (kit.engine.plan), once for each of the features that read them."""
    return plan_case(case).requests


def _query_positions(case: Case) -> Tuple[int, ...]:
    return tuple(q for r in _planned(case) for q in r.q_pos)


def _edge_start(window: int, page: int, positions) -> bool:
    """Whether a query's window (keys q - W .. q) starts on a page's last slot: a kernel starting at the
    page after the start's rounds the start's own key away."""
    return any(q - window >= 0 and (q - window) % page == page - 1 for q in positions)


def _window_page_edge(case: Case) -> bool:
    return case.window >= 0 and _edge_start(case.window, case.page, _query_positions(case))


def _fit_window_page_edge(case: Case, edge: bool) -> Dict:
    """A window (the case's own replaced, or one where it has none) whose start is on a page's last slot
    for the last query (the widest such short of the query's page), or the least window from the
    case's that starts on none."""
    if _window_page_edge(case) == edge:
        return {}
    positions = _query_positions(case)
    last = max(positions)
    if edge:
        start = (last - case.page) // case.page * case.page + case.page - 1  # the last such slot before `last`
        return dict(window=last - start) if start >= 0 else {}
    return dict(window=next(w for w in range(case.window, last + 2) if not _edge_start(w, case.page, positions)))


def _index_padded(case: Case) -> bool:
    """Whether a query of a sparse case sees fewer keys than index_topk (its row padded with -1)."""
    return case.index_topk > 0 and any(bool((r.selected == PAD).any()) for r in _planned(case))


def _fit_index_padded(case: Case, padded: bool) -> Dict:
    """A top-k past every query's keys, or within the fewest any query sees."""
    if case.index_topk == 0 or _index_padded(case) == padded:
        return {}
    seen = [int(row.sum()) for r in _planned(case) for row in r.visible]
    return dict(index_topk=max(seen) + 1 if padded else min(seen))


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
    # The engines' row orders (kit.engine.profile.ROW_ORDERS): a case whose rows a decode-first engine
    # reorders runs in both orders, one per engine; in MIXED every case's rows are, elsewhere none's.
    Feature("row_order", (False, True), _reordered, lambda value: {}, dropped=False, sized=False,
            fit=_fit_row_order),
    Feature("window_page_edge", (False, True), _window_page_edge, lambda value: {}, dropped=False, sized=False,
            fit=_fit_window_page_edge),
    # Sparse MLA's index rows (kit.engine.sparse): -1 padding after the indices or among them; a query that
    # sees fewer keys than the top-k (k past its context: every key it sees, the rest -1) or more (a
    # selection, page edges first).
    Feature("index_scatter", (False, True), lambda c: c.index_scatter, lambda value: dict(index_scatter=value),
            tag="scatter"),
    Feature("index_padded", (False, True), _index_padded, lambda value: {}, dropped=False, sized=False,
            fit=_fit_index_padded),
    Feature("seed", (0, 1), lambda c: c.seed, lambda value: dict(seed=value), paired=False, dropped=False),
)


def _with_new(case: RecurrentCase, pick: Callable[[int, int], int]) -> Dict:
    """New lengths pick(prefix, new) for the extend rows (a MIXED case's decode rows keep their one token,
    a verify's drafts are one count for all: no change)."""
    if isinstance(case.new, int):
        return {}
    rows = case.bs - (case.mode.value == "mixed") * case.new.count(1)
    return dict(new=tuple(pick(p, n) if i < rows else n for i, (p, n) in enumerate(zip(case.prefix, case.new))))


def _window_spans_saved(case: RecurrentCase) -> bool:
    """Whether a request continuing a saved state has fewer new rows than its conv window keeps: the window
    it writes back holds saved rows and new ones."""
    return any(p > 0 and n < case.conv_width - 1 for p, n in zip(case.prefix, case.new_lens))


def _fit_window_spans_saved(case: RecurrentCase, spans: bool) -> Dict:
    """Saved requests' extend rows one row short of the window (2: a MIXED extend row stays longer than
    one), or as long as it."""
    keep = case.conv_width - 1
    return _with_new(case, lambda p, n: n if not p else keep - 1 if spans else max(n, keep))


def _fit_chunk_edge(case: RecurrentCase, edge: bool) -> Dict:
    """The first request (an extend row) one token past the chunk, or every request within one."""
    if isinstance(case.new, int) or edge == (max(case.new) > CHUNK):
        return {}
    return dict(new=(CHUNK + 1,) + case.new[1:]) if edge else _with_new(case, lambda p, n: min(n, CHUNK))


def _fit_fresh(case: RecurrentCase, fresh: bool) -> Dict:
    """Every request new (prefix 0), or the first one's state saved."""
    if fresh:
        return dict(prefix=(0,) * case.bs)
    return dict(prefix=(max(case.prefix[0], 1),) + case.prefix[1:])


# The recurrent kinds' features (kit.engine.kinds.recurrent), paired among themselves per mode.
RECURRENT: Tuple[Feature, ...] = (
    Feature("linear_kind", tuple(recurrent.KINDS), lambda c: c.kind, lambda value: {}, dropped=False, sized=False,
            case=RecurrentCase),
    Feature("linear_dtype", recurrent.DTYPES, lambda c: c.dtype, lambda value: dict(dtype=value), paired=False,
            dropped=False, case=RecurrentCase),
    # A batch of new requests only: the engines' kernels then take no initial states at all.
    Feature("fresh", (False, True), lambda c: not any(c.prefix), lambda value: {}, dropped=False, sized=False,
            case=RecurrentCase, tag="fresh", fit=_fit_fresh),
    Feature("window_spans_saved", (False, True), _window_spans_saved, lambda value: {}, dropped=False, sized=False,
            case=RecurrentCase, tag="short",
            fit=_fit_window_spans_saved),
    # A request's new tokens past the kernels' chunk: a second chunk continuing the first's state.
    Feature("chunk_edge", (False, True), lambda c: max(c.new_lens) > CHUNK, lambda value: {}, dropped=False,
            case=RecurrentCase, tag="chunk",
            fit=_fit_chunk_edge),
    # TARGET_VERIFY: a request keeping fewer drafts than it verified (its state rolled back to one).
    Feature("rejected", (False, True), lambda c: c.accepted is not None and min(c.accepted) < c.new, lambda value: {},
            dropped=False, sized=False, case=RecurrentCase, tag="rejected",
            fit=lambda case, value: {} if case.accepted is None else
            dict(accepted=(1 if value else case.new,) + tuple(case.new for _ in case.accepted[1:]))),
)
FEATURES = FEATURES + RECURRENT
BY_NAME = {f.name: f for f in FEATURES}


def features_of(case) -> Tuple[Feature, ...]:
    """The features of the case's own sort (softmax or recurrent)."""
    return tuple(f for f in FEATURES if isinstance(case, f.case))
