"""The kit catches every CPU-catchable mutant (but those harmless by design) with its expected failure class
(the GPU table, every mutant and every run, comes from `python -m kit.mutate`)."""
import time

import pytest

import kit.mutation
from kit.engine.catalog import load_catalog
from kit.modes import parse_mode
from kit.mutation import score, score_isolated
from kit.report.known_failures import KnownFailure
from kit.report.record import CRASH, parse_run_id
from tests.mutants import MUTANTS
from tests.toys.crashing import MUTANTS as STUCK


# Each run's limit for the mutants that may take their process down: a corrupted heap can leave it stuck instead
# (a deadlock in its allocator), which the limit ends well inside the test's own; their whole workers take seconds.
RUN_LIMIT_S = 120


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.cpu and not m.harmless], ids=lambda m: m.name)
def test_mutant_is_caught(mutant):
    # In this process (a new one costs seconds of imports), but for a mutant that may take it down.
    s = (score_isolated(mutant, "tests.mutants:MUTANTS", "smoke", stop_when_caught=True, timeout=RUN_LIMIT_S)
         if CRASH in mutant.expect else score(mutant, "smoke", stop_when_caught=True))
    assert s.caught, (f"{mutant.name} ({mutant.doc}) missed: expected {mutant.expect}, "
                      f"{s.failed}/{s.runs} runs failed with {s.classes or 'nothing'}")
    if mutant.reaches is not None:  # tried first: a catch elsewhere means the catalog says the wrong cases
        _, mode, _, name = parse_run_id(s.first_failure)
        assert mutant.reaches(load_catalog(None).find_case(parse_mode(mode), name)), (
            f"{mutant.name} was caught at {s.first_failure}, in a case its `reaches` leaves out")


def test_catalog_is_sound():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    assert set(m.number for m in MUTANTS) >= set(range(1, 16)), "every bug class of the issue has a mutant"
    for m in MUTANTS:
        assert m.doc, f"{m.name}: the mutant's docstring names its bug class"


def test_runs_the_unmutated_backend_is_known_to_fail_are_left_out(monkeypatch):
    """A failure where the engine itself fails (a known failure of the unmutated backend) cannot
    tell the mutant from the engine's own bug: such runs are not scored, only counted."""
    mutant = next(m for m in MUTANTS if m.name == "decode_reads_one_short")
    runs, known = kit.mutation._runs(mutant, "smoke", None)
    assert known == 0 and "gqa_fused_p16_fp32" in [case.name for case, _, _ in runs]
    entry = KnownFailure("KF-1", "triton", "decode", "eager", "gqa_fused*", "*", "kernel", "xfail", "why", "x",
                         "KNOWN_FAILURES.md:1")
    monkeypatch.setattr(kit.mutation.known_failures, "load_or_default", lambda: [entry])
    left, known = kit.mutation._runs(mutant, "smoke", None)
    assert known == 1 and len(left) == len(runs) - 1 and "gqa_fused_p16_fp32" not in [case.name for case, _, _ in left]


def test_runs_under_a_banded_known_failure_stay_in_the_score(monkeypatch):
    """An entry that pins its band leaves its runs in: a mutant's failure outside the band is scored."""
    mutant = next(m for m in MUTANTS if m.name == "decode_reads_one_short")
    runs, _ = kit.mutation._runs(mutant, "smoke", None)
    entry = KnownFailure("KF-1", "triton", "decode", "eager", "gqa_fused*", "*", "kernel", "xfail", "why", "x",
                         "KNOWN_FAILURES.md:1", band=(1.5, 3.0))
    monkeypatch.setattr(kit.mutation.known_failures, "load_or_default", lambda: [entry])
    kept, known = kit.mutation._runs(mutant, "smoke", None)
    assert known == 0 and len(kept) == len(runs)
    assert [e for case, _, e in kept if case.name == "gqa_fused_p16_fp32"] == [entry, entry][:len(mutant.execs)]


def test_the_score_table_says_how_many_runs_were_left_out_as_the_engines_known_failures():
    from matrix.mutation import table
    row = dict(number=30, mutant="m", expect=["graph"], harmless="", runs=3, failed=1, classes={"graph": 1},
               first_failure="m-decode-graph-c", repro="", not_run=0, known=2, caught=True)
    assert "| 1/3 (2 left out: the engine's known failures) |" in table([row])
    assert "left out" not in table([dict(row, known=0)])


def test_the_scorer_takes_every_kind_s_mutants_and_runs_each_on_its_kind_s_cases():
    """The sparse and recurrent kinds' mutants are in the catalog `python -m kit.mutate` scores, each run
    on the cases of the kinds its backend declares: a recurrent mutant on cases/linear.py's, a sparse one on
    the sparse MLA cases, the Triton backend's on its dense and MLA ones."""
    by_name = {m.name: m for m in MUTANTS}
    for name, kinds in (("state_not_written", {"gdn", "mamba2", "kda"}), ("sparse_padding_not_skipped", {"sparse_mla"}),
                        ("window_one_short", {"dense", "mla"})):
        runs, _ = kit.mutation._runs(by_name[name], "smoke", None)
        assert runs and {case.kind for case, _, _ in runs} == kinds, name


def test_a_mutant_that_leaves_its_process_stuck_is_caught_as_a_crash_at_its_run():
    """Stuck in native code, where the run's limit cannot raise: the watchdog ends the worker, and the run
    it was in is the mutant's crash (a worker without the limit waits for ever)."""
    start = time.monotonic()
    s = score_isolated(STUCK[0], "tests.toys.crashing:MUTANTS", "smoke", stop_when_caught=True,
                       cases="tests.toys.crashing:CATALOG", timeout=1)
    assert s.caught and s.classes == {CRASH: 1} and s.first_failure.endswith("-decode-eager-mqa_three"), s.to_record()
    assert "process died" in s.repro and time.monotonic() - start < 120, s.repro
