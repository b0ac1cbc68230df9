"""pytest integration: options, parametrization over backend x mode x exec x case,
KNOWN_FAILURES.md as strict expected failures, and --results-json written by the
controller (correct under xdist: each run's record travels back on its report;
a worker that dies is recorded as a crash of the case it was running)."""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from kit.engine import placement
from kit.plugin import cuda_context, parallel_spawn, progress

from kit.report import known_failures
from kit.engine.catalog import load_catalog, resolve_set
from kit.modes import EXECS, MODES, parse_exec, parse_mode
from kit.report.record import (COMPLETE, CRASH, FAIL, INTERRUPTED, RUNNING, RunResult, parse_run_id, record_id,
                        repro_command, run_id)
from kit.harness.capabilities import Capabilities
from kit.harness.registry import UnknownBackend, backend_label, known_backends, load_backend
from kit.harness.environment import device_name, to_record, versions
from kit.report.results import write_results
from kit.harness import timeout
from kit.harness.timeout import DEFAULT_S

RECORD_KEY = "conformance_record"
WRITE_EVERY_S = 2.0  # at most one write of the results file this often; an interrupted run keeps what finished
RUN_TIMEOUT = pytest.StashKey[float]()


if os.environ.get("PYTEST_XDIST_WORKER"):  # an xdist worker (set before its plugins load): kit.plugin.cuda_context
    placement.place_this_worker()  # its GPU, before any CUDA call
    cuda_context.begin()


class KnownFailureHit(Exception):
    """Raised when a run fails exactly as its KNOWN_FAILURES entry says (the only xfail that counts)."""


def _csv(values):
    return [v for item in values for v in item.split(",") if v]


def pytest_addoption(parser):
    g = parser.getgroup("conformance")
    g.addoption("--backend", action="append", default=[],
                help="backend name or module:attr (repeat or comma-separate); default: every registered backend")
    g.addoption("--mode", action="append", default=[], help=", ".join(m.value for m in MODES))
    g.addoption("--exec", action="append", default=[], dest="exec_", help="eager, graph")
    g.addoption("--case-set", default="auto", help="smoke, full, or auto (full with CUDA, smoke without)")
    g.addoption("--cases", default=None, help="case catalog as module:attr (default: the in-box catalog)")
    g.addoption("--results-json", default=None, help="write one record per run to this file")
    g.addoption("--progress-every", type=float, default=progress.EVERY_S, metavar="SECONDS",
                help=f"show runs done and time left per backend this often (default {progress.EVERY_S:g}; 0: never)")
    g.addoption("--known-failures", default=None,
                help="expected-failures file (default: the kit's KNOWN_FAILURES.md, if present)")




def _parsed(option, parse, *values, fix=""):
    """parse(*values); a bad value is a usage error, one line naming the option and the fix."""
    try:
        return parse(*values)
    except (UnknownBackend, ValueError, ImportError, AttributeError, TypeError) as exc:
        hint = f"; {fix}" if fix and not isinstance(exc, UnknownBackend) else ""  # that one lists the known
        raise pytest.UsageError(f"{option}: {exc}{hint}") from None


def _selection(config):
    """Parsed options. The catalog and the case set import torch (cases check themselves against
    their mode's rules, `auto` asks for CUDA): the xdist controller, which runs no case, loads
    them once its workers are started (pytest_sessionstart), not before (_cases)."""
    opt = config.getoption
    specs = _csv(opt("--backend")) or known_backends()
    labels = {spec: _parsed(f"--backend {spec}", backend_label, spec,
                            fix=f"give a registered name ({', '.join(known_backends())}) or module:attr of a "
                                f"backend class that imports") for spec in specs}
    if opt("--case-set") != "auto":
        _parsed("--case-set", resolve_set, opt("--case-set"))
    sel = dict(
        labels=labels,
        modes=_parsed("--mode", lambda: [parse_mode(m) for m in _csv(opt("--mode"))] or list(MODES)),
        execs=_parsed("--exec", lambda: [parse_exec(e) for e in _csv(opt("exec_"))] or list(EXECS)),
        catalog_target=opt("--cases"),
        known=_parsed("--known-failures", known_failures.load_or_default, opt("--known-failures")),
        load=functools.partial(_load_cases, opt, specs),
    )
    return sel if _is_xdist_controller(config) else _cases(sel)


