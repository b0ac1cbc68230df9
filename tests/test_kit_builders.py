"""The kit's fixture builders obey the SPEC seq_lens table, in every mode and layout."""
from __future__ import annotations

import pytest
import torch

from cases import CATALOG
from kit.engine.case import LAYOUTS
from kit.modes import Exec, ForwardMode
from kit.engine.pools import CASE_LAYER_ID
from kit.report.record import PASS
from kit.harness.runner import run_case
from tests.helpers import make_fixture, small_case

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2




BASE_CASES = [
    small_case("dec_p1_ragged", DECODE, (0, 5, 17, 2)),
    small_case("dec_p16_zero", DECODE, (0, 15, 16, 33), page=16),
    small_case("ext_p1_ragged", EXTEND, (0, 7, 20), (1, 5, 18)),
    small_case("ext_p16_ragged", EXTEND, (0, 16, 3), (17, 1, 30), page=16),
    small_case("tv_chain_p1", TARGET_VERIFY, (0, 9, 20), 4),
    small_case("tv_chain_p16", TARGET_VERIFY, (15, 0, 16), 3, page=16),
    small_case("tv_tree_p1", TARGET_VERIFY, (0, 9, 20), 5, topk=2),
    small_case("tv_tree_p16", TARGET_VERIFY, (31, 2), 6, topk=2, page=16),
    small_case("dev2_p1", DRAFT_EXTEND_V2, (0, 6, 19), 3),
    small_case("dev2_p16", DRAFT_EXTEND_V2, (14, 0, 30), 4, page=16),
]
CASES = [c.with_(name=f"{c.name}_{lay}", layout=lay) for c in BASE_CASES for lay in LAYOUTS]


def _ids(cases):
    return [c.name for c in cases]


def _only(mode):
    return [c for c in CASES if c.mode is mode]


def expected_seq_lens(case):
    """The SPEC table, from the case alone."""
    if case.mode is DECODE:
        return [p + 1 for p in case.prefix]
    if case.mode is TARGET_VERIFY:
        return list(case.prefix)
    return [p + n for p, n in zip(case.prefix, case.new_lens)]  # EXTEND, DRAFT_EXTEND_V2 (bumped)


def new_token_columns(case, seq_len, prefix, n_new):
    """req_to_token columns of a request's new tokens, per the SPEC table."""
    if case.mode is DECODE:
        return [seq_len - 1]
    if case.mode is EXTEND:
        return list(range(prefix, seq_len))
    if case.mode is TARGET_VERIFY:
        return list(range(seq_len, seq_len + n_new))
    return list(range(prefix, prefix + n_new))


def tree_depths(parents):
    depths = []
    for p in parents:
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


