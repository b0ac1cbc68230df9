"""Batch invariance (kit.harness.invariance): a run's batches carry the case's longest request again
(beside other requests, at another position, alone, in another graph bucket); a backend that declares
batch_invariant must give its output rows bit for bit in each, any other within the output tolerance.
The Triton mutants that choose KV splits from the batch are caught too (tests/mutants, 80 and 81)."""
import pytest

from cases import CATALOG
from kit.engine.modes import rules_for
from kit.engine.modes.rules import GraphBuckets
from kit.engine.plan import plan_case
from kit.engine.profile import SGLANG
from kit.engine.schedule import batches
from kit.engine.variants import recurring
from kit.harness.runner import run_case
from kit.modes import EXECS, MODES, Exec, ForwardMode
from kit.report.record import FAIL, KERNEL, PASS

CASE = CATALOG.find_case(ForwardMode.DECODE, "gqa_ragged_p16_fp32")  # bs 5, its request 4 the longest
TOYS = "tests.toys.beside:"


@pytest.mark.parametrize("exec_", EXECS, ids=lambda e: e.value)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_run_carries_the_cases_request_into_other_batches(mode, exec_):
    """The case's longest request (its seed and lengths: its data and, in a tree, its drafts) recurs in
    the run alone and, but in token-bucket graphs (their other batches are fixed shapes), in a larger
    batch at another position."""
    case = next(c for c in CATALOG.cases("smoke", mode) if c.bs > 1)
    r = recurring(case)
    found = {}  # (batch size, position) of each batch the request is in -> its plan there
    for batch in batches(case, exec_, SGLANG):
        plan = plan_case(batch)
        found.update({(batch.bs, i): plan.requests[i] for i, data in enumerate(plan.data)
                      if data == plan_case(case).data[r]})
    assert (case.bs, r) in found and (1, 0) in found
    assert len({(tuple(p.q_pos), tuple(p.parents)) for p in found.values()}) == 1  # the same request
    if exec_ is Exec.EAGER or rules_for(mode).graph is GraphBuckets.BATCH_SIZE:
        assert any(bs > case.bs and i != r for bs, i in found), found


@pytest.mark.parametrize("toy, outcome, says", [
    ("NudgedBesideOthers", FAIL, "its rows must match within the output tolerance (the backend does not declare"),
    ("SlightlyNudged", PASS, ""),
    ("SlightlyNudgedDeclared", FAIL, "its rows must match bit for bit (the backend declares batch_invariant)"),
])
def test_a_request_nudged_beside_others(toy, outcome, says):
    """Nudged alone one way and beside others the other, each batch passes its golden check; the rows of
    the recurring request alone and in its first batch then differ: past the tolerance, caught whatever
    the backend declares; within it, caught only where the backend declares batch invariance."""
    result = run_case(TOYS + toy, CASE, Exec.EAGER)
    assert result.outcome == outcome, result.message
    if outcome == FAIL:
        assert result.failure_class == KERNEL
        assert result.message.startswith("eager batch 4/4 (bs=1, 1 tokens"), result.message
        assert "layer 0 output ok" in result.message and "layer 1 output ok" in result.message
        assert f"not batch invariant, {says}" in result.message
        assert "request 0 of this batch is request 6 of eager batch 1/4 (bs=7, 7 tokens)" in result.message