def _load_cases(opt, specs) -> dict:
    """The catalog, the case set and, for `--case-set auto` on CPU, each backend's `ci_cases`
    (a backend too slow here for every smoke case names those; `--case-set smoke` runs them all.
    The catalog of the results file keeps every run)."""
    case_set = _parsed("--case-set", resolve_set, opt("--case-set"))
    auto_smoke = opt("--case-set") == "auto" and case_set == "smoke"
    return dict(
        catalog=_parsed(f"--cases {opt('--cases')}", load_catalog, opt("--cases"),
                        fix="give module:attr of a kit.engine.catalog.Catalog that imports"),
        case_set=case_set,
        ci_cases={spec: _parsed(f"--backend {spec}", lambda: Capabilities.of(load_backend(spec)).ci_cases)
                  if auto_smoke else None for spec in specs},
    )


def _cases(sel) -> dict:
    """The selection with its catalog, case set and ci_cases (loaded at the first call)."""
    if "catalog" not in sel:
        sel.update(sel["load"]())
    return sel


def _is_xdist_controller(config) -> bool:
    return (config.getoption("dist", "no") != "no" and not config.getoption("collectonly")
            and not hasattr(config, "workerinput"))


def pytest_generate_tests(metafunc):
    """One test per run. A case's eager and graph runs follow each other: they share the case's
    batch (kit.engine.fixture). Backends are not interleaved case by case: a backend's stray write
    into the kit's memory (outside its pool and its own allocations, where no verdict sees it)
    would reach the batch the next backend is judged on, as SGLang's EXTEND graphs under
    full-capacity replays seemed to on the H100; kit.engine.fixture's fingerprints rebuild a batch
    that changed, but cannot say which run changed it. Under `--dist loadgroup` the runs of
    a group (_groups) go to one worker."""
    if "conformance_run" not in metafunc.fixturenames:
        return
    sel = _cases(metafunc.config._conformance_selection)
    device = device_name()
    params = []
    for spec, label in sel["labels"].items():
        ci_cases = sel["ci_cases"][spec]
        for mode in sel["modes"]:
            for case in sel["catalog"].cases(sel["case_set"], mode):
                if ci_cases is not None and case.name not in ci_cases.get(mode.value, ()):
                    continue
                for exec_ in sel["execs"]:
                    entry = known_failures.match(sel["known"], label, mode.value, exec_.value, case.name,
                                                 device)
                    marks = [] if entry is None else [pytest.mark.xfail(
                        strict=True, raises=KnownFailureHit,
                        reason=f"{entry.id} expects [{entry.failure_class}]: {entry.reason} ({entry.where})")]
                    run = (spec, label, case, exec_, entry, sel["catalog_target"])
                    params.append(pytest.param(run, marks=marks,
                                               id=run_id(label, mode.value, exec_.value, case.name)))
    metafunc.parametrize("conformance_run", params)


def _default_timeout(config) -> None:
    """pytest-timeout's limit is kit.harness.timeout.DEFAULT_S unless --timeout, PYTEST_TIMEOUT or the `timeout`
    ini value say otherwise (0: none): a hung backend must not hang the run."""
    try:
        ini = config.getini("timeout")
    except ValueError:  # pytest-timeout disabled (-p no:timeout)
        return
    if config.getoption("timeout", None) is None and not os.environ.get("PYTEST_TIMEOUT") and not ini:
        config.option.timeout = DEFAULT_S


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """A conformance run applies the limit itself (kit.harness.timeout, in the runner), so that a run past
    it is recorded as a crash at its stage and the session goes on; other tests keep pytest-timeout's."""
    if _run_of(item.nodeid) is None:
        return None
    item.stash[RUN_TIMEOUT] = settings.timeout
    return True