def ancestors_and_self(parents, i):
    seen = set()
    while i >= 0:
        seen.add(i)
        i = parents[i]
    return seen


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_seq_lens_follow_mode_table(case):
    """seq_lens per mode: DECODE prefix+1, EXTEND prefix+extend, TARGET_VERIFY prefix, DRAFT_EXTEND_V2 prefix+drafts."""
    b = make_fixture(case).batch
    assert b.forward_mode is case.mode
    assert b.batch_size == case.bs
    assert b.seq_lens.dtype == torch.int32
    assert b.seq_lens.tolist() == expected_seq_lens(case)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_seq_lens_cpu_and_sum(case):
    """seq_lens_cpu is a CPU copy of seq_lens and seq_lens_sum is a Python int equal to their sum."""
    b = make_fixture(case).batch
    assert b.seq_lens_cpu.device.type == "cpu"
    assert b.seq_lens_cpu.tolist() == b.seq_lens.tolist()
    assert type(b.seq_lens_sum) is int
    assert b.seq_lens_sum == sum(expected_seq_lens(case))


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_req_pool_indices_real_and_distinct(case):
    """req_pool_indices are int32, all >= 1 (row 0 is the dummy request) and distinct."""
    b = make_fixture(case).batch
    rows = b.req_pool_indices.tolist()
    assert b.req_pool_indices.dtype == torch.int32
    assert min(rows) >= 1
    assert len(set(rows)) == len(rows)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_out_cache_loc_is_req_to_token_of_new_columns(case):
    """out_cache_loc equals req_to_token[row, new-token columns] with the columns the SPEC table names."""
    fx = make_fixture(case)
    b = fx.batch
    r2t = b.req_to_token_pool.req_to_token
    assert b.out_cache_loc.dtype == torch.int64
    expected = []
    for row, seq_len, prefix, n_new in zip(b.req_pool_indices.tolist(), b.seq_lens.tolist(), case.prefix,
                                           case.new_lens):
        expected += r2t[row, new_token_columns(case, seq_len, prefix, n_new)].tolist()
    assert b.out_cache_loc.tolist() == expected
    assert b.num_tokens == sum(case.new_lens)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_real_slots_outside_scratch_page(case):
    """Every slot of a real token (cached or new) is >= page_size, so never in the scratch page."""
    fx = make_fixture(case)
    r2t = fx.batch.req_to_token_pool.req_to_token
    for req in fx.plan.requests:
        slots = r2t[req.row, :req.total].tolist()
        assert slots == req.slots
        assert min(slots) >= case.page
    assert min(fx.batch.out_cache_loc.tolist()) >= case.page


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_positions_per_mode(case):
    """positions: DECODE seq_len-1, EXTEND/DRAFT_EXTEND_V2 prefix+arange, TARGET_VERIFY seq_len+tree depth."""
    fx = make_fixture(case)
    b = fx.batch
    assert b.positions.dtype == torch.int64
    expected = []
    for req, seq_len, prefix, n_new in zip(fx.plan.requests, b.seq_lens.tolist(), case.prefix, case.new_lens):
        if case.mode is DECODE:
            expected += [seq_len - 1]
        elif case.mode is TARGET_VERIFY:
            depths = tree_depths(req.parents)
            if case.topk == 1:
                assert depths == list(range(n_new))  # chain => seq_len + arange
            expected += [seq_len + d for d in depths]
        else:
            expected += [prefix + i for i in range(n_new)]
    assert b.positions.tolist() == expected


@pytest.mark.parametrize("case", _only(EXTEND), ids=_ids(_only(EXTEND)))
def test_extend_fields(case):
    """EXTEND carries extend_prefix_lens/extend_seq_lens (device and cpu), extend_num_tokens and extend_start_loc."""
    b = make_fixture(case).batch
    assert b.extend_seq_lens.tolist() == list(case.new_lens)
    assert b.extend_seq_lens_cpu == list(case.new_lens)
    assert b.extend_prefix_lens.tolist() == list(case.prefix)
    assert b.extend_prefix_lens_cpu == list(case.prefix)
    assert b.extend_num_tokens == sum(case.new_lens) == b.num_tokens
    starts = [sum(case.new_lens[:i]) for i in range(case.bs)]
    assert b.extend_start_loc.tolist() == starts
    assert (b.seq_lens - b.extend_seq_lens).tolist() == list(case.prefix)
    assert b.spec_info is None


@pytest.mark.parametrize("case", _only(DRAFT_EXTEND_V2), ids=_ids(_only(DRAFT_EXTEND_V2)))
def test_draft_extend_v2_fields(case):
    """DRAFT_EXTEND_V2 carries extend_seq_lens_tensor and num_tokens_per_bs; seq_lens - extend_seq_lens == prefix."""
    b = make_fixture(case).batch
    si = b.spec_info
    assert si is not None and si.draft_token_num == case.new
    assert si.extend_seq_lens_tensor.tolist() == [case.new] * case.bs
    assert si.num_tokens_per_bs == case.new
    assert (b.seq_lens - si.extend_seq_lens_tensor).tolist() == list(case.prefix)
    assert b.num_tokens == case.new * case.bs


