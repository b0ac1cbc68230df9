"""The logical content of a batch, per runner mode (SPEC seq_lens table).

A plan is pure host data: for each request, which tokens are already cached,
which are new (written by this forward), where each token's KV lives, each new
token's position, and which keys each query may structurally see (causal or
tree). The reference is computed from this, never from a backend's metadata.
"""
from __future__ import annotations

import dataclasses
import random
from typing import List, Tuple

import torch

from kit.case import Case
from kit.layouts import place_pages, slots_of
from kit.modes import ForwardMode

# Columns of req_to_token past a request's last token still point at poison.
CONTEXT_SLACK = 16


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

    @property
    def total(self) -> int:
        return self.n_old + self.n_new

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

    @property
    def num_tokens(self) -> int:
        return sum(r.n_new for r in self.requests)


def draft_tree(n: int, topk: int, rng: random.Random) -> List[int]:
    """Parents of a draft tree with node 0 as root; each node has <= topk children.
    topk 1 gives a chain; topk > 1 always branches at the root (nodes 1 and 2)."""
    parents, children = [-1], [0] * n
    for i in range(1, n):
        if topk == 1:
            p = i - 1
        elif i <= 2:
            p = 0
        else:
            p = rng.choice([j for j in range(i) if children[j] < topk])
        parents.append(p)
        children[p] += 1
    return parents


def _ancestry(parents: List[int]) -> torch.Tensor:
    n = len(parents)
    anc = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return anc


def _depths(parents: List[int]) -> List[int]:
    depth: List[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def _causal(n_old: int, n_new: int) -> torch.Tensor:
    q = torch.arange(n_new).unsqueeze(1) + n_old
    k = torch.arange(n_old + n_new).unsqueeze(0)
    return k <= q


def _request(mode: ForwardMode, p: int, n: int, topk: int, rng: random.Random):
    """(n_old, n_new, seq_len, q_pos, visible, parents) per the SPEC table."""
    if mode is ForwardMode.DECODE:
        return p, 1, p + 1, [p], _causal(p, 1), []
    if mode is ForwardMode.EXTEND:
        return p, n, p + n, [p + i for i in range(n)], _causal(p, n), []
    if mode is ForwardMode.TARGET_VERIFY:
        parents = draft_tree(n, topk, rng)
        visible = torch.cat([torch.ones((n, p), dtype=torch.bool), _ancestry(parents)], dim=1)
        return p, n, p, [p + d for d in _depths(parents)], visible, parents
    if mode is ForwardMode.DRAFT_EXTEND_V2:
        return p, n, p + n, [p + i for i in range(n)], _causal(p, n), []
    raise ValueError(mode)


def plan_case(case: Case) -> BatchPlan:
    rng = random.Random(case.rng_seed())
    shapes = [_request(case.mode, p, n, case.topk, rng) for p, n in zip(case.prefix, case.new_lens)]
    old_new: List[Tuple[int, int]] = [(s[0], s[1]) for s in shapes]
    pages = place_pages(case.layout, case.page, old_new, rng)
    rows = rng.sample(range(1, 2 * case.bs + 2), case.bs)
    requests = [
        RequestPlan(row=row, n_old=o, n_new=n, seq_len=sl, q_pos=qp, visible=vis, parents=par,
                    slots=slots_of(pg, case.page, o + n))
        for row, (o, n, sl, qp, vis, par), pg in zip(rows, shapes, pages)
    ]
    max_page = max((max(pg) for pg in pages if pg), default=0)
    spare_pages = max(4, sum(len(pg) for pg in pages) // 2)  # unowned tail, poisoned
    return BatchPlan(
        case=case,
        requests=requests,
        num_slots=(max_page + 1 + spare_pages) * case.page,
        max_reqs=2 * case.bs + 2,
        max_context=max(r.total for r in requests) + case.page + CONTEXT_SLACK,
    )
