"""A step described the way engines whose backends build their own metadata describe one (vLLM's
CommonAttentionMetadata): per request its query tokens' offsets, its length after the step, the
tokens cached before it, its pages; per token its KV slot. Derived from a ForwardBatch and its
mode's rules (ModeRules.query_lens), never from a backend; a backend driven in the builder style
(kit.engine.profile.BUILDER) gets it as `batch.common`."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from kit.engine.modes import rules_for


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


def describe(batch, num_actual_tokens: Optional[int] = None, real_rows: Optional[int] = None,
             padded_query_len: Optional[int] = None) -> CommonBatch:
    """The step `batch` is, in CommonBatch's terms: its batch_size requests (a graph's padded rows
    included) and its tokens (`num_actual_tokens` of them real; all of them unless given). Rows
    from `real_rows` on are padded: with `padded_query_len` 0 each is an empty request (no query
    token, no cached one), else they read as their mode gives them."""
    rows = batch.batch_size
    cached, new = rules_for(batch.forward_mode).query_lens(batch)
    cached, new = cached.to(torch.int32), new.to(torch.int32)
    if padded_query_len is not None and real_rows is not None and real_rows < rows:
        cached, new = cached.clone(), new.clone()
        cached[real_rows:] = 0
        new[real_rows:] = padded_query_len
    query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=new.device)
    torch.cumsum(new, dim=0, out=query_start_loc[1:])
    seq_lens = cached + new
    page = batch.token_to_kv_pool.page_size
    r2t = batch.req_to_token_pool.req_to_token
    block_table = (r2t[batch.req_pool_indices[:rows].to(torch.int64)][:, ::page] // page).to(torch.int32)
    host = torch.stack([query_start_loc[1:], seq_lens, cached]).cpu()  # one wait: the host's copies
    return CommonBatch(
        query_start_loc=query_start_loc, query_start_loc_cpu=torch.cat([host.new_zeros(1), host[0]]),
        seq_lens=seq_lens, seq_lens_cpu=host[1], num_computed_tokens_cpu=host[2], block_table=block_table,
        slot_mapping=batch.out_cache_loc, num_reqs=rows,
        num_actual_tokens=batch.out_cache_loc.shape[0] if num_actual_tokens is None else num_actual_tokens,
        max_query_len=int(host[0].diff(prepend=host.new_zeros(1)).max()) if rows else 0,
        max_seq_len=int(host[1].max()) if rows else 0)


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

