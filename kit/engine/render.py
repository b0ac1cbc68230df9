"""Each engine's batch, rendered from the step description (kit.engine.plan) by the converter the
backend's profile names (kit.engine.profile, EngineProfile.batch). Every converter fills the
ForwardBatch fields (SGLang's batch, in which the graph harness also keeps its static buffers);
COMMON adds the step in vLLM's CommonAttentionMetadata terms (`batch.common`), STEP the
description itself (`batch.step`, what the in-box torch_native reads)."""
from __future__ import annotations

import dataclasses
from typing import List, Sequence

import torch

from kit.engine import common
from kit.engine.batch import ForwardBatch
from kit.engine.modes import rules_for
from kit.engine.plan import BatchPlan
from kit.engine.pools import Pools
from kit.engine.profile import COMMON, STEP, EngineProfile
from kit.engine.sparse import batch_indices
from kit.engine.transfer import to_device


def forward_batch(plan: BatchPlan, pools: Pools, device) -> ForwardBatch:
    """SGLang's ForwardBatch of the step: the common fields, then those the plan's mode fills (over
    a common one where the mode has its own: DRAFT_DECODE's positions, one per lane)."""
    reqs = plan.requests
    seq_lens = [r.seq_len for r in reqs]
    fields = dict(
        forward_mode=plan.case.mode,
        batch_size=len(reqs),
        req_pool_indices=to_device([r.row for r in reqs], device, torch.int32),
        seq_lens=to_device(seq_lens, device, torch.int32),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        seq_lens_sum=sum(seq_lens),
        out_cache_loc=to_device(plan.new_slots, device, torch.int64),
        positions=to_device([p for r in reqs for p in r.q_pos], device, torch.int64),
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.token_to_kv_pool,
        state_slots=None if plan.state_slots is None else to_device(plan.state_slots, device, torch.int32),
        topk_indices=batch_indices(plan, device),
    )
    return ForwardBatch(**{**fields, **rules_for(plan.case.mode).batch_fields(plan, device)})


def render(plan: BatchPlan, pools: Pools, table: torch.Tensor, device, profile: EngineProfile) -> ForwardBatch:
    """The batch the metadata hooks get, in the form the profile's converter gives it; `table`: the
    req_to_token table the pools hold while it runs (kit.engine.fixture.installed)."""
    batch = forward_batch(plan, pools, device)
    if profile.batch == COMMON:
        batch.common = common.render(plan, batch.out_cache_loc, table, plan.case.page)
    elif profile.batch == STEP:
        batch.step = plan
    return batch


def step_views(batch: ForwardBatch, plans: Sequence[BatchPlan]) -> List[ForwardBatch]:
    """What forward() gets in each step of a program over `batch` (its mode's step batches), each
    carrying its own step's description where the batch carries one."""
    views = rules_for(batch.forward_mode).step_batches(batch, len(plans))
    if batch.step is None:
        return views
    return [dataclasses.replace(view, step=plan) for view, plan in zip(views, plans)]
