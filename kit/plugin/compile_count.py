"""How many kernels the session compiled (kit.harness.compiles counts them, by library), in its
summary: each test's compiles travel on its report (from an xdist worker too) and the controller
adds them up, so that a session that compiled nothing says so and one that did says how much of a
warmup it lacked."""
from __future__ import annotations

import collections
import json

import pytest

from kit import spend
from kit.plugin.selection import run_of

KEY = "kit_compiles"


class CompileCount:
    def __init__(self):
        self.counts: "collections.Counter[str]" = collections.Counter()
        self.seconds = 0.0
        self.runs = 0  # conformance runs reported: a session of none says nothing

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        before = spend.snapshot()
        yield
        spent = spend.since(before)
        if spend.compiles(spent):
            compiled = {c: spent["counts"][c] for c in spend.COMPILERS if spent["counts"].get(c)}
            seconds = sum(spent["seconds"].get(c, 0.0) for c in spend.COMPILERS)
            item.user_properties.append((KEY, json.dumps(dict(counts=compiled, seconds=seconds))))

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and run_of(report.nodeid) is not None:
            self.runs += 1
        for key, value in report.user_properties:
            if key == KEY and report.when == "call":
                told = json.loads(value)
                self.counts.update(told["counts"])
                self.seconds += told["seconds"]

    def pytest_terminal_summary(self, terminalreporter, config):
        if hasattr(config, "workerinput") or not self.runs:
            return
        terminalreporter.write_line(summary(self.counts, self.seconds))


def summary(counts, seconds: float) -> str:
    """The session's line: its compiles by library, or that it had none to do."""
    total = sum(counts.values())
    if not total:
        return "compiles: 0 (every kernel the runs loaded came from the caches)"
    by_library = ", ".join(f"{c.split('.', 1)[1]} {counts[c]}" for c in spend.COMPILERS if counts.get(c))
    return (f"compiles: {total} ({by_library}; {seconds:.1f} s inside the runs): `python -m kit warmup` over "
            f"the same selection builds them once, before the runs")
