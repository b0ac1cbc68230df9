"""Each engine's batch, rendered from the step description (kit.engine.plan) by the converter the
backend's profile names (kit.engine.profile, EngineProfile.batch). Every converter fills the
ForwardBatch fields; COMMON adds the step in vLLM's CommonAttentionMetadata terms (`batch.common`),
STEP the description itself (`batch.step`, what the in-box torch_native reads). Which of a rendered
batch's fields a graph keeps in static buffers, per request or per token, and what a padded row
holds in each (STATIC_FIELDS) is said here too: the graph harness copies what the converter lists,
padded as the profile pads it (kit.harness.static)."""
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
from kit.engine.modes.rules import EXTEND_REQUEST_FIELDS
from kit.engine.sparse import PAD, batch_indices
from kit.engine.transfer import to_device

REQUEST, TOKEN = "request", "token"  # a static field's axis: one entry per request, or per token
# A padded row's value in a static field, where the profile decides it (kit.engine.profile):
# a padded token's KV slot, a padded request's seq_lens entry.
PADDED_SLOT, PADDED_SEQ_LEN = "padded slot", "padded seq_len"


@dataclasses.dataclass(frozen=True)
class StaticField:
    """A field of a rendered batch that a graph keeps in a static buffer (a tensor, or a host list
    rebuilt at each replay), and what its padded rows hold."""

    name: str
    axis: str  # REQUEST or TOKEN
    pad: object  # a value, or PADDED_SLOT / PADDED_SEQ_LEN (the profile's)
    # A ragged batch's per-request lengths: only token-bucket graphs (ragged batches) hold it; a
    # batch-size graph's requests are uniform, its mode's spec_info says their lengths.
    ragged: bool = False


# What a graph holds of a rendered batch (absent fields, None in the batch, get no buffer).
STATIC_FIELDS = (
    StaticField("req_pool_indices", REQUEST, 0),  # padded requests own row 0
    StaticField("seq_lens", REQUEST, PADDED_SEQ_LEN),
    StaticField("seq_lens_cpu", REQUEST, PADDED_SEQ_LEN),
    *(StaticField(name, REQUEST, 0, ragged=True) for name in EXTEND_REQUEST_FIELDS),
    StaticField("extend_seq_lens_cpu", REQUEST, 0, ragged=True),
    StaticField("extend_prefix_lens_cpu", REQUEST, 0, ragged=True),
    StaticField("out_cache_loc", TOKEN, PADDED_SLOT),
    StaticField("positions", TOKEN, 0),  # a padded token sits at position 0
    StaticField("topk_indices", TOKEN, PAD),  # a padded token selects no key
)


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


def graph_batch(forward_mode, batch_size: int, held: dict, pools: Pools, spec_info) -> ForwardBatch:
    """A batch-size graph's batch: its `batch_size` requests (real and padded) over the static
    buffers `held` (views by field name), and its mode's speculative inputs."""
    return ForwardBatch(forward_mode=forward_mode, batch_size=batch_size, **held,
                        seq_lens_sum=seq_lens_sum(held, batch_size), req_to_token_pool=pools.req_to_token_pool,
                        token_to_kv_pool=pools.token_to_kv_pool, spec_info=spec_info)


def seq_lens_sum(held: dict, batch_size: int) -> int:
    """The host sum of a graph batch's seq_lens, padded requests included."""
    return int(held["seq_lens_cpu"][:batch_size].sum())


def step_views(batch: ForwardBatch, plans: Sequence[BatchPlan]) -> List[ForwardBatch]:
    """What forward() gets in each step of a program over `batch` (its mode's step batches), each
    carrying its own step's description where the batch carries one."""
    views = rules_for(batch.forward_mode).step_batches(batch, len(plans))
    if batch.step is None:
        return views
    return [dataclasses.replace(view, step=plan) for view, plan in zip(views, plans)]
