"""Sparse MLA's index sets: what the indexer hands attention, drawn by the kit.

Per new token a row of `index_topk` entries: distinct columns of the request's req_to_token row
(its token numbers, as vLLM's FLASHMLA_SPARSE converts them through the block table and SGLang's
DSA backend through its page table), -1 where fewer keys are selected. The engines' indexers select
only within each query's causal view (vLLM's top_k_per_row between each row's start and end, the
rest -1), and neither engine masks an index past it: the converters map any in-table index to its
slot. So the kit draws only what the contract allows: keys the query sees, no duplicates, -1
padding (after the indices, or scattered among them), every key where the query sees no more than
`index_topk` (k larger than its context), and past that keys at page edges (a page's first and last
token, where a wrong page shows) before the rest. The draws follow each request's seed: a request
recurring in another batch selects the same keys.
"""
from __future__ import annotations

from typing import Optional

import torch

PAD = -1  # an index the attention must skip


def select(case, visible: torch.Tensor, seed: int) -> Optional[torch.Tensor]:
    """Per new token (a row of `visible`, bool [n_new, keys]), the indexer's row: int32
    [n_new, index_topk], the selected key columns and PAD. None for a case that is not sparse."""
    k = case.index_topk
    if not k:
        return None
    gen = torch.Generator().manual_seed(seed ^ 0x5A5E)
    columns = torch.arange(visible.shape[1])
    edge = (columns % case.page == 0) | (columns % case.page == case.page - 1)
    rows = torch.full((visible.shape[0], k), PAD, dtype=torch.int32)
    for i, seen in enumerate(visible):
        keys = columns[seen]
        if keys.numel() > k:
            # page edges first (half the row, or as many as the query sees), then any of the rest
            order = torch.randperm(keys.numel(), generator=gen)
            first = edge[keys[order]].nonzero().squeeze(1)[:(k + 1) // 2]
            rest = torch.ones(keys.numel(), dtype=torch.bool)
            rest[first] = False
            keys = torch.cat([keys[order[first]], keys[order[rest.nonzero().squeeze(1)[:k - first.numel()]]]])
        n = keys.numel()
        rows[i, :n] = keys[torch.randperm(n, generator=gen)].to(torch.int32)
        if case.index_scatter:
            rows[i] = rows[i, torch.randperm(k, generator=gen)]
    return rows


def selected(rows: torch.Tensor, keys: int) -> torch.Tensor:
    """bool [rows, keys]: which key columns each row selects (PAD selects none)."""
    mask = torch.zeros(rows.shape[0], keys + 1, dtype=torch.bool)
    mask.scatter_(1, torch.where(rows == PAD, keys, rows).long(), True)  # PAD into a spare column
    return mask[:, :keys]


def batch_indices(plan, device) -> Optional[torch.Tensor]:
    """int32 [num_tokens, index_topk]: the rows of the plan's new tokens in batch order, or None
    for a case that is not sparse (batch.topk_indices)."""
    if not plan.case.index_topk:
        return None
    return torch.cat([r.selected for r in plan.requests]).to(device)
