"""kit.harness.checks catches what it should (and only that), unit by unit and end to end via run_case."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from backends.torch_native import TorchNativeBackend
from kit.engine.case import Case
from kit.engine.layer import Layer
from kit.engine.modes.rules import causal
from kit.modes import Exec, ForwardMode
from kit.engine.pools import CASE_LAYER_ID
from kit.engine.reference import attention
from kit.harness.runner import run_case
from kit.harness.checks import ABS_FLOOR, RATIO, REL_RMS, KVState, check_form, check_kv, check_output, check_padding
from tests.helpers import make_fixture, run_setup, small_case

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
MODULE = "tests.test_kit_verdicts"


def _case(name, mode, prefix, new=1, **kw):
    return small_case(name, mode, prefix, new, head_dim=32, **kw)


DECODE_CASE = _case("verdict_decode", DECODE, (3, 9, 17))
EXTEND_CASE = _case("verdict_extend", EXTEND, (0, 6, 11), (4, 1, 3), page=16)
MODE_CASES = [
    DECODE_CASE,
    EXTEND_CASE,
    _case("verdict_tv", TARGET_VERIFY, (5, 12), 4, topk=2),
    _case("verdict_dev2", DRAFT_EXTEND_V2, (2, 9), 3, layout="non_monotonic_extend"),
]


# ---------------------------------------------------------------- check_output


def _output_inputs(case=EXTEND_CASE):
    fx = make_fixture(case)
    return attention(fx, torch.float64), attention(fx, torch.float32)


def test_output_golden_passes():
    """check_output passes the golden itself and the same-dtype reference, with no bad rows."""
    golden, same = _output_inputs()
    for out in (golden.float(), same):
        chk = check_output(out, golden, same, torch.float32)
        assert chk.ok and chk.bad_rows == [] and chk.nonfinite_rows == 0
        assert chk.max_err <= chk.tol
        assert "output ok" in chk.describe()


def test_output_unwritten_row_is_caught():
    """One NaN row (an unwritten row) fails with nonfinite_rows == 1 and that row reported."""
    golden, same = _output_inputs()
    out = same.clone()
    out[5] = float("nan")
    chk = check_output(out, golden, same, torch.float32)
    assert not chk.ok
    assert chk.nonfinite_rows == 1
    assert chk.bad_rows == [5]
    assert "1 rows NaN" in chk.describe()


def test_output_perturbed_row_is_caught():
    """One fp32 row moved by 1e-2 fails and only that row is reported."""
    golden, same = _output_inputs()
    out = same.clone()
    out[2] += 1e-2
    chk = check_output(out, golden, same, torch.float32)
    assert not chk.ok and chk.bad_rows == [2] and chk.nonfinite_rows == 0
    assert chk.max_err == pytest.approx(1e-2, rel=1e-3)


def test_output_tolerance_is_ratio_times_ref_err_plus_floor():
    """tol == RATIO * max|same_dtype_ref - golden| + ABS_FLOOR[dtype], and the boundary sits exactly there."""
    golden, same = _output_inputs()
    chk = check_output(same, golden, same, torch.float32)
    ref_err = (same.double() - golden).abs().max().item()
    assert chk.ref_err == ref_err
    assert chk.tol == pytest.approx(RATIO * ref_err + ABS_FLOOR[torch.float32], rel=1e-12)
    # Synthetic: the same-dtype reference is off by exactly 1e-3, so tol = 2e-3 + floor. Outputs
    # of magnitude 100 keep the magnitude rule out of the way.
    golden = torch.full((3, 2, 4), 100.0, dtype=torch.float64)
    same = golden.clone()
    same[1, 0, 0] += 1e-3
    tol = RATIO * 1e-3 + ABS_FLOOR[torch.float32]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert check_output(golden, golden, same, dtype).tol == pytest.approx(RATIO * 1e-3 + ABS_FLOOR[dtype])
    inside, outside = golden.clone(), golden.clone()
    inside[2, 1, 3] += 0.99 * tol
    outside[2, 1, 3] += 1.01 * tol
    assert check_output(inside, golden, same, torch.float32).ok
    bad = check_output(outside, golden, same, torch.float32)
    assert not bad.ok and bad.bad_rows == [2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_output_magnitude_rule_boundary(dtype):
    """Per head, RMS(error) <= REL_RMS[dtype] x RMS(golden): a head moved by 0.99 of that passes,
    by 1.01 fails with only its row reported, whatever the absolute floor says."""
    golden = torch.randn(4, 3, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1e-3
    direction = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    direction /= direction.pow(2).mean().sqrt()  # unit RMS

    def moved(fraction):
        out = golden.clone()
        out[2, 1] += fraction * REL_RMS[dtype] * golden[2, 1].pow(2).mean().sqrt() * direction
        return out

    assert check_output(moved(0.99), golden, golden, dtype).ok
    bad = check_output(moved(1.01), golden, golden, dtype)
    assert not bad.ok and bad.bad_rows == [2] and bad.max_err < bad.tol
    assert bad.max_rel == pytest.approx(1.01 * REL_RMS[dtype], rel=1e-9)
    assert "of its output's magnitude" in bad.describe()


def test_a_head_below_the_dtypes_smallest_normal_is_judged_against_that():
    """A head whose golden output is ~1e-9 (a sink taking nearly all of the weight) rounds to 0 in
    fp16: right, though its error is all of its magnitude. Past REL_RMS of the smallest normal
    number, an error in such a head still fails."""
    dtype = torch.float16
    golden = torch.randn(2, 2, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    golden[1, 0] *= 1e-9
    assert check_output(golden.to(dtype).double(), golden, golden, dtype).ok
    tiny = torch.finfo(dtype).tiny
    out = golden.clone()
    out[1, 0] += 1.01 * REL_RMS[dtype] * tiny
    bad = check_output(out, golden, golden, dtype)
    assert not bad.ok and bad.bad_rows == [1], bad.describe()


LONG_DECODE = Case("verdict_long", DECODE, prefix=(1100,), heads=(8, 8), head_dim=128, dtype="bf16")


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_one_key_short_in_a_long_context_is_caught(dtype):
    """Planted bug: decode of 1,101 keys attends 1,100 (the new token missed). In bf16 it moves
    the output by less than the absolute floor, so the ratio rule alone passes it; the
    magnitude rule catches it, while the honest computation (fp32, output rounded) stays
    well inside both."""
    fx = make_fixture(LONG_DECODE.with_(dtype=dtype))
    dt = fx.case.torch_dtype
    golden, same = attention(fx, torch.float64), attention(fx, dt)
    honest = check_output(attention(fx, torch.float32).to(dt), golden, same, dt)
    assert honest.ok and honest.excess < 1 / 3, honest.describe()
    req = fx.plan.requests[0]
    req.visible[:, -1] = False
    short = check_output(attention(fx, torch.float64).to(dt), golden, same, dt)
    assert not short.ok and short.max_rel > short.rel_tol, short.describe()
    if dtype == "bf16":
        assert short.max_err < short.tol  # what the ratio rule alone let through


def test_output_shape_mismatch_is_not_compared():
    """An output of the wrong shape fails without a comparison; the form check says both shapes."""
    golden, same = _output_inputs()
    chk = check_output(same[:-1], golden, same, torch.float32)
    assert not chk.ok and "not compared" in chk.describe()
    form = check_form(same[:-1], same)
    assert not form.ok and f"shape {tuple(same[:-1].shape)}, expected {tuple(golden.shape)}" in form.describe()


# ---------------------------------------------------------------- check_form


def test_form_needs_q_dtype_shape_and_device():
    """The layer takes [T, Hq, D] in q's dtype on q's device: right values in fp32, float64 or
    fp16 for a bf16 q fail, as does an output on another device."""
    q = torch.randn(5, 4, 16).to(torch.bfloat16)
    assert check_form(q.clone(), q).ok and check_form(q.clone(), q).describe() == "output form ok"
    for dtype in (torch.float32, torch.float64, torch.float16):
        chk = check_form(q.to(dtype), q)
        assert not chk.ok and chk.problems == [f"dtype {dtype}, expected torch.bfloat16"]
    chk = check_form(torch.empty(5, 4, 16, dtype=torch.bfloat16, device="meta"), q)
    assert not chk.ok and chk.problems == ["device meta, expected cpu"]


# ---------------------------------------------------------------- check_padding


def test_padding_must_be_finite_and_within_the_pool():
    """Padded rows may hold anything a softmax over the pool could give, nothing else: NaN/inf
    rows and finite rows past the largest |V| in the pool fail, each reported."""
    v_layers = torch.tensor([[[1.0, -3.0]], [[2.0, 0.5]]])
    pool = types.SimpleNamespace(value_bound=lambda: v_layers.abs().max())
    assert check_padding([torch.tensor([[3.0, -3.0]]), torch.tensor([[0.0, 2.9]])], pool).ok
    bad = check_padding([torch.tensor([[0.0, 0.0], [float("nan"), 0.0]]), torch.tensor([[1e4, 0.0], [-3.5, 0.0]])],
                        pool)
    assert not bad.ok and bad.nonfinite_rows == [1] and bad.out_of_range_rows == [2, 3] and bad.bound == 3.0
    assert "not finite" in bad.describe() and "out of range" in bad.describe()


# ---------------------------------------------------------------- check_kv


def _kv_setup(case=EXTEND_CASE):
    fx = make_fixture(case)
    pool = fx.pools.token_to_kv_pool
    return fx, pool, _state(fx, {CASE_LAYER_ID: (fx.k_new, fx.v_new)}), Layer.for_case(case)


def _state(fx, writes):
    """The pool as it must be after a step writing `writes` (the installed fixture's known state)."""
    return KVState(fx.old_slots(), fx.installed_kv(), fx.batch.out_cache_loc, writes)


def _check(fx, pool, state):
    return check_kv(pool, state)


def _unowned_slot(fx):
    owned = {0} | {s for r in fx.plan.requests for s in r.slots}
    return next(s for s in range(fx.pools.token_to_kv_pool.size - 1, 0, -1) if s not in owned)


def test_kv_exact_write_passes():
    """Writing exactly the new k/v at out_cache_loc passes check_kv."""
    fx, pool, before, layer = _kv_setup()
    pool.set_kv_buffer(layer, fx.batch.out_cache_loc, fx.k_new, fx.v_new)
    chk = _check(fx, pool, before)
    assert chk.ok and chk.num_missing == 0 and chk.num_collateral == 0
    assert chk.describe() == "kv pool ok"


def test_kv_no_write_is_all_missing():
    """Writing nothing leaves every new slot missing."""
    fx, pool, before, _ = _kv_setup()
    chk = _check(fx, pool, before)
    assert not chk.ok and chk.num_missing == fx.plan.num_tokens and chk.num_collateral == 0


def test_kv_collateral_write_is_caught():
    """One unowned slot changed on top of a correct write is reported in collateral as (layer, slot)."""
    fx, pool, before, layer = _kv_setup()
    pool.set_kv_buffer(layer, fx.batch.out_cache_loc, fx.k_new, fx.v_new)
    stray = _unowned_slot(fx)
    pool.k_buffer[CASE_LAYER_ID][stray] += 1.0
    chk = _check(fx, pool, before)
    assert not chk.ok
    assert chk.num_missing == 0
    assert chk.num_collateral == 1 and chk.collateral == [(CASE_LAYER_ID, stray)]
    assert "stray writes" in chk.describe()


def test_kv_missing_write_is_caught():
    """One new slot left unwritten is reported in missing."""
    fx, pool, before, layer = _kv_setup()
    loc = fx.batch.out_cache_loc
    pool.set_kv_buffer(layer, loc[1:], fx.k_new[1:], fx.v_new[1:])
    chk = _check(fx, pool, before)
    assert not chk.ok
    assert chk.missing == [(CASE_LAYER_ID, loc[0].item())] and chk.num_missing == 1 and chk.num_collateral == 0
    assert "not written" in chk.describe()


def test_kv_half_written_slot_is_caught():
    """A slot whose K is right but whose V is not is still missing."""
    fx, pool, before, layer = _kv_setup()
    loc = fx.batch.out_cache_loc
    v = fx.v_new.clone()
    v[3] = 0.0
    pool.set_kv_buffer(layer, loc, fx.k_new, v)
    chk = _check(fx, pool, before)
    assert chk.missing == [(CASE_LAYER_ID, loc[3].item())] and chk.num_collateral == 0


def test_kv_write_into_other_layer_is_caught():
    """Writing the new k/v into layer 0 (as well as the case layer) shows as collateral in layer 0."""
    fx, pool, before, layer = _kv_setup()
    loc = fx.batch.out_cache_loc
    pool.set_kv_buffer(layer, loc, fx.k_new, fx.v_new)
    pool.set_kv_buffer(dataclasses.replace(layer, layer_id=0), loc, fx.k_new, fx.v_new)
    chk = _check(fx, pool, before)
    assert not chk.ok and chk.num_missing == 0
    assert chk.num_collateral == loc.numel()
    assert all(lid == 0 for lid, _ in chk.collateral)
    assert sorted(s for _, s in chk.collateral) == sorted(loc.tolist())[:8]


def test_kv_write_only_into_other_layer_is_caught():
    """A backend that ignores layer_id (writes layer 0 only) has every slot missing and stray writes."""
    fx, pool, before, layer = _kv_setup()
    pool.set_kv_buffer(dataclasses.replace(layer, layer_id=0), fx.batch.out_cache_loc, fx.k_new, fx.v_new)
    chk = _check(fx, pool, before)
    assert chk.num_missing == fx.plan.num_tokens and chk.num_collateral == fx.plan.num_tokens


def test_kv_scratch_slot_write_is_ignored():
    """Writes to scratch slot 0 (any layer) are allowed."""
    fx, pool, before, layer = _kv_setup()
    pool.set_kv_buffer(layer, fx.batch.out_cache_loc, fx.k_new, fx.v_new)
    for lid in range(len(pool.k_buffer)):
        pool.k_buffer[lid][0] = 123.0
        pool.v_buffer[lid][0] = float("nan")
    assert _check(fx, pool, before).ok


def test_kv_writes_of_layers_with_a_gap_are_refused():
    """The new k/v are compared for a run of consecutive layers at once: a set with a gap would be
    compared against the wrong layers, so it is refused, not judged."""
    fx, pool, _, _ = _kv_setup()
    writes = {0: (fx.k_new, fx.v_new), 2: (fx.k_new, fx.v_new)}
    with pytest.raises(ValueError, match="consecutive layers, got layers \\[0, 2\\]"):
        check_kv(pool, _state(fx, writes))


# ---------------------------------------------------------------- end to end through run_case


class UnwrittenRowBackend(TorchNativeBackend):
    """Planted bug: the output's row 1 is never written (a fresh torch.empty row)."""

    name = "planted_unwritten_row"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        good, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        out = torch.empty_like(good)
        out[:1] = good[:1]
        out[2:] = good[2:]
        return out, lse


class WrongSlotBackend(TorchNativeBackend):
    """Planted bug: token 0's K/V goes to an unowned slot instead of its out_cache_loc."""

    name = "planted_wrong_slot"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        loc = batch.out_cache_loc.clone()
        loc[0] = pool.size - 1  # past every plan's slots (spare pages, pool rounded up): unowned
        pool.set_kv_buffer(layer, loc, k, v)
        return super().forward(q, k, v, layer, batch, save_kv_cache=False)


class ReadPastSeqLenBackend(TorchNativeBackend):
    """Planted bug: DECODE attends one key past seq_len (kv len + 1 through req_to_token)."""

    name = "planted_read_past"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        past = [dataclasses.replace(r, n_old=r.n_old + 1, q_pos=[p + 1 for p in r.q_pos],
                                    visible=causal(r.n_old + 1, r.n_new)) for r in batch.step.requests]
        batch = dataclasses.replace(batch, step=dataclasses.replace(batch.step, requests=past))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class CrashingBackend(TorchNativeBackend):
    """Planted bug: forward raises."""

    name = "planted_crash"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        raise RuntimeError("planted crash in forward")


@pytest.mark.parametrize("case", MODE_CASES, ids=[c.name for c in MODE_CASES])
def test_run_case_torch_native_passes(case):
    """Control: the unmodified torch_native backend passes eager in every mode."""
    r = run_case("torch_native", case, Exec.EAGER, torch.device("cpu"))
    assert r.outcome == "pass", r.message
    assert r.failure_class is None and r.exec_detail == "eager"
    assert r.max_err <= r.tol


@pytest.mark.parametrize("case", [DECODE_CASE, EXTEND_CASE], ids=["decode", "extend"])
def test_run_case_unwritten_row_is_kernel_failure(case):
    """An output row left unwritten (NaN-filled allocation) fails as 'kernel'."""
    r = run_case(f"{MODULE}:UnwrittenRowBackend", case, Exec.EAGER, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "kernel"), r.message
    assert "1 rows NaN" in r.message and "bad token rows [1]" in r.message
    assert "kv pool ok" in r.message
    assert r.repro.startswith("python -m kit run")
    assert f"{MODULE}:UnwrittenRowBackend" in r.repro and case.name in r.repro


def test_run_case_wrong_slot_is_kv_write_failure():
    """K/V of one token written to a wrong slot fails as 'kv-write' (missing + stray), in each
    of the model's two layers."""
    r = run_case(f"{MODULE}:WrongSlotBackend", DECODE_CASE, Exec.EAGER, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "kv-write"), r.message
    assert "2 new-token slots not written" in r.message and "2 stray writes" in r.message
    assert r.repro.startswith("python -m kit run")


def test_run_case_read_past_seq_len_is_kernel_failure():
    """Reading one token past seq_len hits a poisoned slot and fails as 'kernel' by a wide margin."""
    r = run_case(f"{MODULE}:ReadPastSeqLenBackend", DECODE_CASE, Exec.EAGER, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "kernel"), r.message
    assert "kv pool ok" in r.message
    assert r.max_err > 100 * r.tol  # poison moves the output far past tolerance
    assert r.repro.startswith("python -m kit run")


def test_run_case_exception_is_crash_naming_stage():
    """An exception in forward is a 'crash' whose message names the stage and the error."""
    r = run_case(f"{MODULE}:CrashingBackend", DECODE_CASE, Exec.EAGER, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "crash")
    assert r.message.startswith("forward (layer 0): RuntimeError: planted crash in forward")
    assert "test_kit_verdicts.py" in r.message  # where it happened
    assert r.repro.startswith("python -m kit run")


class WrongShapeBackend(TorchNativeBackend):
    """Planted bug: drops the last token's output row."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out[:-1], lse


class NoOutputBackend(TorchNativeBackend):
    """Planted bug: forgets to return the output."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        super().forward(q, k, v, layer, batch, save_kv_cache)


def test_wrong_shape_and_missing_output_are_verdicts_not_errors():
    """A malformed output is judged (kernel / crash), never an error of the kit itself."""
    case = Case("shape", ForwardMode.EXTEND, prefix=(3, 5), new=(2, 4), head_dim=16, dtype="fp32", heads=(4, 2))
    r = run_case(f"{__name__}:WrongShapeBackend", case, Exec.EAGER)
    # the first batch of the eager sequence (bs 4, 11 of its 12 rows returned) already fails
    assert (r.outcome, r.failure_class) == ("fail", "kernel") and "shape (11, 4, 16), expected (12, 4, 16)" in r.message
    r = run_case(f"{__name__}:NoOutputBackend", case, Exec.EAGER)
    assert (r.outcome, r.failure_class) == ("fail", "crash") and "returned NoneType" in r.message


class Float64OutputBackend(TorchNativeBackend):
    """Planted bug: returns its output in float64 (right values, wrong dtype for the layer)."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out.double(), lse


class OutOfRangePaddingBackend(TorchNativeBackend):
    """Planted bug (EXTEND graph, run piecewise-eager): the padded tokens' rows hold 1e4, finite
    but past every value in the pool (an unnormalized accumulator, memory read as values)."""

    def init_cuda_graph_state(self, max_bs, max_num_tokens) -> None:
        pass

    def init_forward_metadata_capture_cuda_graph(self, *args) -> None:
        pass

    def init_forward_metadata_replay_cuda_graph(self, *args) -> None:
        pass

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        out[batch.extend_num_tokens:] = 1e4
        return out, lse


def test_wrong_dtype_output_is_kernel_failure():
    """An output of right values in the wrong dtype fails as 'kernel', saying so."""
    r = run_case(f"{MODULE}:Float64OutputBackend", EXTEND_CASE, Exec.EAGER, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "kernel"), r.message
    assert "output ok" in r.message and "output form wrong: dtype torch.float64, expected torch.float32" in r.message


def test_out_of_range_padded_rows_are_graph_failure():
    """Finite padded rows past the pool's values fail the replay as 'graph' (real rows are right)."""
    r = run_case(f"{MODULE}:OutOfRangePaddingBackend", EXTEND_CASE, Exec.GRAPH, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "graph"), r.message
    assert "output ok" in r.message and "padded rows out of range" in r.message


def test_a_step_is_read_back_from_the_device_once(monkeypatch):
    """Every layer's output, the KV pool and the guard's canaries of a step are judged from one
    read back: each read back waits for the GPU, a switch between contexts when xdist workers
    share it (the in-box matrix's runs took 0.29 s at 89 waits a run on the H100, 0.15 s at 36)."""
    from kit.harness.verdict import eager_verdict
    from kit.harness.guard import Guard, canary_figures
    fx = make_fixture(EXTEND_CASE)
    pool, loc = fx.pools.token_to_kv_pool, fx.batch.out_cache_loc.long()
    for layer in fx.layers:  # what a right backend writes
        pool.k_buffer[layer.layer_id][loc] = fx.inputs[layer.layer_id].k_new
        pool.v_buffer[layer.layer_id][loc] = fx.inputs[layer.layer_id].v_new
    outs = [[fx.reference(layer.layer_id)[0].to(fx.case.torch_dtype) for layer in fx.layers]]
    guard = Guard()
    with guard.watching():  # what a backend allocates gets a canary, read back with the rest
        torch.empty(4, device=fx.q.device)
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    verdict = eager_verdict(fx, (outs, [[None] * len(fx.layers)]), canary_figures(guard),
                            [[x.handed(fx.case.inputs) for x in fx.inputs]])
    assert verdict.ok, verdict.text
    assert len(fx.layers) > 1 and len(reads) == 1, reads


@pytest.mark.parametrize("backend, exec_, judge, stage", [
    ("torch_native", Exec.EAGER, "eager_verdict", "forward (layers 0-1, on the device)"),
    ("tests.toys.dense:DenseGraphBackend", Exec.GRAPH, "replay_verdict", "replay 1")])
@pytest.mark.parametrize("error, blamed", [("CUDA error: an illegal memory access was encountered", True),
                                           ("a bug in the kit's judge", False)])
def test_a_device_fault_seen_while_judging_is_the_backends(monkeypatch, backend, exec_, judge, stage, error, blamed):
    """The kit does not wait for a step's forward kernels (or a replay's) before judging it (the
    judge's read back is the wait): a device fault they caused surfaces there and is the backend's
    crash, in the step that launched them; any other error while judging is the kit's own, raised
    as it is."""
    import kit.harness.runner

    def failing(*args):
        raise RuntimeError(error)
    monkeypatch.setattr(kit.harness.runner, judge, failing)
    if not blamed:
        with pytest.raises(RuntimeError, match="a bug in the kit"):
            run_case(backend, DECODE_CASE, exec_, torch.device("cpu"))
        return
    r = run_case(backend, DECODE_CASE, exec_, torch.device("cpu"))
    assert r.failure_class == "crash" and r.device_lost, r
    assert r.message.startswith(f"{stage}: RuntimeError: CUDA error: an illegal"), r.message


def test_an_eager_step_waits_for_the_device_once_before_its_read_back(monkeypatch):
    """After the metadata (its faults are its own), nothing waits for the device until the judge
    reads the step back: each wait is a switch between contexts when workers share the GPU."""
    import kit.harness.fault
    from kit.harness.protocol import BackendContext
    setup = run_setup(DECODE_CASE, backend_cls=TorchNativeBackend)
    fx = setup.case_fixture
    backend = TorchNativeBackend(BackendContext.for_case(DECODE_CASE, fx.pools, torch.device("cpu")))
    waits = []
    monkeypatch.setattr(kit.harness.fault, "device_done", lambda: waits.append(1))
    assert setup.eager(backend, fx).ok
    assert len(waits) == 1, waits



class RaisesAfterLaunching(TorchNativeBackend):
    """Fails in forward after launching work whose (asynchronous) fault nothing waited for."""

    launched = []

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        self.launched.append(layer.layer_id)
        raise ValueError("a shape the backend did not expect")


def test_a_device_fault_left_behind_by_a_failed_run_is_that_runs(monkeypatch):
    """A run that ends in an exception before the kit waits for its kernels leaves their fault
    pending; the wait at the run's end reports it on that run (the device is lost: its worker
    ends), not on the next run of the process, which did nothing wrong."""
    import kit.harness.fault

    real = kit.harness.fault.device_done

    def waits():
        if RaisesAfterLaunching.launched:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")
        real()
    monkeypatch.setattr(kit.harness.fault, "device_done", waits)
    RaisesAfterLaunching.launched.clear()
    r = run_case(f"{MODULE}:RaisesAfterLaunching", DECODE_CASE, Exec.EAGER, torch.device("cpu"))
    assert r.failure_class == "crash" and r.device_lost, r
    assert r.message.startswith("forward (layer 0): ValueError: a shape"), r.message
    assert r.message.endswith("; then the device reported: CUDA error: an illegal memory access was encountered"), \
        r.message


def test_a_device_fault_after_a_passing_runs_checks_is_that_runs(monkeypatch):
    """Work a backend queues on a stream the judge's read back does not wait for can fault after
    every check passed: the run's last wait (for the whole device) reports it on that run."""
    import sys
    import kit.harness.fault

    real_wait = kit.harness.fault.device_done

    def waits():  # the fault is pending once the last step is judged: only the run's last wait sees it
        if sys._getframe(1).f_code.co_name == "_late_device_fault":
            raise RuntimeError("CUDA error: an illegal instruction was encountered\nmore lines")
        real_wait()
    monkeypatch.setattr(kit.harness.fault, "device_done", waits)
    r = run_case("torch_native", DECODE_CASE, Exec.EAGER, torch.device("cpu"))
    assert r.outcome == "fail" and r.failure_class == "crash" and r.device_lost, r
    assert r.message == "every check passed, then the device reported: CUDA error: an illegal instruction was " \
                        "encountered", r.message


def test_a_device_fault_seen_in_the_kits_own_code_loses_the_device(monkeypatch):
    """A sticky fault reported while the kit builds a run (its batches, its reference) is a lost
    device, said as such: the process ends (its later runs would all fail) rather than leaving a
    run without a verdict and blaming the next one's backend."""
    import kit.harness.runner

    def faulted(*args):
        raise RuntimeError("CUDA error: an illegal instruction was encountered")
    monkeypatch.setattr(kit.harness.runner, "fixtures_for", faulted)
    r = run_case("torch_native", DECODE_CASE, Exec.EAGER, torch.device("cpu"))
    assert r.failure_class == "crash" and r.device_lost, r
    assert r.message.startswith("the device faulted (seen in the kit's own code): RuntimeError: CUDA error: an "
                                "illegal instruction"), r.message


class DeclinesEveryCase(TorchNativeBackend):
    @classmethod
    def supports(cls, case):
        return "declines every case"


def test_a_quarantined_run_its_backend_declines_is_not_sent_to_a_subprocess(monkeypatch):
    """Whether the backend takes the case is known without running it: a quarantined run it
    declines is recorded here as unsupported (a subprocess would cost its start for nothing)."""
    import kit.harness.isolate
    from kit.harness.run import Run

    started = []
    monkeypatch.setattr(kit.harness.isolate.subprocess, "run", lambda cmd, **kw: started.append(cmd) or
                        types.SimpleNamespace(returncode=3, stdout="", stderr="planted"))
    r = kit.harness.isolate.run_quarantined(Run(f"{MODULE}:DeclinesEveryCase", "declines", DECODE_CASE, Exec.GRAPH))
    assert (r.outcome, r.message, r.isolated, r.backend) == ("unsupported", "declines every case", False, "declines"), r
    assert started == []
    for spec in ("torch_native", "no.such.module:Backend"):  # one it takes; one that does not load here
        r = kit.harness.isolate.run_quarantined(Run(spec, spec, DECODE_CASE, Exec.EAGER))
        assert r.isolated and "exit code 3" in r.message, r
    assert len(started) == 2, started


def test_loading_the_backend_waits_for_no_device(monkeypatch):
    """Loading a backend, its capabilities and its versions launch no device work: each wait is
    a switch between contexts when workers share the GPU, so the first is supports()'s."""
    import sys
    import kit.harness.fault

    stages = []
    monkeypatch.setattr(kit.harness.fault, "device_done",
                        lambda: stages.append(sys._getframe(1).f_locals.get("stage", "the run's end")))
    assert run_case("torch_native", DECODE_CASE, Exec.EAGER, torch.device("cpu")).outcome == "pass"
    assert stages[0] == "supports()" and "loading backend" not in stages and "versions()" not in stages, stages
