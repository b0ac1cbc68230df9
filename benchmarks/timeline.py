"""Where a timed matrix run's seconds go: a pytest plugin (`-p benchmarks.timeline`) that,
in every process of the session (the xdist controller and each worker), writes when the
process started, when pytest had configured it (imports done), when collection began and
ended, when each test ran (its CPU seconds, and where its seconds went: kit.spend), when the session's end began and ended
(sessionfinish: xdist stops its workers, the results are written), and when the interpreter
began to exit, to
`$KIT_TIMELINE_DIR/<worker id>.jsonl`, a line as it happens (a worker that dies keeps
what it wrote). `phases()` reads them back into the figures a benchmark row shows.
"""
from __future__ import annotations

import atexit
import json
import os
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from kit import spend

ENV = "KIT_TIMELINE_DIR"


def _process_start() -> float:
    """Wall-clock time this process was created (Linux /proc); else when this module loaded."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class _Timeline:
    def __init__(self, config, directory: str):
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        self.file = open(Path(directory) / f"{worker}.jsonl", "a", buffering=1)
        self._line(event="start", t=_process_start())
        self._line(event="configure", t=time.time())
        atexit.register(self._exit)

    def _line(self, **fields) -> None:
        self.file.write(json.dumps(fields) + "\n")

    def pytest_collection(self, session):
        self._line(event="collect", t=time.time())

    def pytest_collection_finish(self, session):
        self._line(event="collected", t=time.time())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start, cpu, before = time.time(), time.process_time(), spend.snapshot()
        yield
        self._line(event="test", id=item.nodeid.split("[", 1)[-1].split("]")[0], t=start, end=time.time(),
                   cpu=round(time.process_time() - cpu, 4), spent=spend.since(before))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionfinish(self, session):
        self._line(event="finish", t=time.time())
        yield
        self._line(event="finished", t=time.time())

    def pytest_unconfigure(self, config):
        self._line(event="end", t=time.time())

    def _exit(self):
        self._line(event="exit", t=time.time())
        self.file.close()


def pytest_configure(config):
    directory = os.environ.get(ENV)
    if directory:
        config.pluginmanager.register(_Timeline(config, directory), "kit-timeline")


def _read(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_events(directory: str) -> List[dict]:
    """Every process's test events, in file order."""
    return [e for f in sorted(Path(directory).glob("*.jsonl")) for e in _read(f) if e["event"] == "test"]


def test_seconds(directory: str) -> Dict[str, float]:
    """Seconds each process (by its timeline's name: `gw0`, ..., `main`) spent in tests."""
    return {f.stem: sum(e["end"] - e["t"] for e in _read(f) if e["event"] == "test")
            for f in sorted(Path(directory).glob("*.jsonl"))}


def phases(directory: str, t0: float, seconds: float) -> Optional[Dict[str, float]]:
    """From the workers' timelines (the controller's, without xdist) of a run started at `t0`
    and lasting `seconds`: how many processes ran tests, when they were ready (median and
    last first test start), the seconds in tests, the share of worker time spent in them,
    the share of test seconds the workers spent on a CPU (where recorded), each worker's
    first test of each backend (which loads it: CUDA context, imports, kernels) and the
    rest's median, and when the last test ended (the rest of `seconds` is the session's end:
    workers exiting, the last results write)."""
    files = sorted(Path(directory).glob("*.jsonl"))
    workers = [f for f in files if f.stem != "main"] or files
    ready, busy, first_loads, rest, cpu, last = [], 0.0, 0.0, [], [], 0.0
    for f in workers:
        tests = [e for e in _read(f) if e["event"] == "test"]
        if not tests:
            continue
        ready.append(min(e["t"] for e in tests) - t0)
        last = max([last] + [e["end"] - t0 for e in tests])
        cpu += [(e["cpu"], e["end"] - e["t"]) for e in tests if "cpu" in e]
        seen = set()
        for e in sorted(tests, key=lambda e: e["t"]):
            took = e["end"] - e["t"]
            busy += took
            backend = e["id"].split("-", 1)[0]
            if backend in seen:
                rest.append(took)
            else:
                seen.add(backend)
                first_loads += took
    if not ready:
        return None
    return dict(workers=len(ready), workers_ready_median_s=round(statistics.median(ready), 2),
                workers_ready_last_s=round(max(ready), 2),
                test_s=round(busy, 1), busy_share=round(busy / (len(ready) * seconds), 3),
                cpu_share=round(sum(c for c, _ in cpu) / sum(w for _, w in cpu), 3) if cpu else None,
                first_of_backend_s=round(first_loads, 1),
                other_runs_median_s=round(statistics.median(rest), 4) if rest else 0.0,
                last_run_end_s=round(last, 2))
