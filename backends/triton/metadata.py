"""Metadata buffers and how each batch fills them, with device ops only.

Eager runs allocate buffers sized for the batch; graph runs allocate them once
(`init_cuda_graph_state`) and every capture / replay fills them in place, so
the pointers baked into a captured graph stay valid. The host decides the grids
(Metadata); the fill_* functions are device work of a fixed shape per batch
size, so a graph can record them.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch


BLOCK_M = 64  # query tokens per extend program
MAX_KV_SPLITS = 16
# A decode request gets one KV split per this many keys, at most MAX_KV_SPLITS, whatever its batch. On an
# H100 (32/8 heads of 128, bf16) a decode of 128-key tiles ran from 15% slower (bs 1 x 512 keys: 13.8 against
# 12.0 us) to 29% faster (bs 1 x 1024) than splits capped by the batch size, within 9% from bs 4 to 256.
SPLIT_TOKENS = 128
INTERPRETED_SPLIT_TOKENS = 32  # in Triton's interpreter (CPU): the smoke set's short requests still split
KV_INDICES_BLOCK = 128


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_capacity(num_tokens: int, rows: int) -> int:
    """Query blocks needed by any batch of `rows` requests over `num_tokens` tokens:
    one partial block per request at most, on top of the full ones."""
    return cdiv(num_tokens, BLOCK_M) + rows


@dataclasses.dataclass
class Buffers:
    kv_indptr: torch.Tensor  # [rows + 1] int32: prefix keys (extend) or all keys (decode) per request
    kv_indices: torch.Tensor  # [kv capacity] int32: pool slots
    qo_indptr: torch.Tensor  # [rows + 1] int32
    mask_indptr: torch.Tensor  # [rows + 1] int64: start of each request's custom-mask block
    mask: torch.Tensor  # [mask capacity] uint8: graph runs copy the custom mask here
    num_kv_splits: torch.Tensor  # [rows] int32
    block_ids: torch.Tensor  # [blocks] int64: arange(blocks), made once, the block table's query block ids
    block_req: torch.Tensor  # [blocks] int32: request of each query block, -1 = idle program
    block_start: torch.Tensor  # [blocks] int32: first query (within the request) of each block
    mid_o: torch.Tensor  # [rows, Hq, MAX_KV_SPLITS, D] fp32: split-KV partial outputs
    mid_lse: torch.Tensor  # [rows, Hq, MAX_KV_SPLITS] fp32

    @classmethod
    def allocate(cls, rows: int, num_tokens: int, kv_capacity: int, mask_capacity: int,
                 num_q_heads: int, head_dim: int, device) -> "Buffers":
        def z(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=device)
        blocks = block_capacity(num_tokens, rows)
        return cls(kv_indptr=z(rows + 1), kv_indices=z(max(kv_capacity, 1)), qo_indptr=z(rows + 1),
                   mask_indptr=z(rows + 1, dtype=torch.int64), mask=z(max(mask_capacity, 1), dtype=torch.uint8),
                   num_kv_splits=z(rows), block_ids=torch.arange(blocks, device=device),
                   block_req=z(blocks), block_start=z(blocks),
                   mid_o=z(rows, num_q_heads, MAX_KV_SPLITS, head_dim, dtype=torch.float32),
                   mid_lse=z(rows, num_q_heads, MAX_KV_SPLITS, dtype=torch.float32))


@dataclasses.dataclass
class Metadata:
    """What forward() launches with: the buffers and the host ints that size the grids."""

    bufs: Buffers
    rows: int  # requests the kernels see (extend: the batch plus one dummy request)
    num_blocks: int = 0  # extend grid
    max_splits: int = MAX_KV_SPLITS  # decode grid: every split a request may have (fill_decode)
    mask: Optional[torch.Tensor] = None  # uint8 custom mask the extend kernel reads


def fill_kv(bufs: Buffers, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
            kv_lens: torch.Tensor, lanes: int = 1, lane_width: int = 0, lane_keys: int = 0) -> None:
    """kv_indptr from the per-row key counts, then kv_indices from req_to_token: a row per request,
    its first kv_lens columns; with lanes (a draft decode), `lanes` rows a request, each its
    request's first kv_lens columns then `lane_keys` of its lane's (lane k's from column
    kv_lens + k * lane_width on)."""
    from backends.triton import kernels  # here: a kernel's definition chooses Triton's interpreter
    row_lens = kv_lens if lanes == 1 else kv_lens.repeat_interleave(lanes)
    row_lens = row_lens + lane_keys if lane_keys else row_lens
    rows = row_lens.shape[0]
    torch.cumsum(row_lens, 0, dtype=torch.int32, out=bufs.kv_indptr[1:rows + 1])
    kernels.build_kv_indices_kernel[(rows,)](
        req_to_token, req_pool_indices, kv_lens, bufs.kv_indptr, bufs.kv_indices, req_to_token.stride(0),
        lanes, lane_width, lane_keys, BLOCK=KV_INDICES_BLOCK)


def fill_splits(bufs: Buffers, rows: int, split_tokens: int) -> None:
    """The KV split count of each of the first `rows` rows, one per `split_tokens` of its own keys
    (kv_indptr), at most MAX_KV_SPLITS: never from the batch's size or its other rows, so a row's
    splits, and the order its partial outputs are merged in, are the same in any batch (batch
    invariance)."""
    kv_lens = bufs.kv_indptr[1:rows + 1] - bufs.kv_indptr[:rows]
    bufs.num_kv_splits[:rows].copy_(torch.clamp((kv_lens + split_tokens - 1) // split_tokens, 1, MAX_KV_SPLITS))


def fill_decode(bufs: Buffers, req_to_token, req_pool_indices, seq_lens, split_tokens: int) -> None:
    """Device side of decode metadata: kv_indptr / kv_indices and the split count per request."""
    fill_kv(bufs, req_to_token, req_pool_indices, seq_lens)
    fill_splits(bufs, seq_lens.shape[0], split_tokens)


def fill_draft_step(bufs: Buffers, req_to_token, req_pool_indices, seq_lens, lanes: int, steps: int, step: int,
                    split_tokens: int) -> None:
    """Device side of one draft decode step's metadata: a row a lane (request b, lane k), its keys
    b's committed tokens, then the lane's columns 0..step (req_to_token[row, seq_len + k*steps + j]);
    each row's split count from its own key count."""
    fill_kv(bufs, req_to_token, req_pool_indices, seq_lens, lanes, steps, step + 1)
    fill_splits(bufs, seq_lens.shape[0] * lanes, split_tokens)


