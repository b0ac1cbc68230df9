"""One run: backend x mode x exec x case -> RunResult (outcome, failure class, errors, repro): its
steps run eagerly or as graph replays and judged. Whose fault a failure is, kit.harness.fault says;
the memory policy around a run, kit.harness.memory_retry."""
from __future__ import annotations

import dataclasses
import time
from typing import List, Optional

import torch

from kit.engine.case import Case
from kit.engine.kinds.recurrent import RecurrentCase
from kit.engine.fixture import Fixture, fixtures_for
from kit.engine.numerics import label
from kit.engine.render import step_views
from kit.engine.schedule import batches
from kit.harness import compiles, interpreter, mirrors, recurrent
from kit.harness.capabilities import Capabilities
from kit.harness.environment import versions
from kit.harness.fault import Crash, KitOutOfMemory, call, charge_late_fault, charged, judged_on_device, unsynced
from kit.harness.graph import harness_for
from kit.harness.guard import Guard, canary_figures
from kit.harness.hooks import HookDriver, driver_for
from kit.harness.interpreter_noise import interpreter_noise_filtered
from kit.harness.invariance import Recurrence
from kit.harness.memory_retry import run_releasing_memory
from kit.harness.program import Program, forward_program
from kit.harness.protocol import BackendContext, backend_problem
from kit.harness.registry import load_backend
from kit.harness.run import Run
from kit.harness.scope import unsupported_reason
from kit.harness.timeout import RunTimeout, time_limit
from kit.harness.verdict import Across, Verdict, eager_verdict, numerics_steps, replay_failure, replay_verdict
from kit.modes import Exec
from kit.process.memory import STORE, after_run, moving_to
from kit.report.record import EAGER, FAIL, PASS, UNSUPPORTED, RunResult


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_device_context() -> None:
    """Makes the CUDA context now (a first allocation does) rather than in the first run."""
    if torch.cuda.is_available():
        torch.empty(1, device=default_device())


@dataclasses.dataclass
class RunSetup:
    """What one run is given: the backend class, its capabilities and its fixtures (one pool, in
    its engine's storage layout; one model)."""

    backend_cls: type
    caps: Capabilities
    case: Case
    fixtures: List[Fixture]
    device: torch.device

    @classmethod
    def make(cls, backend_cls, caps: Capabilities, case: Case, exec_: Exec, device) -> "RunSetup":
        device = torch.device(device)
        cases = batches(case, exec_, caps.profile)
        return cls(backend_cls, caps, case, fixtures_for(cases, device, STORE, caps.profile, caps.numerics), device)

    @property
    def case_fixture(self) -> Fixture:
        """The fixture of the case itself (the run's other batches are derived from it)."""
        return next(fx for fx in self.fixtures if fx.case == self.case)

    def new_backend(self):
        ctx = BackendContext.for_case(self.case, self.fixtures[0].pools, self.device, [fx.plan for fx in self.fixtures])
        return call("constructing backend", self.backend_cls, ctx)

    def eager(self, backend, fx: Fixture, across: Optional[Across] = None, regime: Optional[mirrors.Regime] = None,
              only: Optional[str] = None) -> Verdict:
        """The batch eagerly on `backend`; `regime`: how it hands its host mirrors (`only` that one so)."""
        batch = mirrors.handed(fx.batch, [r.n_new for r in fx.plan.requests], regime, self.caps.host_mirrors, only)
        return _eager(backend, fx, batch, driver_for(backend, self.caps), self.caps, across)

    def blame(self, fx: Fixture, regime: Optional[mirrors.Regime]) -> str:
        """Where the batch failed with its host mirrors as `regime` left them: which mirror the backend
        trusts, told by fresh instances (kit.harness.mirrors.blame); '' where no mirror is to blame."""
        if regime is None:
            return ""

        def wrong_with(only: Optional[str]) -> bool:
            try:
                return not self.eager(self.new_backend(), fx, regime=regime if only else None, only=only).ok
            except Crash as crash:
                if crash.device_lost or crash.timed_out:
                    raise
                return True
        try:
            return mirrors.blame(wrong_with, regime, self.caps.host_mirrors)
        except Crash as crash:
            if crash.timed_out:  # no time is left to tell: the run is the timeout's
                raise
            return ""  # the device faulted: nothing more runs (the run's end reports the fault)

    def recurrence(self) -> Recurrence:
        """What the run compares its recurring requests with (kit.harness.invariance)."""
        return Recurrence(exact=self.caps.batch_invariant)


