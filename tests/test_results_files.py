"""Results files lose nothing and prove nothing they do not hold: --co writes nothing, a narrowed
or interrupted run says so in the file, `matrix write` refuses it, and the gate fails on nothing."""
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from kit.report.record import read_results_file
from kit.report.results import GrowingResults, results_text, write_results
from tests.test_matrix import (REPO, SMOKE_DECODE, known_failures_session, project, rec, run_matrix,  # noqa: F401
                               run_suite, write_fresh)

TOYS = "tests.toys.crashing"


def _doc(tmp_path):
    return json.loads((tmp_path / "results.json").read_text())


@pytest.fixture
def narrowed_suite(tmp_path_factory):
    """A complete session of two toy backends' smoke decode runs, eager and graph."""
    return known_failures_session(tmp_path_factory)


def test_collect_only_leaves_the_results_file_alone(tmp_path):
    out = tmp_path / "results.json"
    out.write_text("precious\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--co", "-q",
                           "-p", "no:cacheprovider", "--results-json", str(out)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert out.read_text() == "precious\n"


def test_file_records_what_was_selected(narrowed_suite):
    proc, _, folder = narrowed_suite
    assert proc.returncode == 0, proc.stdout[-1500:]
    run = _doc(folder)["run"]
    assert run["status"] == "complete"
    assert sorted(run["selected"]) == sorted(f"{b}-decode-{e}-{c}" for b in ("toy_stale_replay", "toy_hard_crash")
                                             for e in ("eager", "graph") for c in SMOKE_DECODE)
    assert set(run["selected"]) < set(run["catalog"])
    assert any(rid.startswith("triton-extend-graph-") for rid in run["catalog"])


def test_write_refuses_a_narrowed_run(project, narrowed_suite):
    """`matrix write` cannot replace committed results with a narrowed run (docs/running.md: Regenerating the tables)."""
    proc, _, folder = narrowed_suite
    assert proc.returncode == 0, proc.stdout[-1500:]
    shutil.copy(folder / "results.json", project["results_dir"] / "cpu.json")
    before = project["readme_path"].read_text()
    proc = run_matrix("write", project)
    assert proc.returncode == 1
    line = [l for l in proc.stderr.splitlines() if "cpu.json" in l]
    assert len(line) == 1 and "partial results: lacks" in line[0] and "of the catalog's" in line[0], proc.stderr
    assert project["readme_path"].read_text() == before


def test_interrupted_session_keeps_what_finished_and_says_so(project, tmp_path):
    """Ctrl-C stops the session (KeyboardInterrupt is not a backend crash); the file keeps the finished
    run, is marked interrupted, and the gate says 'interrupted run', not 'regenerate'."""
    proc, records = run_suite(tmp_path, f"{TOYS}:InterruptBackend", (), "--exec", "eager")
    assert proc.returncode == 2, proc.stdout[-1500:]
    doc = _doc(tmp_path)
    assert doc["run"]["status"] == "interrupted"
    assert [r["case"] for r in doc["records"]] == [SMOKE_DECODE[0]] and doc["records"][0]["outcome"] == "pass"
    proc = run_matrix("check", project, "--fresh", str(tmp_path / "results.json"))
    assert proc.returncode == 1
    assert f"interrupted run (interrupted): 1 of {len(SMOKE_DECODE)} selected runs recorded" in proc.stderr, proc.stderr
    assert "regenerate the committed results" not in proc.stderr


def test_process_ending_with_exit_code_0_fails_the_gate(project, tmp_path):
    """Without xdist a backend calling os._exit(0) ends pytest 'green': the file it leaves is marked
    running (not complete), so `pytest && matrix check` still fails; it holds the record of the run
    that ended before (appended as it ended, not on a timer the death cut short)."""
    proc, _ = run_suite(tmp_path, f"{TOYS}:ExitZeroBackend", (), "--exec", "eager")
    assert proc.returncode == 0
    doc = _doc(tmp_path)
    assert doc["run"]["status"] == "running"
    assert [(r["case"], r["outcome"]) for r in doc["records"]] == [(SMOKE_DECODE[0], "pass")], doc["records"]
    proc = run_matrix("check", project, "--fresh", str(tmp_path / "results.json"))
    assert proc.returncode == 1 and "interrupted run (running): 1 of" in proc.stderr, proc.stderr


def _bytes_written() -> int:
    """What this process has handed to write() so far (Linux: /proc/self/io's wchar)."""
    return int(dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())["wchar"])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="Linux's /proc/self/io counts the bytes written")
def test_a_growing_results_file_costs_each_record_once(tmp_path):
    """A session's file, written as its runs end, costs bytes linear in its records (a file written
    whole at each record costs their square), and reads whole, `running`, after every record."""
    path = tmp_path / "results.json"
    file = GrowingResults(path)
    run = dict(status="running", selected=[f"be-decode-eager-{n}" for n in range(400)], catalog=[])
    file.start(run)
    before = _bytes_written()
    for n in range(400):
        file.append(rec(str(n), message="x" * 200))
        if n in (0, 1, 399):
            written = read_results_file(path)
            assert (written.status, len(written.records)) == ("running", n + 1)
    assert _bytes_written() - before < 2 * path.stat().st_size
    file.finish([rec(str(n)) for n in range(400)], dict(run, status="complete"))
    assert path.read_text() == results_text([rec(str(n)) for n in range(400)], dict(run, status="complete"))


def test_results_files_have_the_umasks_mode(tmp_path):
    """0644 under umask 022, as any file a command writes (mkstemp's 0600 was kept before)."""
    old = os.umask(0o022)
    try:
        write_results(tmp_path / "r.json", [rec("a")])
        GrowingResults(tmp_path / "g.json").start(dict(status="running", selected=[], catalog=[]))
    finally:
        os.umask(old)
    assert {stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("r.json", "g.json")} == {0o644}


def test_gate_fails_on_nothing(project, tmp_path):
    empty, old, nothing_selected = tmp_path / "empty.json", tmp_path / "old.json", tmp_path / "none.json"
    empty.write_text('{"schema": 2, "records": []}')
    old.write_text('{"schema": 1, "records": []}')
    write_fresh(nothing_selected, [], selected=[])
    for path, message in [(empty, "no run list"), (old, "results schema 1, expected 2"),
                          (nothing_selected, "no runs: the session selected none")]:
        proc = run_matrix("check", project, "--fresh", str(path))
        assert proc.returncode == 1 and message in proc.stderr, (path, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_runs_fail_the_gate(project, tmp_path):
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("c", "fail", "kernel")], selected=["be-decode-eager-a", "be-decode-eager-b",
                                                                      "be-decode-eager-c"])
    proc = run_matrix("check", project, "--fresh", str(fresh))
    assert proc.returncode == 1 and "2 of 3 selected runs recorded (first missing: be-decode-eager-b)" in proc.stderr


def test_narrowed_fresh_run_is_compared_on_what_it_selected(project, tmp_path):
    """A run narrowed to case a (its catalog has a, b, c) agrees with the committed results on a."""
    fresh = tmp_path / "fresh.json"
    write_results(fresh, [rec("a")], run=dict(status="complete", selected=["be-decode-eager-a"],
                                              catalog=[f"be-decode-eager-{c}" for c in "abc"]))
    proc = run_matrix("check", project, "--fresh", str(fresh))
    assert proc.returncode == 0, proc.stderr
