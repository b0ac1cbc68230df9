"""pytest integration: options, parametrization over backend x mode x exec x case,
and --results-json written by the controller (correct under xdist: each run's
record travels back on its test report)."""
from __future__ import annotations

import json

import pytest

import cases as catalog
from kit.modes import EXECS, MODES, parse_exec, parse_mode
from kit.registry import UnknownBackend, backend_label, builtin_backends
from kit.results import to_record, write_results

RECORD_KEY = "conformance_record"


def _csv(values):
    return [v for item in values for v in item.split(",") if v]


def pytest_addoption(parser):
    g = parser.getgroup("conformance")
    g.addoption("--backend", action="append", default=[],
                help="backend name or module:attr (repeat or comma-separate); default: every in-box backend")
    g.addoption("--mode", action="append", default=[], help="decode, extend, target_verify, draft_extend_v2")
    g.addoption("--exec", action="append", default=[], dest="exec_", help="eager, graph")
    g.addoption("--case-set", default="auto", help="smoke, full, or auto (full with CUDA, smoke without)")
    g.addoption("--results-json", default=None, help="write one record per run to this file")


def _selection(config):
    """Parsed --backend/--mode/--exec/--case-set; a bad value is a usage error naming the known ones."""
    opt = config.getoption
    specs = _csv(opt("--backend")) or sorted(builtin_backends())
    try:
        return dict(
            labels={spec: backend_label(spec) for spec in specs},
            modes=[parse_mode(m) for m in _csv(opt("--mode"))] or list(MODES),
            execs=[parse_exec(e) for e in _csv(opt("exec_"))] or list(EXECS),
            case_set=catalog.resolve_set(opt("--case-set")),
        )
    except (UnknownBackend, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc):
    if "conformance_run" not in metafunc.fixturenames:
        return
    sel = metafunc.config._conformance_selection
    params, ids = [], []
    for spec, label in sel["labels"].items():
        for mode in sel["modes"]:
            for exec_ in sel["execs"]:
                for case in catalog.cases(sel["case_set"], mode):
                    params.append((spec, label, case, exec_))
                    ids.append(f"{label}-{mode.value}-{exec_.value}-{case.name}")
    metafunc.parametrize("conformance_run", params, ids=ids)


@pytest.fixture
def record_conformance(request):
    def record(result):
        request.node.user_properties.append((RECORD_KEY, json.dumps(to_record(result))))
    return record


class _Recorder:
    """Collects records from call reports (on the xdist controller they arrive from workers)."""

    def __init__(self, config):
        self.config = config
        self.records = {}

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == RECORD_KEY:
                self.records[report.nodeid] = json.loads(value)

    def pytest_sessionfinish(self, session):
        path = self.config.getoption("--results-json")
        if path and not hasattr(self.config, "workerinput"):  # the controller (or a plain run) writes
            write_results(path, list(self.records.values()))


def pytest_configure(config):
    config._conformance_selection = _selection(config)
    config.pluginmanager.register(_Recorder(config), "conformance-recorder")
