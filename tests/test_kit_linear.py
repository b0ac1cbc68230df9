"""The recurrent kinds (GDN, Mamba2): the reference, the state pools' check (each rule proven by a
planted bug), the in-box backend on every smoke case (the mutants of tests/mutants/linear.py: tests/test_mutants.py)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends.torch_native_linear import TorchNativeLinearBackend
from cases.linear import FULL, SMOKE
from kit.engine import pairs
from kit.engine.kinds.recurrent import GRAPH_MODES, KINDS, MODES
from kit.engine.recurrent_step import build
from kit.engine.recurrent_reference import run_request
from kit.engine.state_pool import StatePool
from kit.harness.recurrent import _expected, failures, run_case
from kit.harness.state_checks import check_states
from kit.modes import Exec, ForwardMode
from tests.mutants.linear import RollbackOffByOne

REPO = Path(__file__).resolve().parent.parent
LINEAR = "backends.torch_native_linear:TorchNativeLinearBackend"

RUNS = [(c, e) for c in SMOKE if not c.layer_pattern for e in Exec if e == Exec.EAGER or c.mode in GRAPH_MODES]


@pytest.mark.parametrize("case,exec_", RUNS, ids=[f"{c.name}-{e.value}" for c, e in RUNS])
def test_in_box_backend_passes(case, exec_):
    assert failures(run_case(TorchNativeLinearBackend, case, exec_)) is None


def test_reference_continues_a_saved_state():
    """Two chunks, the second from the first's state and window, give the one chunk's outputs and state."""
    fx = build(SMOKE[2], "cpu")
    layer, start = fx.layers[1], fx.starts[1][0]
    rows, a, b = (torch.randn(9, n, dtype=torch.float64) for n in (fx.case.conv_dim, 2, 2))
    whole = run_request(layer, rows, (a, b), start.window, start.state)
    first = run_request(layer, rows[:4], (a[:4], b[:4]), start.window, start.state)
    second = run_request(layer, rows[4:], (a[4:], b[4:]), first.windows[-1], first.states[-1])
    torch.testing.assert_close(torch.cat([first.out, second.out]), whole.out, rtol=0, atol=1e-12)
    torch.testing.assert_close(second.states[-1], whole.states[-1], rtol=0, atol=1e-12)
    assert torch.equal(second.windows[-1], whole.windows[-1])


def _stepped(case):
    """A step the in-box backend ran right: (fixture, pool, what the pools held before it)."""
    fx = build(case, "cpu")
    pool = StatePool(fx.geometry, fx.torch_dtype, "cpu")
    pool.reset()
    fx.install(pool)
    before = {n: b.clone() for n, b in pool.buffers.items()}
    backend = TorchNativeLinearBackend(type("Ctx", (), {"state_pool": pool}))
    batch, inputs = fx.batch("cpu")
    backend.init_forward_metadata(batch)
    for x, layer in zip(inputs, fx.layers):
        backend.forward(*x.handed(), layer, batch)
    assert check_states(pool, before, _expected(fx), fx.torch_dtype).ok
    return fx, pool, before


@pytest.mark.parametrize("plant,expect", [
    (lambda fx, pool: pool.temporal(1)[fx.slots[0]].mul_(1.05), "states not the reference's"),
    (lambda fx, pool: pool.conv(0)[fx.slots[1], 3, 0].add_(1.0), "states not the reference's"),
    (lambda fx, pool: pool.temporal(0)[0].zero_(), "stray writes, e.g. temporal layer 0 slot 0"),
    (lambda fx, pool: pool.buffers["conv"][1, -1].zero_(), "the tail past the last slot"),
], ids=["state_off_by_5_percent", "one_window_value", "free_slot_written", "tail_written"])
def test_state_check_catches(plant, expect):
    fx, pool, before = _stepped(SMOKE[0])
    plant(fx, pool)
    check = check_states(pool, before, _expected(fx), fx.torch_dtype)
    assert not check.ok and expect in check.describe()


def test_verify_leaves_the_slot_and_writes_every_draft():
    """A verify's entries are the intermediate pools' (batch position, draft) and the slots' conv windows
    (slid over the drafts); the slots' own state is judged unchanged."""
    fx, pool, before = _stepped(next(c for c in SMOKE if c.mode == ForwardMode.TARGET_VERIFY))
    pool.temporal(1)[fx.slots[0]].add_(1.0)
    check = check_states(pool, before, _expected(fx), fx.torch_dtype)
    assert not check.ok and f"temporal layer 1 slot {fx.slots[0]}" in check.describe()
    drafts = {(e.name, e.index) for e in _expected(fx) if e.name.startswith("intermediate")}
    assert drafts == {(name, (i, j)) for name in ("intermediate_conv", "intermediate_ssm")
                      for i in range(fx.case.bs) for j in range(fx.case.new)}
    assert {(e.name, e.index) for e in _expected(fx) if not e.name.startswith("intermediate")} == {
        ("conv", (slot,)) for slot in fx.slots}


