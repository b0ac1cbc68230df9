"""Committed results and tables are a function of the verdicts: regenerating with nothing changed
changes no byte, and `matrix write` touches no file whose contents stay the same."""
from __future__ import annotations

import json

from kit.report.results import write_results
from tests.test_matrix import project, rec, run_matrix  # noqa: F401

CASES = ("a", "b", "c")


def _regenerate(p, run: int, verdict_of_b: str = "pass"):
    """What the README's regeneration does: a run writes the committed file (with this run's
    timings, date, commit and last-digit error moves), then `matrix write`."""
    records = [{**rec(c, "fail" if c == "c" else verdict_of_b if c == "b" else "pass",
                      "kernel" if c == "c" else "graph" if (c == "b" and verdict_of_b == "fail") else None),
                "seconds": 0.01 * (run + 1) + i, "date": f"2026-11-{20 + run}", "kit_commit": f"commit{run}",
                "max_err": 0.0261719 + run * 1e-9, "tol": 0.000101066 + run * 1e-12,
                "message": f"crash at /env{run}/lib/python3.11/site-packages/sglang/a.py:3" if c == "c" else ""}
               for i, c in enumerate(CASES)]
    ids = [f"be-decode-eager-{c}" for c in CASES]
    write_results(p["results_dir"] / "cpu.json", records,
                  run=dict(status="complete", selected=ids[::1 - 2 * (run % 2)], catalog=ids))
    proc = run_matrix("write", p)
    assert proc.returncode == 0, proc.stderr
    return proc


def _files(p):
    return {path: path.read_bytes() for path in (p["readme_path"], p["results_dir"] / "cpu.json")}


def test_two_regenerations_with_no_verdict_changed_are_byte_identical(project):
    _regenerate(project, 1)
    first = _files(project)
    _regenerate(project, 2)
    assert _files(project) == first
    record = json.loads((project["results_dir"] / "cpu.json").read_text())["records"][0]
    assert not {"seconds", "date", "kit_commit"} & set(record) and record["max_err"] == 0.0262
    assert "crash at site-packages/sglang/a.py:3" in (project["results_dir"] / "cpu.json").read_text()


def test_a_changed_verdict_changes_the_files(project):
    _regenerate(project, 1)
    first = _files(project)
    _regenerate(project, 2, verdict_of_b="fail")
    after = _files(project)
    assert all(after[path] != first[path] for path in first)


def test_write_with_nothing_changed_touches_no_file(project):
    _regenerate(project, 1)
    paths = list(_files(project))
    stamps = {path: path.stat().st_mtime_ns for path in paths}
    proc = run_matrix("write", project)
    assert proc.returncode == 0 and "nothing changed" in proc.stdout, proc.stdout
    assert {path: path.stat().st_mtime_ns for path in paths} == stamps


def test_gate_fails_on_a_committed_file_not_in_committed_form(project):
    _regenerate(project, 1)
    path = project["results_dir"] / "cpu.json"
    doc = json.loads(path.read_text())
    doc["records"][0]["seconds"] = 1.5
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    proc = run_matrix("check", project)
    assert proc.returncode == 1
    assert "cpu.json: not in its committed form" in proc.stderr and "matrix write" in proc.stderr, proc.stderr
