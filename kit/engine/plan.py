"""The description of a step, per request: the one thing the core builds and judges against.

A plan is pure host data, per its runner mode's rules (kit/engine/modes/): for each request,
which tokens are already cached, which are new (written by this forward), the pages and slot
each token's KV lives in, each new token's position, which keys each query may structurally see
(causal, a draft tree, a draft lane: `visible`; a layer's sliding window is the layer's, applied
on top), and the request's slots in slot-indexed state pools beyond its KV pages. The reference
and the pool checks read it; each engine's batch is rendered from it by the converter the
backend's profile names (kit.engine.render), never read back to learn what the plan says.
"""
from __future__ import annotations

import dataclasses
import random
from typing import List, Optional

import torch

from kit.engine.case import Case
from kit.engine.layouts import place_pages, slots_of
from kit.engine.modes import rules_for
from kit.engine.modes.rules import GraphBuckets
from kit.engine.profile import AS_SCHEDULED
from kit.engine.sparse import select

# Columns of req_to_token past a request's last token still point at poison.
CONTEXT_SLACK = 16


@dataclasses.dataclass(frozen=True)
class RequestData:
    """What a request's inputs are drawn from (kit.engine.inputs): the same seed and token counts
    give the same queries, keys and values in any batch, at any position."""

    seed: int
    n_prefix: int  # tokens whose KV is in the pool before the batch's first step
    n_tokens: int  # tokens it has once every step of the batch ran


@dataclasses.dataclass
class RequestPlan:
    row: int  # req_pool_indices entry (>= 1)
    n_old: int  # tokens whose KV is in the pool before the call
    n_new: int  # tokens this call attends from and writes KV for
    seq_len: int  # seq_lens entry, per the mode's convention
    q_pos: List[int]  # position of each new token
    visible: torch.Tensor  # bool [n_new, n_old + n_new], before the sliding window
    slots: List[int]  # KV slot of each logical token
    parents: List[int]  # TARGET_VERIFY tree: parent draft index, -1 for the root
    pages: List[int] = dataclasses.field(default_factory=list)  # its KV pages, in order (slots lie in them)
    # Its slot in each slot-indexed state pool (a recurrent state, a convolution window), by pool;
    # empty for attention whose only state is its KV pages.
    state_slots: List[int] = dataclasses.field(default_factory=list)
    request: int = 0  # which of the batch's RequestData it is drawn from
    # Its keys' token numbers in that request (cached, then new); None: tokens 0 .. total - 1.
    keys: Optional[List[int]] = None
    # Sparse MLA: per new token, the indexer's row of key columns, -1 padded: int32
    # [n_new, index_topk] (kit.engine.sparse).
    selected: Optional[torch.Tensor] = None

    @property
    def total(self) -> int:
        return self.n_old + self.n_new

    @property
    def key_tokens(self) -> List[int]:
        return list(range(self.total)) if self.keys is None else self.keys

    @property
    def key_pos(self) -> List[int]:
        return list(range(self.n_old)) + self.q_pos


@dataclasses.dataclass
class BatchPlan:
    case: Case
    requests: List[RequestPlan]
    num_slots: int
    max_reqs: int
    max_context: int
    data: List[RequestData] = dataclasses.field(default_factory=list)  # what its requests are drawn from

    @property
    def num_tokens(self) -> int:
        return sum(r.n_new for r in self.requests)

    @property
    def state_slots(self) -> Optional[List[List[int]]]:
        """Each request's slots in the slot-indexed state pools, or None where no request has any."""
        if not any(r.state_slots for r in self.requests):
            return None
        if len({len(r.state_slots) for r in self.requests}) != 1:
            raise ValueError(f"{self.case.name}: every request needs a slot in each state pool")
        return [r.state_slots for r in self.requests]

    @property
    def new_slots(self) -> List[int]:
        """The KV slot of each new token, request by request: where the step writes."""
        return [s for r in self.requests for s in r.slots[r.n_old:]]


def row_order(case: Case, order: str) -> List[int]:
    """The case's rows in the order an engine hands its step (kit.engine.profile.ROW_ORDERS). Decode
    first is vLLM's runner's (reorder_batch_to_split_decodes_and_prefills, v1/attention/backends/utils.py):
    decode rows, then rows with a cached prefix and at most a decode row's tokens, then longer ones
    with a cached prefix, then fresh prompts, each region as listed. Only a ragged step (EXTEND,
    MIXED) has rows of different kinds to order."""
    rules = rules_for(case.mode)
    if order == AS_SCHEDULED or rules.graph is not GraphBuckets.TOKEN_COUNT:
        return list(range(case.bs))
    first_decode, per = case.bs - rules.decode_rows(case), rules.decode_tokens(case)

    def region(i: int) -> int:
        if i >= first_decode:
            return 0
        if case.prefix[i] == 0:
            return 3
        return 1 if case.new_lens[i] <= per else 2
    return sorted(range(case.bs), key=region)


def plan_case(case: Case, order: str = AS_SCHEDULED) -> BatchPlan:
    rng = random.Random(case.rng_seed())
    rules = rules_for(case.mode)
    seeds = [case.request_seed(i) for i in range(case.bs)]
    # Each request's shape from its own seed: a request recurring in another batch is the same request.
    shapes = [rules.request(case, p, n, random.Random(seed)) for p, n, seed in zip(case.prefix, case.new_lens, seeds)]
    pages = place_pages(case.layout, case.page, [(s.n_old, s.n_new) for s in shapes], rng)
    rows = rng.sample(range(1, 2 * case.bs + 2), case.bs)
    requests = [
        RequestPlan(row=row, n_old=s.n_old, n_new=s.n_new, seq_len=s.seq_len, q_pos=s.q_pos, visible=s.visible,
                    parents=s.parents, slots=slots_of(pg, case.page, s.n_old + s.n_new), pages=list(pg), request=i,
                    selected=select(case, s.visible, seed))
        for i, (row, s, pg, seed) in enumerate(zip(rows, shapes, pages, seeds))
    ]
    requests = [requests[i] for i in row_order(case, order)]
    max_page = max((max(pg) for pg in pages if pg), default=0)
    spare_pages = max(4, sum(len(pg) for pg in pages) // 2)  # unowned tail, poisoned
    return BatchPlan(
        case=case,
        requests=requests,
        num_slots=(max_page + 1 + spare_pages) * case.page,
        max_reqs=2 * case.bs + 2,
        max_context=max(r.total for r in requests) + case.page + CONTEXT_SLACK,
        data=[RequestData(seed, s.n_old, s.n_old + s.n_new) for seed, s in zip(seeds, shapes)],
    )