def run_timeout(item) -> Optional[float]:
    """The time limit of a conformance run, in seconds (None: none)."""
    return item.stash.get(RUN_TIMEOUT, None)


def _last_words_path(results_path, nodeid: str) -> Path:
    return Path(f"{results_path}.lost") / (hashlib.sha1(nodeid.encode()).hexdigest() + ".json")


@pytest.fixture
def record_conformance(request):
    def record(result):
        request.node.user_properties.append((RECORD_KEY, json.dumps(to_record(result))))
        if result.device_lost:
            _end_process(request.config, request.node.nodeid, result)
    recorder = request.config.pluginmanager.get_plugin("conformance-recorder")
    timeout.on_stuck(functools.partial(recorder.stuck, request.node.nodeid))
    yield record
    timeout.on_stuck(None)


def _end_process(config, nodeid: str, result) -> None:
    """After a sticky device fault every later case here would fail and be blamed: leave the
    record where the controller finds it, and end this process (xdist starts a fresh worker)."""
    path = config.getoption("--results-json")
    if path:
        lost = _last_words_path(path, nodeid)
        lost.parent.mkdir(parents=True, exist_ok=True)
        lost.write_text(json.dumps(to_record(result)))
    sys.stderr.write(f"\n{nodeid}: {result.message}\nthe device is lost; ending this process "
                     f"(under -n the run goes on in a fresh worker)\n")
    sys.stderr.flush()
    os._exit(70)


def _groups(sel) -> Dict[str, Tuple[str, str]]:
    """Each run's (group, backend), by run id: a group is a backend's runs of one mode and kernel
    variant, so that a worker loads (JIT-builds, compiles) each kernel once, while the groups stay
    small enough to keep every worker busy. kit.plugin.worker_affinity schedules by them; not by
    xdist_group marks, whose `@group` suffix pytest 9 drops from the node ids (xdist 3.8 sets
    `item._nodeid`, which pytest 9 no longer reads): every run was a group of its own."""
    sel = _cases(sel)
    return {run_id(label, mode.value, exec_.value, case.name):
            (f"{label}-{mode.value}-{case.kernel_variant}", label)
            for label in sel["labels"].values() for mode in sel["modes"]
            for case in sel["catalog"].cases(sel["case_set"], mode) for exec_ in sel["execs"]}


def _run_of(nodeid: str) -> Optional[str]:
    """The run id of a conformance test's node id (`...::test_conformance[<run id>]`, plus
    `@<group>` under `--dist loadgroup`), None for the kit's other tests."""
    if "::test_conformance[" not in nodeid:
        return None
    return nodeid.split("[", 1)[1].rsplit("]", 1)[0]


def _catalog_ids(sel) -> List[str]:
    """Every run the catalog has for this case set: each registered backend (and each one named on
    the command line), every mode and exec. A results file lacking some of them is partial."""
    sel = _cases(sel)
    labels = sorted(set(known_backends()) | set(sel["labels"].values()))
    return [run_id(label, mode.value, exec_.value, case.name) for label in labels for mode in MODES
            for exec_ in EXECS for case in sel["catalog"].cases(sel["case_set"], mode)]


