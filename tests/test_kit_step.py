"""The step description (kit.engine.plan) is what the kit builds and judges against; each engine's
batch is rendered from it by the converter its profile names (kit.engine.render). The converters
agree with each other on every mode, and a converter that renders a batch wrong is judged against
the description, not against itself."""
import dataclasses

import pytest
import torch

from kit.engine import render
from kit.engine.common import render as render_common
from kit.engine.fixture import fixtures_for
from kit.engine.profile import BUILDER, NATIVE, SGLANG, STEP, EngineProfile
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from tests.helpers import small_case
from tests.toys.interleaved import PROFILE as COMMON_PROFILE

CASES = [small_case("dec", ForwardMode.DECODE, (5, 17, 33), page=4),
         small_case("ext", ForwardMode.EXTEND, (3, 0, 20), (4, 9, 1), page=4),
         small_case("mix", ForwardMode.MIXED, (3, 6, 20), (4, 1, 1), page=4),
         small_case("tv", ForwardMode.TARGET_VERIFY, (5, 17), 4, topk=2, steps=2, page=4),
         small_case("dev2", ForwardMode.DRAFT_EXTEND_V2, (5, 17), 3, page=4),
         small_case("dd", ForwardMode.DRAFT_DECODE, (5, 17), 3, page=4)]


def _as_sglang_reads(batch):
    """(cached, new) tokens per request, as docs/contract.md's per-mode table reads a ForwardBatch."""
    mode, seq_lens = batch.forward_mode, batch.seq_lens.tolist()
    if mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
        return batch.extend_prefix_lens.tolist(), batch.extend_seq_lens.tolist()
    if mode is ForwardMode.DECODE:
        return [s - 1 for s in seq_lens], [1] * len(seq_lens)
    spec = batch.spec_info
    if mode is ForwardMode.DRAFT_EXTEND_V2:
        new = spec.extend_seq_lens_tensor.tolist()
        return [s - n for s, n in zip(seq_lens, new)], new
    per_request = spec.draft_token_num if mode is ForwardMode.TARGET_VERIFY else spec.topk * spec.num_steps
    return seq_lens, [per_request] * len(seq_lens)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mode.value)
def test_the_common_description_says_what_the_forward_batch_says(case):
    """vLLM's description of a step, rendered from the plan, and SGLang's ForwardBatch, rendered from
    the same plan, agree request for request: tokens cached and new, lengths, slots, pages."""
    (fx,) = fixtures_for([case], "cpu", None, COMMON_PROFILE)
    batch, common = fx.batch, fx.batch.common
    cached, new = _as_sglang_reads(batch)
    assert common.num_computed_tokens_cpu.tolist() == cached
    assert common.query_start_loc.tolist() == [sum(new[:i]) for i in range(len(new) + 1)]
    assert common.seq_lens.tolist() == [c + n for c, n in zip(cached, new)] == common.seq_lens_cpu.tolist()
    assert common.slot_mapping is batch.out_cache_loc and common.num_actual_tokens == batch.num_tokens
    assert (common.num_reqs, common.max_query_len, common.max_seq_len) == (batch.batch_size, max(new),
                                                                          max(c + n for c, n in zip(cached, new)))
    r2t = batch.req_to_token_pool.req_to_token
    fx.install()
    for i, row in enumerate(batch.req_pool_indices.tolist()):
        pages = fx.plan.requests[i].pages
        assert common.block_table[i, :len(pages)].tolist() == pages
        assert torch.equal(common.block_table[i], (r2t[row, ::case.page] // case.page).to(torch.int32))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mode.value)
def test_each_profile_gets_its_own_converters_batch(case):
    """SGLang's profile: the ForwardBatch alone; the in-box profile: with the step description, each
    step's forward given its own step's (a DRAFT_DECODE step: a request a lane)."""
    (plain,) = fixtures_for([case], "cpu", None, SGLANG)
    assert plain.batch.common is None and plain.batch.step is None
    (native,) = fixtures_for([case], "cpu", None, NATIVE)
    assert native.batch.step is native.plan and native.batch.common is None
    assert [s.batch.step for s in native.steps] == [s.plan for s in native.steps]
    if case.mode is ForwardMode.DRAFT_DECODE:
        assert len(native.steps) == 1 and len(native.steps[0].plan.requests) == case.bs * case.topk


def test_a_profile_names_a_known_converter_and_builder_hooks_need_the_common_one():
    assert "batch must be" in EngineProfile("x", storage=SGLANG.storage, batch="nope").problem()
    assert "set batch='common'" in EngineProfile("x", storage=SGLANG.storage, hooks=BUILDER).problem()
    assert NATIVE.batch == STEP and NATIVE.problem() is None


def test_a_batch_rendered_wrong_is_judged_against_the_description(monkeypatch):
    """Planted converter bug: the ForwardBatch's new-token slots one page off. The backend writes
    where its batch says; the KV check expects the description's slots and sees them unwritten."""
    real = render.forward_batch

    def shifted(plan, pools, device):
        batch = real(plan, pools, device)
        return dataclasses.replace(batch, out_cache_loc=batch.out_cache_loc + plan.case.page)

    monkeypatch.setattr(render, "forward_batch", shifted)
    r = run_case("torch_native", CASES[0], Exec.EAGER)
    assert r.outcome == "fail" and "new-token slots not written correctly" in r.message, r.message


def test_state_slots_travel_from_the_description_into_every_converters_batch():
    """A request's slots in slot-indexed state pools (none today's kinds have) reach SGLang's batch
    and vLLM's description as the plan gives them, a padded request's as -1; a plan without any
    renders None."""
    (fx,) = fixtures_for([CASES[0]], "cpu", None, COMMON_PROFILE)
    assert fx.batch.state_slots is None and fx.batch.common.state_slots is None
    slots = [[7, 2], [3, 9], [5, 4]]
    plan = dataclasses.replace(fx.plan, requests=[dataclasses.replace(r, state_slots=s)
                                                  for r, s in zip(fx.plan.requests, slots)])
    r2t = fx.pools.req_to_token_pool.req_to_token
    assert render.forward_batch(plan, fx.pools, "cpu").state_slots.tolist() == slots
    common = render_common(plan, fx.batch.out_cache_loc, r2t, plan.case.page, rows=4)
    assert common.state_slots.tolist() == slots + [[-1, -1]]
    uneven = dataclasses.replace(plan, requests=plan.requests[:2] + [fx.plan.requests[2]])
    with pytest.raises(ValueError, match="a slot in each state pool"):
        render.forward_batch(uneven, fx.pools, "cpu")
