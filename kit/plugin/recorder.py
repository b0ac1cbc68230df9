"""--results-json, written by the controller (correct under xdist: each run's record travels back
on its report; a worker that dies is recorded as a crash of the run it was running), and the
progress lines of a long run."""
from __future__ import annotations

import json
import shutil
import subprocess
from typing import Dict, List, Optional

import pytest

from kit.harness.child import ending
from kit.harness.environment import to_record, versions
from kit.harness.registry import load_backend
from kit.plugin import progress
from kit.plugin.device_lost import last_words_path, leave_record
from kit.plugin.selection import SELECTION, run_of
from kit.report.record import COMPLETE, CRASH, FAIL, INTERRUPTED, RUNNING, parse_run_id, run_id
from kit.report.results import GrowingResults, page_path

RECORD_KEY = "conformance_record"


def _exit_code(node) -> Optional[int]:
    """The exit code of a dead xdist worker's process (its execnet gateway's), None if unknown."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    try:
        return popen.wait(timeout=10) if popen is not None else None
    except subprocess.TimeoutExpired:
        return None


class Recorder:
    """Collects records from reports (on the xdist controller they arrive from workers), and
    writes them with what the session selected and how it ended (kit.report.record.ResultsFile):
    marked `running` before the first run, each record appended as its run ends (a session that
    dies leaves every finished run's record), the file written whole and sorted at the end."""

    def __init__(self, config):
        self.config = config
        self.path = config.getoption("--results-json")
        self.writes = bool(self.path) and not hasattr(config, "workerinput")  # the controller, or a plain run
        self.records: Dict[str, dict] = {}
        self.file = GrowingResults(self.path) if self.writes else None
        self.selected: Optional[List[str]] = None  # run ids, once collection is known
        self.kit_tests: List[str] = []  # the file of each of the session's other tests (the kit's own)
        self.status: Optional[str] = None  # how the session ended, once it has
        self.started = False  # runs began: from then on the file is this session's
        self.progress: Optional[progress.Progress] = None  # once the runs are known
        self.catalog: Optional[List[str]] = None  # Selection.catalog_ids, at the first write (loaded late)
        self.shard: Optional[dict] = None  # --shard: Selection.recorded_shard, at the first write

    def _select(self, nodeids) -> None:
        if self.selected is None:
            nodeids = list(nodeids)
            runs = [run_of(nodeid) for nodeid in nodeids]
            self.selected = [rid for rid in runs if rid is not None]
            self.kit_tests = [nodeid.partition("::")[0] for nodeid, run in zip(nodeids, runs) if run is None]

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
            self.progress = progress.Progress([parse_run_id(rid)[0] for rid in self.selected]
                                              + [progress.kit_tests(path) for path in self.kit_tests],
                                              self.config.getoption("--progress-every"))
            if self.writes:
                self.file.start(self._run_section(RUNNING))

    def _run_section(self, status: str) -> dict:
        if self.catalog is None:
            sel = self.config.stash[SELECTION]
            self.catalog, shard = sel.catalog_ids(), sel.recorded_shard()
            self.shard = None if shard is None else shard.section()
        run = dict(status=status, selected=self.selected or [], catalog=self.catalog)
        return run if self.shard is None else dict(run, shard=self.shard)

    def _show_progress(self, group: str, seconds: float, report) -> None:
        if self.progress is not None and not hasattr(self.config, "workerinput"):
            self._say(*self.progress.add(group, seconds, getattr(report, "node", None)))  # xdist: the worker

    def pytest_runtest_logreport(self, report):
        if run_of(report.nodeid) is None:
            if report.when == "call" or (report.when == "setup" and not report.passed):  # once a test
                self._show_progress(progress.kit_tests(report.nodeid.partition("::")[0]), report.duration, report)
            return
        record = next((json.loads(v) for k, v in report.user_properties if k == RECORD_KEY), None)
        if record is None and report.failed and report.nodeid not in self.records:
            record = self._crash_record(report)  # the worker died, or the test failed before its verdict
        if record is None or self.records.get(report.nodeid) == record:
            return  # a report of the run's teardown carries the record its call did
        known = report.nodeid in self.records
        if not known:
            self._show_progress(record["backend"], record.get("seconds") or 0.0, report)
        self.records[report.nodeid] = record
        if self.writes and self.started:
            if known:  # a record that replaces another: the file whole (no run should give two)
                self.file.finish(list(self.records.values()), self._run_section(RUNNING))
            else:
                self.file.append(record)

    def _crash_record(self, report):
        if self.path:
            lost = last_words_path(self.path, report.nodeid)
            if lost.exists():  # the worker ended itself (a device fault, a run stuck), leaving its record
                record = json.loads(lost.read_text())
                lost.unlink()
                return record
        if report.when == "???":  # xdist: the worker died
            code = _exit_code(getattr(report, "node", None))
            died = "died" if code is None else f"died, {ending(code)}"
            record = self._crash_of(report.nodeid, f"the test process {died} (a hard crash, or stuck past the time "
                                                   f"limit): {report.longrepr}")
            self._say(f"{run_of(report.nodeid)}: its worker {died}; recorded as a crash; repro: {record['repro']}")
            return record
        last = (report.longreprtext.strip().splitlines() or ["?"])[-1]
        return self._crash_of(report.nodeid, f"the run ended without a verdict ({report.when}): {last}")

    def _say(self, *lines: str) -> None:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if lines and terminal is not None:
            if getattr(terminal, "_width_of_current_line", 0):  # after the dots of -q, on a line of its own
                terminal.write("\n")
            for line in lines:
                terminal.write_line(line)

    def _crash_of(self, nodeid: str, message: str, limit: Optional[float] = None) -> dict:
        run = self.config.stash[SELECTION].run_named(run_of(nodeid))
        return to_record(run.record(limit, outcome=FAIL, failure_class=CRASH, message=message,
                                    versions=versions(load_backend(run.spec))))

    def stuck(self, nodeid: str, message: str) -> Optional[str]:
        """A run stuck in native code past its limit is about to end this process (kit.harness.timeout):
        its crash record goes into the results file, which says the session was interrupted (the
        runs after it have none); in an xdist worker, where the controller finds it."""
        record = self._crash_of(nodeid, message, self.config.getoption("timeout", None))
        if self.writes:
            self.records[nodeid] = record
            self.file.finish(list(self.records.values()), self._run_section(INTERRUPTED))
            return (f"{nodeid}: recorded as a crash in {self.path}; the runs after it did not run (under -n "
                    f"the others go on)")
        if self.path:
            leave_record(self.path, nodeid, record)
        return f"{nodeid}: recorded as a crash"

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        """What a user needs after a session: what the CPU's default case set left out, where the
        results are and how complete, and what to run next."""
        if hasattr(self.config, "workerinput") or not self.selected:
            return
        for line in self.config.stash[SELECTION].narrowed():
            terminalreporter.write_line(f"narrowed: {line}")
        if not self.path:
            terminalreporter.write_line("results: none written (--results-json PATH writes them)")
            return
        if self.file is None or not self.started:
            return
        recorded = len(self.records)
        status = self.status or RUNNING
        terminalreporter.write_line(f"results: {self.path} ({status}: {recorded} of {len(self.selected)} selected "
                                    f"runs recorded)")
        terminalreporter.write_line(f"next: python -m matrix check --fresh {self.path}   (the gate: every failure "
                                    f"known, verdicts as committed)")
        terminalreporter.write_line(f"      python -m matrix html --results {self.path}   (the page: "
                                    f"{page_path([self.path])})")

    def pytest_sessionfinish(self, session, exitstatus):
        recorded = {run_id(r["backend"], r["mode"], r["exec"], r["case"]) for r in self.records.values()}
        whole = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and recorded >= set(self.selected or [])
        self.status = COMPLETE if whole else INTERRUPTED
        if self.writes and (self.started or self.records):  # never for --co or a run that selected nothing
            self.file.finish(list(self.records.values()), self._run_section(self.status))
            shutil.rmtree(f"{self.path}.lost", ignore_errors=True)