def test_the_decode_after_a_verify_continues_from_the_kept_draft():
    """Drafts' states kept one off: the verify's outputs are right (its states are not), and the
    decode after it, each request continuing from the draft it keeps, has wrong outputs too."""
    case = next(c for c in SMOKE if c.mode == ForwardMode.TARGET_VERIFY)
    verify, after = run_case(RollbackOffByOne, case, Exec.EAGER)
    assert [c.ok for c in verify.checks[:2]] == [True, True] and not verify.ok  # both layers' outputs; the states
    assert not after.checks[0].ok and not after.checks[1].ok, after.text


def _gaps(cases, dtypes=True):
    """Per kind, what its cases leave out: a mode, a new request beside a saved one, and (`dtypes`)
    fp32 or a half dtype."""
    found = []
    for kind in KINDS:
        mine = [c for c in cases if c.kind == kind]
        found += [f"{kind} {m.value}" for m in MODES if not any(c.mode == m for c in mine)]
        found += [f"{kind} {d}" for d, has in (("fp32", lambda c: c.dtype == "fp32"),
                                              ("a half dtype", lambda c: c.dtype != "fp32"))
                  if dtypes and not any(map(has, mine))]
        if not any(0 in c.prefix and any(c.prefix) for c in mine):
            found.append(f"{kind}: a new request beside a saved one")
    return found


# The full set runs the models' dtypes (bf16, with an fp32 or fp16 case where a kind has one).
@pytest.mark.parametrize("cases,dtypes", [(SMOKE, True), (FULL, False)], ids=["smoke", "full"])
def test_every_kind_reaches_every_mode(cases, dtypes):
    assert not _gaps(cases, dtypes), _gaps(cases, dtypes)


def test_a_gap_in_the_cases_is_named():
    left = [c for c in SMOKE if not (c.kind == "kda" and c.mode == ForwardMode.MIXED)]
    assert _gaps(left) == ["kda mixed"]


def _probe(mode) -> pairs.Probe:
    return pairs.probe_for([c for c in SMOKE + FULL if c.mode == mode], SMOKE + FULL)