class _Recorder:
    """Collects records from reports (on the xdist controller they arrive from workers), and
    writes them with what the session selected and how it ended (kit.report.record.ResultsFile)."""

    def __init__(self, config):
        self.config = config
        self.path = config.getoption("--results-json")
        self.writes = bool(self.path) and not hasattr(config, "workerinput")  # the controller, or a plain run
        self.records = {}
        self.last_write = 0.0
        # A record that arrives within WRITE_EVERY_S of the last write is written by a timer: the next
        # run may hang, and nothing else would write it. The lock orders the timer's and the session's.
        self.pending: Optional[threading.Timer] = None
        self.lock = threading.Lock()
        self.selected: Optional[List[str]] = None  # run ids, once collection is known
        self.started = False  # runs began: from then on the file is this session's
        self.progress: Optional[progress.Progress] = None  # once the runs are known
        self.spec_of = {label: spec for spec, label in config._conformance_selection["labels"].items()}
        self.catalog: Optional[List[str]] = None  # _catalog_ids, at the first write (the controller loads it late)

    def _select(self, nodeids) -> None:
        if self.selected is None:
            self.selected = [rid for rid in map(_run_of, nodeids) if rid is not None]

    def pytest_collection_finish(self, session):
        self._select(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._select(ids)  # the controller collects nothing itself: a worker's (selected) ids
        self._start()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtestloop(self, session):
        if self.selected is not None and not session.config.option.collectonly:
            self._start()
        yield

    def _start(self) -> None:
        """Mark the file as this session's before the first run: a process that dies without a word
        (os._exit) then leaves a `running` file, never the previous run's results."""
        if self.selected and not self.started:
            self.started = True
            self.progress = progress.Progress((parse_run_id(rid)[0] for rid in self.selected),
                                              self.config.getoption("--progress-every"))
            self._write(RUNNING)

    def _show_progress(self, report, record) -> None:
        if self.progress is None or hasattr(self.config, "workerinput"):
            return
        lines = self.progress.add(record["backend"], record.get("seconds") or 0.0, getattr(report, "node", None))
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if lines and terminal is not None:
            if getattr(terminal, "_width_of_current_line", 0):  # after the dots of -q, on a line of its own
                terminal.write("\n")
            for line in lines:
                terminal.write_line(line)

    def pytest_runtest_logreport(self, report):
        if _run_of(report.nodeid) is None:
            return
        record = next((json.loads(v) for k, v in report.user_properties if k == RECORD_KEY), None)
        if record is None and report.failed and report.nodeid not in self.records:
            record = self._crash_record(report)  # the worker died, or the test failed before its verdict
        if record is None:
            return
        if report.nodeid not in self.records:
            self._show_progress(report, record)
        self.records[report.nodeid] = record
        self._write_soon()

    def _write_soon(self) -> None:
        if not self.writes:
            return
        with self.lock:
            if self.pending is not None:
                return  # a write is due: it takes this record too
            wait = max(0.0, WRITE_EVERY_S - (time.monotonic() - self.last_write))
            self.pending = threading.Timer(wait, self._write, args=(RUNNING,))
            self.pending.daemon = True
            self.pending.start()

    def _crash_record(self, report):
        if self.path:
            lost = _last_words_path(self.path, report.nodeid)
            if lost.exists():  # the worker ended itself (a device fault, a run stuck), leaving its record
                record = json.loads(lost.read_text())
                lost.unlink()
                return record
        if report.when == "???":  # xdist: the worker died
            message = f"the test process died (a hard crash, or stuck past the time limit): {report.longrepr}"
        else:
            last = (report.longreprtext.strip().splitlines() or ["?"])[-1]
            message = f"the run ended without a verdict ({report.when}): {last}"
        return self._crash_of(report.nodeid, message)

    def _crash_of(self, nodeid: str, message: str, limit: Optional[float] = None) -> dict:
        sel = _cases(self.config._conformance_selection)
        label, mode, exec_, name = parse_run_id(_run_of(nodeid))
        case = sel["catalog"].find_case(parse_mode(mode), name)
        spec = self.spec_of.get(label, label)
        result = RunResult(backend=label, mode=mode, exec=exec_, case=name, dtype=case.dtype, outcome=FAIL,
                           failure_class=CRASH, message=message,
                           repro=repro_command(spec, mode, exec_, name, sel["catalog_target"], limit),
                           versions=versions(load_backend(spec)))
        return to_record(result)

    def stuck(self, nodeid: str, message: str) -> Optional[str]:
        """A run stuck in native code past its limit is about to end this process (kit.harness.timeout):
        its crash record goes into the results file, which says the session was interrupted (the
        runs after it have none); in an xdist worker, where the controller finds it."""
        record = self._crash_of(nodeid, message, self.config.getoption("timeout", None))
        if self.writes:
            self.records[nodeid] = record
            self._write(INTERRUPTED)
            return (f"{nodeid}: recorded as a crash in {self.path}; the runs after it did not run (under -n "
                    f"the others go on)")
        if self.path:
            lost = _last_words_path(self.path, nodeid)
            lost.parent.mkdir(parents=True, exist_ok=True)
            lost.write_text(json.dumps(record))
        return f"{nodeid}: recorded as a crash"

    def _write(self, status: str) -> None:
        with self.lock:
            self.pending = None
            if self.writes and (self.started or self.records):  # never for --co or a run that selected nothing
                if self.catalog is None:
                    self.catalog = _catalog_ids(self.config._conformance_selection)
                write_results(self.path, list(self.records.values()),
                              run=dict(status=status, selected=self.selected or [], catalog=self.catalog))
                self.last_write = time.monotonic()

    def pytest_sessionfinish(self, session, exitstatus):
        with self.lock:
            pending = self.pending
        if pending is not None:  # the final write below takes its records, and must be the last
            pending.cancel()
            pending.join()
        recorded = {record_id(r) for r in self.records.values()}
        whole = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and recorded >= set(self.selected or [])
        self._write(COMPLETE if whole else INTERRUPTED)
        if self.writes:
            shutil.rmtree(f"{self.path}.lost", ignore_errors=True)


def threads_per_worker(threads: int, workers: int) -> int:
    """A worker's share of torch's threads (its default: one per core)."""
    return max(1, threads // workers)


def _split_threads(config) -> None:
    """Under xdist, each worker gets its share of the cores for torch's CPU work. Left at
    torch's default, N workers run N threads per core, and idle threads spin: on the H100
    host the in-box matrix took 76 s with 4 workers, 45 s with one thread each. An
    OMP_NUM_THREADS the user set is left as it is."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "OMP_NUM_THREADS" not in os.environ:
        import torch
        torch.set_num_threads(threads_per_worker(torch.get_num_threads(), int(workerinput["workercount"])))


def _exit_without_teardown(config) -> None:
    """An xdist worker ends as soon as its session has: after pytest's unconfigure and cleanups it
    runs its exit handlers (atexit's os._exit, registered first, runs last) and exits, skipping the
    interpreter's teardown of torch, Triton and FlashInfer. Its results were sent before (xdist's
    workerfinished, at sessionfinish). Left to xdist, every worker waits for the controller to end
    it after the last run anywhere, and all of them then free their CUDA contexts at once, which
    the controller waits for: on an H100 machine the in-box matrix took 22.5-22.8 s this way, 22.9-23.2
    s left to xdist (alternating, one machine)."""
    if hasattr(config, "workerinput"):
        atexit.register(os._exit, 0)
        config.add_cleanup(_run_exit_handlers)  # registered early: the cleanups run last to first


def _run_exit_handlers() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()  # CPython's own at-exit step, which ends here with the os._exit above


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _exit_without_teardown(config)
    if _is_xdist_controller(config):
        parallel_spawn.install()
    _split_threads(config)
    _default_timeout(config)
    config._conformance_selection = _selection(config)
    config.pluginmanager.register(_Recorder(config), "conformance-recorder")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """An xdist worker sets up torch's CUDA state (on the context kit.plugin.cuda_context began) before its
    first run rather than in it, where the run's time would count it."""
    if hasattr(session.config, "workerinput") and any(_run_of(item.nodeid) for item in session.items):
        from kit.harness.runner import make_device_context
        make_device_context()


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session):
    """The xdist controller loads its catalog once it has started its workers (in xdist's
    sessionstart, wrapped here): its torch import (4-5 s on an H100 machine without bytecode, 1.5 s
    with) overlaps theirs instead of delaying them. A bad `--cases` is a usage error here."""
    yield
    _cases(session.config._conformance_selection)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: each worker keeps to one backend (kit.plugin.worker_affinity)."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from kit.plugin.worker_affinity import BackendAffinityScheduling
    groups = _groups(config._conformance_selection)
    return BackendAffinityScheduling(config, log, lambda nodeid: groups.get(_run_of(nodeid) or ""))
