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
    assert "record 1 (be-decode-eager-a): outcome 'passed' is not one of pass, fail, unsupported" in proc.stderr


def test_failure_with_an_unknown_class_is_refused_by_write(project):
    committed = project["results_dir"] / "cpu.json"
    _with_record(committed, outcome="fail", failure_class="wrong")
    proc = run_matrix("write", project)
    assert proc.returncode == 1
    assert len(_lines(proc)) == 1 and "failure class 'wrong' of a run with outcome fail is not one of kernel" in proc.stderr, proc.stderr


def test_a_record_missing_fields_or_with_fields_no_record_has_is_refused(project, tmp_path):
    """A record without its dtype and device_lost, with a stray key: refused, naming them."""
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b"), rec("c", "fail", "kernel")])
    doc = json.loads(fresh.read_text())
    del doc["records"][1]["dtype"], doc["records"][1]["device_lost"]
    doc["records"][1]["verdcit"] = "pass"
    fresh.write_text(json.dumps(doc))
    proc = run_matrix("check", project, "--fresh", str(fresh))
    assert proc.returncode == 1 and len(_lines(proc)) == 1, proc.stderr
    assert "record 2 (be-decode-eager-b): missing dtype, device_lost; fields no record has: verdcit" in proc.stderr


def test_a_class_of_another_outcome_is_refused_and_kit_errors_are_no_verdict(project, tmp_path):
    """An error's class is the environment's or the kit's, never a failure class; a pass has none."""
    fresh = tmp_path / "fresh.json"
    for fields, said in ((dict(outcome="error", failure_class="kernel"), "of a run with outcome error is not one of "
                                                                          "environment, kit-error"),
                         (dict(outcome="pass", failure_class="kernel"), "of a run with outcome pass is not one of None"),
                         (dict(outcome="error", failure_class="kit-error"), "1 runs stopped")):
        write_fresh(fresh, [rec("a"), rec("b"), rec("c", "fail", "kernel")])
        _with_record(fresh, **fields)
        proc = run_matrix("check", project, "--fresh", str(fresh))
        assert proc.returncode == 1 and len(_lines(proc)) == 1 and said in proc.stderr, proc.stderr
