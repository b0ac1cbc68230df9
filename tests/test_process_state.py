"""A run's verdict does not follow the runs before it in its process: each starts with torch.compile's
in-memory state cleared (kit.harness.compiles.as_a_new_process), and a backend whose library keeps more
process-wide state than that declares `own_process`, so each of its runs goes to a subprocess
(kit.harness.isolate.in_own_process). Each is shown by a planted backend right only as its process's first."""
import torch

import kit.harness.compiles
from backends.torch_native import TorchNativeBackend
from kit.harness.isolate import dispatch, in_own_process, run_quarantined
from kit.harness.run import Run
from kit.harness.runner import execute
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant, score
from tests.helpers import small_case
from tests.toys.tiny import CATALOG, SMOKE

MODULE = "tests.test_process_state"
TINY = "tests.toys.tiny:CATALOG"
CPU = torch.device("cpu")
_made = []  # the FirstInItsProcess backends made in this process


class FirstInItsProcess(TorchNativeBackend):
    """Planted: fails from its process's second instance on, as inductor's lowering of SGLang's flex calls
    raised NoValidChoicesError or not by what its process had compiled before."""

    own_process = "planted: right only as its process's first backend"

    def __init__(self, ctx):
        super().__init__(ctx)
        _made.append(self)
        if len(_made) > 1:
            raise RuntimeError("planted: not its process's first backend")


class FirstInItsProcessUndeclared(FirstInItsProcess):
    own_process = None


def _double(x):
    return x * 2


_compiled = torch.compile(_double, backend="eager")


class CompiledBefore(TorchNativeBackend):
    """Planted: fails where its process's torch.compile already holds its function compiled (by an earlier run)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        if _debug_get_cache_entry_list(_double.__code__):
            raise RuntimeError("planted: compiled by an earlier run of this process")
        _compiled(torch.ones(2))


def _run(backend: str, case) -> Run:
    return Run(f"{MODULE}:{backend}", backend, case, Exec.EAGER, catalog=TINY)


def test_a_backend_declaring_own_process_runs_each_run_in_a_subprocess_and_passes_where_in_one_it_fails():
    _made.clear()  # this process may have made one already (a test run again)
    declared, undeclared = (_run(b, c) for b, c in (("FirstInItsProcess", SMOKE[0]), ("FirstInItsProcessUndeclared", SMOKE[1])))
    assert in_own_process(declared) and not in_own_process(undeclared)
    assert in_own_process(_run("no.such.module:Backend", SMOKE[0])) is False  # its run says why it does not load
    for case in SMOKE[:2]:
        r = dispatch(_run("FirstInItsProcess", case), device=CPU)
        assert (r.outcome, r.isolated) == ("pass", True), r.message
    outcomes = [dispatch(_run("FirstInItsProcessUndeclared", case), device=CPU) for case in SMOKE[:2]]
    assert [r.outcome for r in outcomes] == ["pass", "fail"], [r.message for r in outcomes]
    assert "planted: not its process's first backend" in outcomes[1].message


def test_the_mutation_scorer_puts_a_run_where_the_suite_does():
    """A mutant of a backend declaring own_process is scored with each run in its own process, as the suite
    runs it: its runs all pass; undeclared, its runs after the first fail in the scorer's process."""
    def mutant(backend):
        return Mutant(0, backend, f"{MODULE}:{backend}", ("crash",), (ForwardMode.DECODE,), (Exec.EAGER,), cpu=True)
    declared = score(mutant("FirstInItsProcess"), "smoke", cases=TINY)
    assert declared.runs >= 2 and declared.failed == 0, declared
    _made.clear()
    undeclared = score(mutant("FirstInItsProcessUndeclared"), "smoke", cases=TINY)
    assert undeclared.runs == declared.runs and undeclared.failed == undeclared.runs - 1, undeclared


def test_each_run_compiles_as_a_new_process_would_and_without_the_reset_the_second_run_fails(monkeypatch):
    runs = [_run("CompiledBefore", case) for case in CATALOG.cases("smoke", SMOKE[0].mode)[:2]]
    assert [execute(r, CPU).outcome for r in runs] == ["pass", "pass"]
    monkeypatch.setattr(kit.harness.compiles, "as_a_new_process", lambda: None)
    planted = [execute(r, CPU) for r in runs]
    assert planted[1].outcome == "fail" and "compiled by an earlier run" in planted[1].message, planted[1].message


def test_a_drawn_case_goes_to_its_own_process_whole_as_its_line():
    """The fuzzer's cases are in no catalog: a run of one goes to its subprocess as its Case(...) line, on the
    fuzzer's device, and its repro gives the same line."""
    run = Run(f"{MODULE}:FirstInItsProcess", "first", small_case("drawn", ForwardMode.DECODE, (3, 9)), Exec.EAGER,
              drawn=True)
    assert "--case-line 'Case(" in run.repro() and in_own_process(run)
    for _ in range(2):
        r = run_quarantined(run, device=CPU)
        assert (r.outcome, r.isolated, r.case) == ("pass", True, "drawn"), r.message
