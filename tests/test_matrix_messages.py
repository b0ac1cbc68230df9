"""The gate's messages point at the cause: one line for one problem, no consequences of it
reported as problems of their own."""
from __future__ import annotations

import json

from tests.test_matrix import kf_text, project, rec, run_matrix, write_fresh  # noqa: F401


def _lines(proc):
    return proc.stderr.strip().splitlines()


def test_interrupted_fresh_run_is_only_interrupted(project, tmp_path):
    """The committed failure's entry (KF-1) is not reported stale because a partial run lacks it."""
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a")], selected=["be-decode-eager-a", "be-decode-eager-b", "be-decode-eager-c"],
                status="interrupted")
    proc = run_matrix("check", project, "--fresh", str(fresh))
    assert proc.returncode == 1
    assert len(_lines(proc)) == 1 and "interrupted run (interrupted): 1 of 3" in proc.stderr, proc.stderr


def test_malformed_known_failures_row_is_its_own_line_only(project):
    """Without readable entries every failure would look uncovered and every table stale: not said."""
    project["known_path"].write_text(kf_text("| KF-1 | be | decode | eagr | c | * | kernel | xfail | why | tests/toys |"))
    proc = run_matrix("check", project)
    assert proc.returncode == 1
    assert len(_lines(proc)) == 1 and "exec 'eagr' is not eager, graph or *" in proc.stderr, proc.stderr


def test_missing_known_failures_file_is_one_line(project):
    project["known_path"].unlink()
    proc = run_matrix("check", project)
    assert proc.returncode == 1
    assert len(_lines(proc)) == 1 and "no such file" in proc.stderr, proc.stderr


def _with_record(path, **fields):
    doc = json.loads(path.read_text())
    doc["records"][0].update(fields)
    path.write_text(json.dumps(doc))


def test_record_with_an_unknown_outcome_is_refused(project, tmp_path):
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b"), rec("c", "fail", "kernel")])
    _with_record(fresh, outcome="passed")
    proc = run_matrix("check", project, "--fresh", str(fresh))
    assert proc.returncode == 1
    assert len(_lines(proc)) == 1, proc.stderr
    assert "record be-decode-eager-a: outcome 'passed' is not one of pass, fail, unsupported" in proc.stderr


def test_failure_with_an_unknown_class_is_refused_by_write(project):
    committed = project["results_dir"] / "cpu.json"
    _with_record(committed, outcome="fail", failure_class="wrong")
    proc = run_matrix("write", project)
    assert proc.returncode == 1
    assert len(_lines(proc)) == 1 and "failure class 'wrong' is not one of kernel" in proc.stderr, proc.stderr