def _outputs(program: Program, caps: Capabilities) -> Program:
    """forward_program's, each output a tensor and the log-sum-exp beside it where (only where) the
    backend declares returns_lse."""
    outs, lses = program
    for out, lse in zip((o for step in outs for o in step), (x for step in lses for x in step)):
        if not isinstance(out, torch.Tensor):
            raise Crash("forward", TypeError(f"forward returned {type(out).__name__}, not a tensor"))
        if caps.returns_lse and not isinstance(lse, torch.Tensor):
            raise Crash("forward", TypeError("forward returned no log-sum-exp though the backend declares "
                                             "returns_lse: return (out, lse), or leave returns_lse False"))
        if lse is not None and not caps.returns_lse:
            raise Crash("forward", TypeError("forward returned (out, lse) though the backend does not declare "
                                             "returns_lse: declare it (the kit judges the lse), or return out"))
    return program


def _eager(backend, fx: Fixture, batch, driver: HookDriver, caps: Capabilities,
           across: Optional[Across] = None) -> Verdict:
    """One program: the metadata once (for `batch`: fx's, its host mirrors as handed), then every step's
    forward for every layer of the model; `across`: the run's batches so far."""
    fx.install()
    # Copies in the case's input form: the inputs are shared with other runs of the batch
    # (kit.engine.fixture) and judged after; the copies are judged unchanged.
    given = [[x.handed(fx.case.inputs) for x in step.inputs] for step in fx.steps]
    guard = Guard()
    with guard.watching():
        batch = call("init_forward_metadata", driver.eager, batch)
        views = step_views(batch, [step.plan for step in fx.steps])
        program = _outputs(forward_program(backend, fx.layers, views, given, call=unsynced), caps)
    layers = f"layers 0-{len(fx.layers) - 1}" + (f" of {len(fx.steps)} steps" if len(fx.steps) > 1 else "")
    return judged_on_device(f"forward ({layers}, on the device)",
                             lambda: eager_verdict(fx, program, canary_figures(guard), given, caps.profile.scratch,
                                                   across, caps.numerics))


def run_case(backend_spec: str, case: Case, exec_: Exec, device: Optional[torch.device] = None,
             label: Optional[str] = None, catalog: Optional[str] = None,
             timeout: Optional[float] = None) -> RunResult:
    """`catalog`: the catalog target the case came from, named in the repro when not the in-box one;
    `timeout`: seconds after which the run stops as a crash (kit.harness.timeout)."""
    return execute(Run(backend_spec, label or backend_spec, case, exec_, catalog=catalog), device, timeout)


def execute(run: Run, device: Optional[torch.device] = None, timeout: Optional[float] = None) -> RunResult:
    """`run` in this process; `timeout`: seconds after which it stops as a crash (kit.harness.timeout)."""
    backend_spec, case, exec_ = run.spec, run.case, run.exec_
    device = device or default_device()
    result = run.record(outcome=PASS)
    start = time.perf_counter()
    moving_to(run.label, device)
    compiles.as_a_new_process()
    compiles.watch()
    result.versions = versions()
    try:
        with time_limit(timeout), interpreter_noise_filtered():
            # No wait for the device until supports(): loading is a lookup after a backend's first
            # run, and the previous run ended with one (its faults are its own).
            cls = unsynced("loading backend", load_backend, backend_spec)
            compiles.watch()  # the libraries it imported, before its kernels build
            interpreter.install()  # a no-op unless the backend's kernels run in Triton's interpreter
            problem = backend_problem(cls)
            if problem:
                raise Crash("loading backend", TypeError(f"{backend_spec}: {problem}"))
            caps = unsynced("loading backend", Capabilities.of, cls)
            result.versions = unsynced("versions()", versions, cls)
            run_releasing_memory(lambda: _run(cls, caps, case, exec_, device, result), device, result)
    except (KitOutOfMemory, Crash, RunTimeout) as exc:
        charged(result, exc, lambda: run.repro(timeout))
    if result.outcome not in (PASS, UNSUPPORTED):  # it may have written outside its memory
        STORE.poison_suspect = True
    if not result.device_lost:
        charge_late_fault(result)
    if not result.device_lost:
        after_run(device)
    compiles.watch()
    result.seconds = round(time.perf_counter() - start, 4)
    return result


def unsupported_here(run: Run) -> Optional[RunResult]:
    """`run`'s record where its backend declares the case unsupported, found without running
    it (a quarantined run goes to a subprocess only where there is something to run); None
    where the case is supported, or where the backend does not load (the run will say why)."""
    try:
        cls = load_backend(run.spec)
        if backend_problem(cls):
            return None
        reason = unsupported_reason(cls, Capabilities.of(cls), run.case, run.exec_)
        if reason is None:
            return None
        return run.record(outcome=UNSUPPORTED, message=reason, versions=versions(cls))
    except Exception:  # noqa: BLE001 - the run itself reports a backend that fails here
        return None