@pytest.mark.parametrize("cases", [SMOKE, FULL], ids=["smoke", "full"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_pair_of_recurrent_feature_values(cases, mode):
    """Every pair of the recurrent features' values a case of the mode can have (kit.engine.features: kind,
    a batch of new states only, a saved window spanning new rows, a second chunk, a rejected draft) is some
    case's, per set; the gaps are named with cases that reach them."""
    probe = _probe(mode)
    gaps = pairs.missing([c for c in cases if c.mode == mode], probe)
    proposals = [{k: v for k, v in values.items() if v != pairs.BY_NAME[k].values[0]}
                 for values, _ in pairs.covering(gaps, probe)]
    assert not gaps, f"{', '.join(map(pairs.describe, gaps))}; add to cases/linear.py cases with {proposals}"


@pytest.mark.parametrize("mode, pair", [
    (ForwardMode.DECODE, (("linear_kind", "kda"), ("fresh", True))),
    (ForwardMode.EXTEND, (("linear_kind", "mamba2"), ("chunk_edge", True))),
    (ForwardMode.MIXED, (("fresh", False), ("window_spans_saved", False))),
    (ForwardMode.TARGET_VERIFY, (("linear_kind", "gdn"), ("rejected", False))),
], ids=lambda v: v.value if isinstance(v, ForwardMode) else pairs.describe(v))
def test_the_pairs_check_requires_each_recurrent_feature(mode, pair):
    """A set without the pair fails the check, naming it, with a case that reaches it."""
    probe = _probe(mode)
    without = [c for c in SMOKE if c.mode == mode and set(pair) - set(pairs.values_of(c))]
    gaps = pairs.missing(without, probe)
    assert pair in gaps
    proposed = [values for values, reached in pairs.covering(gaps, probe) if pair in reached]
    assert proposed and all(pairs.BY_NAME[name].of(probe.case(proposed[0])) == value for name, value in pair)


def test_command_line_fails_a_mutant(capsys):
    from kit.harness.recurrent import main

    assert main(["--backend", "tests.mutants.linear:StateNotWritten", "-k", "mamba2_verify", "--device", "cpu"]) == 1
    assert "mamba2_verify_fp32-eager: FAIL kv-write" in capsys.readouterr().out


def _matrix(tmp_path, *backends: str, case: str, exec_: str = "eager"):
    """(exit status, {backend: (outcome, failure class, message)}) of the conformance test on one
    recurrent smoke case."""
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider",
                           "--backend", ",".join(backends), "--case-set", "smoke", "--exec", exec_, "-k", case,
                           "--results-json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    records = json.loads(out.read_text())["records"] if out.exists() else []
    assert records, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.returncode, {r["backend"]: (r["outcome"], r["failure_class"], r["message"]) for r in records
                             if r["case"] == case}


def test_the_matrix_fails_a_recurrent_mutant_and_a_dense_backend_reads_unsupported(tmp_path):
    """Through tests/test_conformance.py: a planted state bug fails its recurrent case with its class,
    recorded as any run; a backend declaring no recurrent kind records the case unsupported."""
    rc, found = _matrix(tmp_path, "tests.mutants.linear:StateNotWritten", "torch_native", case="mamba2_verify_fp32")
    assert rc == 1
    outcome, failure_class, message = found["torch_native_linear"]
    assert (outcome, failure_class) == ("fail", "kv-write") and "state pools wrong" in message, message
    assert found["torch_native"][:2] == ("unsupported", None) and "Mamba2 (SSD)" in found["torch_native"][2]


def test_the_matrix_passes_the_in_box_backend_on_a_graph_run(tmp_path):
    rc, found = _matrix(tmp_path, LINEAR, case="gdn_verify_fp32", exec_="graph")
    assert rc == 0 and found == {"torch_native_linear": ("pass", None, "")}, found


class RaisesInForward(TorchNativeLinearBackend):
    """A backend whose forward raises, as the engines' did on devices the kit had not run them on."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("Expected all tensors to be on the same device")


def test_a_crash_names_the_line_that_raised():
    import inspect

    case = next(c for c in SMOKE if c.kind == "gdn" and c.mode == ForwardMode.DECODE)
    verdicts = run_case(RaisesInForward, case)
    line = inspect.getsourcelines(RaisesInForward.forward)[1] + 1
    assert [v.failure_class for v in verdicts] == ["crash"]
    text = failures(verdicts)
    assert text.startswith("crash: decode eager: raised RuntimeError: Expected all tensors")  # what pins match
    assert text.endswith(f" at {__file__}:{line}") and "\n" not in text, text


class _PaddedRowsNaN(TorchNativeLinearBackend):
    """Leaves every token past its real requests' NaN (a padded row nothing computes)."""

    def forward(self, projected, *gates_and_layer):
        out = super().forward(projected, *gates_and_layer)
        real = sum(self.lens[i] for i in self.rows)
        full = out.new_full((projected.shape[0],) + tuple(out.shape[1:]), float("nan"))
        full[:real] = out[:real]
        return full


class _PaddedRowsNaNEmptyPadding(_PaddedRowsNaN):
    """The same under empty padded requests (vLLM's): a padded token belongs to no request."""

    profile = dataclasses.replace(_PaddedRowsNaN.profile, padded_query_len=0)


def test_padded_rows_are_judged_only_where_a_padded_token_belongs_to_a_request():
    """As the softmax harness: where padded requests decode like real ones (SGLang's), their rows must
    be finite; under empty padded requests (vLLM's) a padded token is nobody's and is not judged."""
    case = next(c for c in SMOKE if c.name == "gdn_decode_bf16_long")
    attending = failures(run_case(_PaddedRowsNaN, case, Exec.GRAPH))
    assert attending is not None and "padded output rows NaN/inf" in attending, attending
    assert failures(run_case(_PaddedRowsNaNEmptyPadding, case, Exec.GRAPH)) is None
