"""The batch object handed to a backend: the fields of a serving engine's ForwardBatch (SGLang's),
rendered from the kit's step description (kit.engine.render).

dtypes: seq_lens and req_pool_indices int32; out_cache_loc and positions int64.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from kit.modes import ForwardMode
from kit.engine.pools import KVPool, ReqToTokenPool


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """What a serving engine's server config says of speculative decoding, read when the
    backend is built (graph buffers are sized from it)."""

    algorithm: str  # e.g. "EAGLE"
    num_draft_tokens: int  # the draft tokens a request verifies (TARGET_VERIFY's and DRAFT_EXTEND_V2's tokens)
    topk: int  # 1: chain drafts; > 1: tree
    num_steps: int  # the draft model's decoding steps (DRAFT_DECODE's steps; a chain's num_draft_tokens - 1)


@dataclasses.dataclass
class SpecInfo:
    """Speculative-decoding inputs.

    TARGET_VERIFY: custom_mask (bool, True = attend; per request a row-major
    [draft, seq_len + draft] block, blocks concatenated).
    DRAFT_EXTEND_V2: extend_seq_lens_tensor, its host copy extend_seq_lens_cpu (a graph
    runner fills it on the host: reading the tensor back inside a capture is not allowed),
    and num_tokens_per_bs.
    DRAFT_DECODE: num_steps and topk (each request's lanes and their columns), and in the batch
    each step's forward gets, draft_step (which step it is, from 0).
    """

    draft_token_num: int
    topk: int = 1
    custom_mask: Optional[torch.Tensor] = None
    extend_seq_lens_tensor: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    num_tokens_per_bs: Optional[int] = None
    num_steps: Optional[int] = None
    draft_step: Optional[int] = None


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool
    # EXTEND and MIXED; DRAFT_EXTEND_V2's eager batches too (its graph views carry spec_info only)
    extend_num_tokens: Optional[int] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_start_loc: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    # TARGET_VERIFY, DRAFT_EXTEND_V2 and DRAFT_DECODE
    spec_info: Optional[SpecInfo] = None
    # [batch_size, state pools] int32: each request's slot in each slot-indexed state pool (a
    # recurrent state, a convolution window); None for attention whose only state is its KV pages.
    state_slots: Optional[torch.Tensor] = None
    # Sparse MLA: per new token, the indexer's selection (kit.engine.sparse): int32
    # [num_tokens, index_topk], columns of the request's req_to_token row, -1 padded.
    topk_indices: Optional[torch.Tensor] = None
    # What the profile's converter adds (kit.engine.render): the step in vLLM's terms
    # (kit.engine.common.CommonBatch) or the step description itself (kit.engine.plan.BatchPlan: a
    # token graph's batch carries its real requests', its tokens past theirs padding); else None.
    common: Optional[object] = None
    step: Optional[object] = None

    @property
    def num_tokens(self) -> int:
        return self.out_cache_loc.shape[0]