@pytest.mark.parametrize("case", _only(TARGET_VERIFY), ids=_ids(_only(TARGET_VERIFY)))
def test_target_verify_custom_mask(case):
    """custom_mask is bool, sum(draft*(seq_len+draft)) long, prefix columns all True, drafts see ancestors+self."""
    fx = make_fixture(case)
    b = fx.batch
    draft = case.new
    mask = b.spec_info.custom_mask
    assert b.spec_info.draft_token_num == draft and b.spec_info.topk == case.topk
    assert mask.dtype == torch.bool
    seq_lens = b.seq_lens.tolist()
    assert mask.numel() == sum(draft * (s + draft) for s in seq_lens)
    start = 0
    positions = b.positions.tolist()
    for r, (req, s) in enumerate(zip(fx.plan.requests, seq_lens)):
        block = mask[start:start + draft * (s + draft)].view(draft, s + draft)
        start += draft * (s + draft)
        assert block[:, :s].all(), "prefix columns must all be True"
        drafts = block[:, s:]
        if case.topk == 1:
            assert torch.equal(drafts, torch.ones(draft, draft, dtype=torch.bool).tril())
        parents = req.parents
        assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
        pos = positions[r * draft:(r + 1) * draft]
        assert pos[0] == s
        for i in range(draft):
            seen = set(drafts[i].nonzero().squeeze(1).tolist())
            assert seen == ancestors_and_self(parents, i), f"draft {i} of request {r}"
            if i:
                assert pos[i] == pos[parents[i]] + 1
        children = [parents.count(i) for i in range(draft)]
        assert max(children) <= case.topk
        if case.topk == 2:
            assert max(children) == 2, "a topk-2 tree must branch somewhere"
    assert start == mask.numel()


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_dummy_row_zero_after_install(case):
    """After install(), req_to_token row 0 (the dummy request) is all zeros."""
    fx = make_fixture(case)
    r2t = fx.batch.req_to_token_pool.req_to_token
    assert r2t.dtype == torch.int32
    assert (r2t[0] == 0).all()
    assert fx.pools.token_to_kv_pool.page_size == case.page


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_kv_and_q_not_constant(case):
    """q, new K/V and cached K/V are random (not constant) and the cached K/V are installed at their slots."""
    fx = make_fixture(case)
    for name in ("q", "k_new", "v_new"):
        t = getattr(fx, name)
        assert t.dtype == case.torch_dtype
        assert t.std().item() > 0.1, name
    n_old = sum(case.prefix)
    assert fx.inputs[CASE_LAYER_ID].k_old.shape[0] == fx.inputs[CASE_LAYER_ID].v_old.shape[0] == n_old
    if n_old > 1:
        assert fx.inputs[CASE_LAYER_ID].k_old.std().item() > 0.1 and fx.inputs[CASE_LAYER_ID].v_old.std().item() > 0.1
        assert not torch.equal(fx.inputs[CASE_LAYER_ID].k_old, fx.inputs[CASE_LAYER_ID].v_old)
    k_buf, v_buf = fx.pools.token_to_kv_pool.get_kv_buffer(CASE_LAYER_ID)
    old_slots = torch.tensor([s for r in fx.plan.requests for s in r.slots[:r.n_old]], dtype=torch.int64)
    assert torch.equal(k_buf[old_slots], fx.inputs[CASE_LAYER_ID].k_old)
    assert torch.equal(v_buf[old_slots], fx.inputs[CASE_LAYER_ID].v_old)
    for req, (k, v) in zip(fx.plan.requests, fx.logical_kv()):
        assert k.shape[0] == v.shape[0] == req.total


def test_a_backend_writing_its_inputs_changes_no_other_run():
    """A batch's inputs and references are built once per process and shared by every run of it
    (kit.engine.fixture); each run's forward() gets copies, so a backend that writes its arguments
    fails on what it wrote (and only that: its output and KV writes are judged on what it was
    given), and the next run of the batch gets the batch as built."""
    case = CATALOG.cases("smoke", ForwardMode.DECODE)[0]
    first = run_case("tests.toys.scribbling:ScribblingBackend", case, Exec.EAGER)
    after = run_case("torch_native", case, Exec.EAGER)
    assert (first.outcome, first.failure_class) == ("fail", "kernel"), first.message
    assert "output ok" in first.message and "kv pool ok" in first.message, first.message
    assert "q passed to forward was changed in place" in first.message, first.message
    assert after.outcome == PASS, after.message


def test_to_device_keeps_values_and_does_not_wait_for_the_gpu():
    """kit.engine.transfer: host values reach the device as given, without waiting for the GPU (each wait
    is a context switch when xdist workers share it); to the host it waits (else the values are
    not there yet)."""
    from kit.engine.transfer import to_device
    assert to_device([3, 1, 2], "cpu", torch.int32).tolist() == [3, 1, 2]
    if not torch.cuda.is_available():
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu = to_device([3, 1, 2], "cuda", torch.int32)
        with pytest.raises(RuntimeError):
            torch.tensor([3, 1, 2], device="cuda")  # what it replaces: this one waits
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert on_gpu.dtype == torch.int32 and to_device(on_gpu, "cpu").tolist() == [3, 1, 2]
