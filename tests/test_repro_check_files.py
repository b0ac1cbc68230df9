"""`python -m kit.repro.check_files DIR --json OUT`: every standalone file of DIR run in a fresh process with
the kit not importable, one JSON row a file (its entries, the device, exit code, verdict line, seconds);
a file under `cuda/` where torch sees no CUDA device is skipped, and its row says why."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kit.report.known_failures import KnownFailure
from kit.repro.check_files import ROOT, _said, blocked_env, entries_linking, main, shows

FILES = {
    "fails.py": "print('batch 1/1 layer 0: max error 3 > limit 1: FAIL')\nprint('FAIL')\nraise SystemExit(1)\n",
    "passes.py": "print('PASS')\n",
    # A file that needs the kit: it must fail here as it would on a machine without the kit.
    "needs_kit.py": "import kit\nprint('PASS')\n",
    # A crash whose library prints notes after the traceback: the row names the exception, not the notes.
    "crashes.py": "import sys\nsys.excepthook = lambda *exc: (sys.__excepthook__(*exc), print('set VERBOSE=1', file=sys.stderr))\n"
                  "raise RuntimeError('full_kv_num_blocks was not declared')\n",
}


def test_each_file_runs_without_the_kit_and_its_row_is_written(tmp_path, capsys):
    files = tmp_path / "repro"
    files.mkdir()
    for name, text in FILES.items():
        (files / name).write_text(text)
    assert main([str(files), "--json", str(tmp_path / "out.json")]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    rows = {row["file"].rsplit("/", 1)[1]: row for row in report["files"]}
    assert sorted(rows) == sorted(FILES) and all(row["device"] == report["device"] for row in rows.values())
    assert (rows["fails.py"]["exit_code"], rows["fails.py"]["verdict"]) == (1, "FAIL")
    assert (rows["passes.py"]["exit_code"], rows["passes.py"]["verdict"], rows["passes.py"]["error"]) == (0, "PASS", "")
    needs_kit = rows["needs_kit.py"]
    assert needs_kit["exit_code"] == 1 and "the standalone file imported kit" in needs_kit["error"]
    assert rows["crashes.py"]["error"] == "RuntimeError: full_kv_num_blocks was not declared"
    assert all(row["entries"] == [] and row["skipped"] == "" and row["seconds"] >= 0 for row in rows.values())
    assert "fails.py: exit 1, 'FAIL'" in capsys.readouterr().out


def test_files_named_one_by_one_are_checked_in_that_order(tmp_path, capsys):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    assert main([str(tmp_path / "fails.py"), str(tmp_path / "passes.py"), "--json", str(tmp_path / "out.json")]) == 0
    rows = json.loads((tmp_path / "out.json").read_text())["files"]
    assert [(Path(r["file"]).name, r["verdict"]) for r in rows] == [("fails.py", "FAIL"), ("passes.py", "PASS")]
    with pytest.raises(SystemExit):
        main([str(tmp_path / "out.json"), "--json", str(tmp_path / "again.json")])
    assert "neither a directory nor a .py file" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs the cuda/ files")
def test_a_cuda_file_is_skipped_with_its_reason_where_torch_sees_no_cuda(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "KF-0.py").write_text("raise SystemExit('ran')\n")
    assert main([str(tmp_path / "cuda"), "--json", str(tmp_path / "out.json")]) == 0
    [row] = json.loads((tmp_path / "out.json").read_text())["files"]
    assert row["exit_code"] is None and row["skipped"].startswith("needs a CUDA device")


def test_a_row_names_the_entries_that_link_its_file():
    assert entries_linking(ROOT / "repro" / "cuda" / "KF-26.py") == ["KF-26"]
    assert set(entries_linking(ROOT / "repro" / "cuda" / "vllm_flashinfer_fp8.py")) == {"KF-65", "KF-92"}


def test_the_blocked_path_keeps_the_machines_own_after_it(tmp_path, monkeypatch):
    """An engine installed into a folder of its own (PYTHONPATH) stays importable, while the kit,
    even from a PYTHONPATH naming the repo, does not."""
    engine = tmp_path / "engine"
    (engine / "someengine").mkdir(parents=True)
    (engine / "someengine" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(engine), str(ROOT))))
    env = blocked_env(tmp_path / "blocked")
    assert subprocess.run([sys.executable, "-c", "import someengine"], env=env, cwd=tmp_path).returncode == 0
    kit = subprocess.run([sys.executable, "-c", "import kit"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert kit.returncode != 0 and "the standalone file imported kit" in kit.stderr


def _entry(failure_class, text="", band=None, mark="xfail"):
    return KnownFailure(id="KF-0", backend="b", mode="*", exec="*", case="*", device="*", failure_class=failure_class,
                        mark=mark, reason="why", link="repro/KF-0.py", where="KNOWN_FAILURES.md:1", band=band, text=text)


TRACEBACK = ('Traceback (most recent call last):\n  File "/opt/vllm/vllm/model_executor/layers/attention/attention.py", '
             'line 517, in forward\n    assert self.kv_cache_dtype == "fp8_e4m3"\nAssertionError\n')
WRONG = "batch 1/1 (b) layer 0: max error 3 > limit 1: FAIL\nFAIL\n"
INPUTS = "batch 1/1 (b) layer 0: max error 0.5 <= limit 1: PASS\ninputs: layer 0: q passed to forward was changed in place: 4 of 8: FAIL\nFAIL\n"


def test_a_run_shows_its_entrys_bug_by_the_entrys_class_and_what_it_pins():
    place = _entry("crash", text="layers/attention/attention.py:517")
    assert shows(place, 1, "", TRACEBACK)  # the kit's `path:line` is the traceback's `File "...path", line N`
    assert not shows(place, 1, "", TRACEBACK.replace("line 517", "line 518"))
    assert not shows(place, 0, "", TRACEBACK)
    said = _entry("crash", text="We only support bf16 dtype for S aux")
    assert shows(said, 1, "", "RuntimeError: mha_fwd: We only support bf16 dtype for S aux.\n")
    assert not shows(said, 1, "", "RuntimeError: out of memory\n")
    fault = _entry("crash", mark="quarantine")
    assert shows(fault, -11, "", "") and not shows(fault, 1, "", TRACEBACK)
    kernel = _entry("kernel")
    assert shows(kernel, 1, WRONG, "") and not shows(kernel, 0, "PASS\n", "") and not shows(kernel, 1, INPUTS, "")
    under_the_limit = _entry("kernel", band=(0.0, 1.0))  # its bug is the inputs check's alone
    assert shows(under_the_limit, 1, INPUTS, "") and not shows(under_the_limit, 1, WRONG, "")


def test_a_row_says_which_of_its_entries_it_shows():
    row = dict(skipped="", exit_code=1, verdict="", error="AssertionError", seconds=19.8,
               shows={"KF-42": True, "KF-43": False})
    assert _said(row) == "exit 1, '', 'AssertionError' (19.8 s): shows KF-42; does not show KF-43"


@pytest.mark.parametrize("path", sorted((ROOT / "repro").rglob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_checked_in_file_parses_and_imports_neither_the_kit_nor_its_adapters(path):
    """What CI can say of the CUDA files too, which it cannot run: each is Python, and imports what a
    maintainer has (torch, the engine), never the kit."""
    tree = ast.parse(path.read_text(), str(path))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {n for n in names if n.split(".")[0] in ("kit", "backends", "cases", "matrix")}, sorted(names)
