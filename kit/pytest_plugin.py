"""pytest integration: options, parametrization over backend x mode x exec x case,
KNOWN_FAILURES.md as strict expected failures, and --results-json written by the
controller (correct under xdist: each run's record travels back on its report;
a worker that dies is recorded as a crash of the case it was running)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from kit import known_failures
from kit.catalog import load_catalog, resolve_set
from kit.modes import EXECS, MODES, parse_exec, parse_mode
from kit.record import CRASH, FAIL, RunResult, parse_run_id, repro_command, run_id
from kit.registry import UnknownBackend, backend_label, known_backends, load_backend
from kit.results import REPO, device_name, to_record, versions, write_results

RECORD_KEY = "conformance_record"
WRITE_EVERY_S = 2.0  # an interrupted run keeps what finished


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
    g.addoption("--known-failures", default=None,
                help="expected-failures file (default: the kit's KNOWN_FAILURES.md, if present)")


def _known_failures(path):
    default = REPO / "KNOWN_FAILURES.md"
    if path is None:
        return known_failures.load(default) if default.exists() else []
    return known_failures.load(path)


def _selection(config):
    """Parsed options; a bad value is a usage error that says what is known or how to fix it."""
    opt = config.getoption
    specs = _csv(opt("--backend")) or known_backends()
    try:
        return dict(
            labels={spec: backend_label(spec) for spec in specs},
            modes=[parse_mode(m) for m in _csv(opt("--mode"))] or list(MODES),
            execs=[parse_exec(e) for e in _csv(opt("exec_"))] or list(EXECS),
            case_set=resolve_set(opt("--case-set")),
            catalog_target=opt("--cases"),
            catalog=load_catalog(opt("--cases")),
            known=_known_failures(opt("--known-failures")),
            device=device_name(),
        )
    except (UnknownBackend, ValueError, ImportError, AttributeError, TypeError) as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc):
    if "conformance_run" not in metafunc.fixturenames:
        return
    sel = metafunc.config._conformance_selection
    params = []
    for spec, label in sel["labels"].items():
        for mode in sel["modes"]:
            for exec_ in sel["execs"]:
                for case in sel["catalog"].cases(sel["case_set"], mode):
                    entry = known_failures.match(sel["known"], label, mode.value, exec_.value, case.name,
                                                 sel["device"])
                    marks = [] if entry is None else [pytest.mark.xfail(
                        strict=True, raises=KnownFailureHit,
                        reason=f"{entry.id} expects [{entry.failure_class}]: {entry.reason} ({entry.where})")]
                    run = (spec, label, case, exec_, entry, sel["catalog_target"])
                    params.append(pytest.param(run, marks=marks,
                                               id=run_id(label, mode.value, exec_.value, case.name)))
    metafunc.parametrize("conformance_run", params)


def _last_words_path(results_path, nodeid: str) -> Path:
    return Path(f"{results_path}.lost") / (hashlib.sha1(nodeid.encode()).hexdigest() + ".json")


@pytest.fixture
def record_conformance(request):
    def record(result):
        request.node.user_properties.append((RECORD_KEY, json.dumps(to_record(result))))
        if result.device_lost:
            _end_process(request.config, request.node.nodeid, result)
    return record


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


class _Recorder:
    """Collects records from call reports (on the xdist controller they arrive from workers)."""

    def __init__(self, config):
        self.config = config
        self.path = config.getoption("--results-json")
        self.writes = bool(self.path) and not hasattr(config, "workerinput")  # the controller, or a plain run
        self.records = {}
        self.last_write = 0.0
        self.spec_of = {label: spec for spec, label in config._conformance_selection["labels"].items()}

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            for key, value in report.user_properties:
                if key == RECORD_KEY:
                    self.records[report.nodeid] = json.loads(value)
        elif report.when == "???" and report.failed and "test_conformance[" in report.nodeid:
            self.records[report.nodeid] = self._crash_record(report)  # xdist: the worker died
        else:
            return
        if time.monotonic() - self.last_write > WRITE_EVERY_S:
            self._write()

    def _crash_record(self, report):
        if self.path:
            lost = _last_words_path(self.path, report.nodeid)
            if lost.exists():  # the worker ended itself after a device fault, leaving its record
                record = json.loads(lost.read_text())
                lost.unlink()
                return record
        sel = self.config._conformance_selection
        label, mode, exec_, name = parse_run_id(report.nodeid.split("[", 1)[1].rstrip("]"))
        case = sel["catalog"].find_case(parse_mode(mode), name)
        spec = self.spec_of.get(label, label)
        result = RunResult(backend=label, mode=mode, exec=exec_, case=name, dtype=case.dtype, outcome=FAIL,
                           failure_class=CRASH, message=f"the test process died: {report.longrepr}",
                           repro=repro_command(spec, mode, exec_, name, sel["catalog_target"]),
                           versions=versions(load_backend(spec)))
        return to_record(result)

    def _write(self):
        if self.writes:
            write_results(self.path, list(self.records.values()))
            self.last_write = time.monotonic()

    def pytest_sessionfinish(self, session):
        self._write()
        if self.writes:
            shutil.rmtree(f"{self.path}.lost", ignore_errors=True)


def pytest_configure(config):
    config._conformance_selection = _selection(config)
    config.pluginmanager.register(_Recorder(config), "conformance-recorder")
