"""A step described the way engines whose backends build their own metadata describe one (vLLM's
CommonAttentionMetadata): per request its query tokens' offsets, its length after the step, the
tokens cached before it, its pages; per token its KV slot. Rendered from the kit's step
description (kit.engine.plan), never read back from another batch; a backend whose profile's
converter is COMMON (kit.engine.profile) gets it as `batch.common`."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from kit.engine.transfer import to_device


@dataclasses.dataclass
class CommonBatch:
    query_start_loc: torch.Tensor  # [rows + 1] int32: where each request's query tokens start
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor  # [rows] int32: each request's tokens once the step ran (cached + new)
    seq_lens_cpu: torch.Tensor
    num_computed_tokens_cpu: torch.Tensor  # [rows] int32: tokens cached before the step
    block_table: torch.Tensor  # [rows, blocks] int32: each request's page ids, in order
    slot_mapping: torch.Tensor  # [tokens] int64: each token's KV slot (-1: none, under a NO_WRITE profile)
    num_reqs: int
    num_actual_tokens: int  # the real tokens (the rest of slot_mapping is padding)
    max_query_len: int
    max_seq_len: int
    # [rows, state pools] int32: each request's slot in each slot-indexed state pool (a padded
    # request's: -1, none); None for attention whose only state is its KV pages.
    state_slots: Optional[torch.Tensor] = None


def render(plan, slot_mapping: torch.Tensor, req_to_token: torch.Tensor, page: int, rows: Optional[int] = None,
           padded: Tuple[int, int] = (0, 0)) -> CommonBatch:
    """The step `plan` describes (kit.engine.plan), in CommonBatch's terms: its requests, then up to
    `rows` padded ones (a graph's), each `padded` = (cached, new) tokens long and owning row 0 of
    the request pool; each request's pages its row of `req_to_token` (the table the core installed:
    its pages, then unowned ones); per token its KV slot from `slot_mapping` (the batch's, a graph's
    static buffer under graphs, padded past the plan's tokens)."""
    rows = len(plan.requests) if rows is None else rows
    pad = rows - len(plan.requests)
    cached = torch.tensor([r.n_old for r in plan.requests] + [padded[0]] * pad, dtype=torch.int32)
    new = torch.tensor([r.n_new for r in plan.requests] + [padded[1]] * pad, dtype=torch.int32)
    query_start_loc_cpu = torch.cat([new.new_zeros(1), new.cumsum(0, dtype=torch.int32)])
    seq_lens_cpu = cached + new
    device = slot_mapping.device
    request_rows = to_device([r.row for r in plan.requests] + [0] * pad, req_to_token.device, torch.int64)
    block_table = (req_to_token[request_rows][:, ::page] // page).to(torch.int32)
    state = plan.state_slots
    state_slots = None if state is None else to_device(state + [[-1] * len(state[0])] * pad, device, torch.int32)
    return CommonBatch(
        query_start_loc=to_device(query_start_loc_cpu, device), query_start_loc_cpu=query_start_loc_cpu,
        seq_lens=to_device(seq_lens_cpu, device), seq_lens_cpu=seq_lens_cpu, num_computed_tokens_cpu=cached,
        block_table=block_table, slot_mapping=slot_mapping, num_reqs=rows, num_actual_tokens=plan.num_tokens,
        max_query_len=int(new.max()) if rows else 0, max_seq_len=int(seq_lens_cpu.max()) if rows else 0,
        state_slots=state_slots)


def capture_batch(batch, max_query_len: int, max_seq_len: int) -> CommonBatch:
    """What a builder-style engine captures a graph with (vLLM: InputBatch.make_dummy,
    v1/worker/gpu/input_batch.py:135, with the host maxima of prepare_inputs_to_capture): the
    graph's batch_size requests splitting its tokens evenly (the last ones one more), each with
    nothing cached (seq_len = its query tokens), every block table entry the null block 0, and the
    host maxima of the worst replay the graph must serve (`max_query_len` tokens in one request,
    `max_seq_len` in one context), so the kernels it records cover every batch it replays."""
    rows, tokens = batch.batch_size, batch.out_cache_loc.shape[0]
    device = batch.out_cache_loc.device
    new = torch.full((rows,), tokens // rows, dtype=torch.int32)
    new[rows - tokens % rows:] += 1
    query_start_loc_cpu = torch.cat([new.new_zeros(1), new.cumsum(0, dtype=torch.int32)])
    blocks = -(-batch.req_to_token_pool.max_context_len // batch.token_to_kv_pool.page_size)
    return CommonBatch(
        query_start_loc=query_start_loc_cpu.to(device), query_start_loc_cpu=query_start_loc_cpu,
        seq_lens=new.to(device), seq_lens_cpu=new, num_computed_tokens_cpu=torch.zeros_like(new),
        block_table=torch.zeros((rows, blocks), dtype=torch.int32, device=device), slot_mapping=batch.out_cache_loc,
        num_reqs=rows, num_actual_tokens=tokens, max_query_len=max_query_len, max_seq_len=max_seq_len)

