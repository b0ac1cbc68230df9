"""`python -m matrix compare`: two runs' verdicts side by side, whatever their devices."""
from __future__ import annotations

from kit.report.record import read_results_file
from kit.report.results import write_results
from matrix import compare
from matrix.__main__ import main
from tests.test_matrix import rec


def _files(tmp_path):
    write_results(tmp_path / "old.json", [rec("a"), rec("b", "fail", "kernel"), rec("c"), rec("u", "unsupported"),
                                          rec("d", backend="gone")])
    write_results(tmp_path / "new.json", [rec("a", device="GPU Y"), rec("b", device="GPU Y"),
                                          rec("c", "fail", "graph", device="GPU Y"), rec("u", "unsupported", device="GPU Y"),
                                          rec("e", "fail", "crash", backend="new", device="GPU Y")])
    return read_results_file(tmp_path / "old.json"), read_results_file(tmp_path / "new.json")


def test_changed_verdicts_are_the_runs_both_hold_that_differ(tmp_path):
    old, new = _files(tmp_path)
    assert compare.changed(old, new) == [("be-decode-eager-b", "fail [kernel]", "pass"),
                                         ("be-decode-eager-c", "pass", "fail [graph]")]


def test_report_counts_failures_per_backend_over_executed_runs(tmp_path):
    old, new = _files(tmp_path)
    text = compare.report(old, new)
    assert "4 runs in both, 2 changed verdict" in text
    assert "  be: 1/3 (33%) -> 1/3 (33%)" in text  # the unsupported run is not executed
    assert "  gone: 0/1 (0%) -> -" in text and "  new: - -> 1/1 (100%)" in text
    assert "      1  pass -> fail [graph]" in text and "  be-decode-eager-b: fail [kernel] -> pass" in text


def test_command_prints_the_report_and_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    _files(tmp_path)
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0
    assert "2 changed verdict" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{")
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "bad.json")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0] and "not a results file" in err[0]