def draft_buffers(first: Buffers, steps: int) -> List[Buffers]:
    """One Buffers per draft decode step: `first`, then copies with key lists (kv_indptr,
    kv_indices, split counts) of their own and its split-KV partials (the steps run one after
    another)."""
    return [first] + [dataclasses.replace(first, kv_indptr=torch.zeros_like(first.kv_indptr),
                                          kv_indices=torch.zeros_like(first.kv_indices),
                                          num_kv_splits=torch.zeros_like(first.num_kv_splits))
                      for _ in range(steps - 1)]


def extend_grid(bufs: Buffers, num_tokens: int) -> int:
    """Query blocks of the extend grid: enough for any batch of the buffers' request
    capacity over num_tokens (a graph captured for a token bucket is replayed with
    other request counts)."""
    return block_capacity(num_tokens, bufs.kv_indptr.shape[0] - 1)


def fill_extend(bufs: Buffers, req_to_token, req_pool_indices, prefix_lens, q_lens, num_tokens: int,
                num_blocks: int, with_mask: bool) -> None:
    """Device side of extend metadata: prefix keys from the pool and `q_lens` new tokens
    per request. Tokens past the requests' (graph padding) go to a dummy request on
    row 0 with no prefix, so every query row belongs to some request and qo_indptr
    ends at num_tokens."""
    device = q_lens.device
    dummy_len = (num_tokens - q_lens.sum()).reshape(1).to(torch.int32)
    q_lens = torch.cat([q_lens.to(torch.int32), dummy_len])
    kv_lens = torch.cat([prefix_lens.to(torch.int32), torch.zeros(1, dtype=torch.int32, device=device)])
    rows = q_lens.shape[0]
    dummy_row = torch.zeros(1, dtype=req_pool_indices.dtype, device=device)
    fill_kv(bufs, req_to_token, torch.cat([req_pool_indices, dummy_row]), kv_lens)
    torch.cumsum(q_lens, 0, dtype=torch.int32, out=bufs.qo_indptr[1:rows + 1])
    if with_mask:
        block = q_lens.long() * (kv_lens.long() + q_lens.long())
        torch.cumsum(block, 0, out=bufs.mask_indptr[1:rows + 1])
    fill_blocks(bufs, q_lens, num_blocks)


def fill_blocks(bufs: Buffers, q_lens: torch.Tensor, num_blocks: int) -> None:
    """Block table: query block t -> (request, first query); idle blocks get request -1."""
    per_req = (q_lens.long() + BLOCK_M - 1) // BLOCK_M
    ends = torch.cumsum(per_req, 0)
    t = bufs.block_ids[:num_blocks]
    req = torch.searchsorted(ends, t, right=True)
    idle = req >= q_lens.shape[0]
    req = req.clamp(max=q_lens.shape[0] - 1)
    first = (t - (ends - per_req)[req]) * BLOCK_M
    bufs.block_req[:num_blocks].copy_(torch.where(idle, -1, req))
    bufs.block_start[:num_blocks].copy_(first)