def _run(cls, caps: Capabilities, case: Case, exec_: Exec, device, result: RunResult) -> None:
    reason = call("supports()", unsupported_reason, cls, caps, case, exec_)
    if reason is not None:
        result.outcome, result.message = UNSUPPORTED, reason
        return
    if isinstance(case, RecurrentCase):  # its inputs, reference and pools are of their own
        recurrent.record_run(cls, case, exec_, str(device), result)
        return
    setup = RunSetup.make(cls, caps, case, exec_, device)
    backend = setup.new_backend()
    if exec_ is Exec.EAGER:
        _eager_sequence(backend, setup, result)
    else:
        _graph(backend, setup, result)


def _eager_sequence(backend, setup: RunSetup, result: RunResult) -> None:
    """Every batch of the sequence on one instance, each judged; the case is the last."""
    result.exec_detail = EAGER
    fixtures = setup.fixtures
    recurrence = setup.recurrence()
    for i, fx in enumerate(fixtures):
        regime = mirrors.regime(i, len(fixtures), setup.caps.host_mirrors)
        across = Across(recurrence, _describe_step(i, fixtures))
        v = _blamed(setup, fx, regime, lambda: setup.eager(backend, fx, across, regime))
        _measured(result, setup, fx, v)
        result.max_err = max(result.max_err or 0.0, v.max_err)
        result.tol = v.tol if result.tol is None else min(result.tol, v.tol)
        if v.ok:
            continue
        result.outcome, result.failure_class = FAIL, v.failure_class()
        result.message = f"{_describe_step(i, fixtures)}: {v.text}"
        blamed = setup.blame(fx, regime) if v.shown_alone else ""
        if blamed:
            result.message += blamed
        elif i and v.shown_alone:  # the same batch on a fresh instance tells state kept from a plain bug
            fresh = setup.eager(setup.new_backend(), fx)
            result.message += ("; on a fresh backend instance the same batch is right -> state kept from "
                               "the earlier batches" if fresh.ok else "; wrong on a fresh backend instance too")
        return


def _measured(result: RunResult, setup: RunSetup, fx: Fixture, v: Verdict) -> None:
    """The numerics the batch's outputs were judged under and its margins, into the run's (per layer,
    the worst over its batches)."""
    result.numerics = label(numerics_steps(fx, setup.caps.numerics))
    margins = v.margins(len(fx.layers))
    result.margins = [max(a, b) for a, b in zip(result.margins, margins)] if result.margins else margins


def _blamed(setup: RunSetup, fx: Fixture, regime: Optional[mirrors.Regime], run):
    """run(); where it crashes in a batch whose host mirrors were not exact, the crash says which
    mirror the backend trusts (RunSetup.blame)."""
    try:
        return run()
    except Crash as crash:
        if regime is None or crash.device_lost or crash.timed_out:
            raise
        crash.args = (str(crash) + setup.blame(fx, regime),)
        raise


def _describe_step(i: int, fixtures: List[Fixture]) -> str:
    fx = fixtures[i]
    text = f"eager batch {i + 1}/{len(fixtures)} (bs={len(fx.plan.requests)}, {fx.plan.num_tokens} tokens"
    if i:
        text += f", on the instance that ran bs={len(fixtures[i - 1].plan.requests)} before"
    return text + ")"


def _graph(backend, setup: RunSetup, result: RunResult) -> None:
    fixtures, scratch = setup.fixtures, setup.caps.profile.scratch
    harness = call("init_cuda_graph_state", harness_for, backend, fixtures, setup.caps)
    call("capture", harness.capture)
    result.exec_detail = harness.detail
    worst = 0.0
    recurrence = setup.recurrence()
    for i, fx in enumerate(fixtures):
        call("capture", harness.prepare, fx)
        fx.install()
        regime = mirrors.regime(i, len(fixtures), setup.caps.host_mirrors)
        replayed = _blamed(setup, fx, regime, lambda: unsynced(f"replay {i + 1}", harness.replay, fx, regime))
        _outputs((replayed.outs, replayed.lses), setup.caps)
        across = Across(recurrence, harness.describe(i, fixtures))
        v = judged_on_device(f"replay {i + 1}", lambda: replay_verdict(fx, replayed, scratch, across,
                                                                                   setup.caps.numerics))
        _measured(result, setup, fx, v)
        worst = max(worst, v.max_err)
        result.tol = v.tol if result.tol is None else min(result.tol, v.tol)
        if v.ok:
            continue
        blamed = setup.blame(fx, regime) if v.needs_eager_diagnosis else ""
        # Diagnostic: the same batch run eagerly on a fresh backend (exact mirrors) decides the class,
        # whatever the mirrors are blamed for: a replay wrong where eager is right is the graph's.
        eager = setup.eager(setup.new_backend(), fx) if v.needs_eager_diagnosis else None
        cls, why = replay_failure(v, eager)
        result.outcome, result.failure_class = FAIL, cls
        result.message = f"{harness.describe(i, fixtures)}: {v.text}{blamed}{why}"
        break
    result.max_err = worst
