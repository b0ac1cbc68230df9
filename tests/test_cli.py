"""Command lines on bad input end in one line naming the problem and the fix (one scheme of exit codes,
kit.cli: USAGE, pytest's 4, for a usage error, FAILED otherwise), and --help describes everything.
The commands' `main` runs in this process where what is checked is what it prints and returns; one
test per command runs it as its own process (its exit code, and nothing else on stderr)."""
import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from kit import options
from kit.cli import FAILED, INTERRUPTED, USAGE
from kit.modes import Exec, ForwardMode
from kit.__main__ import KEPT, build_parser as kit_parser, main as kit_main
from matrix.__main__ import build_parser as matrix_parser, main as matrix_main
from tests.test_matrix import REPO, project, run_matrix  # noqa: F401

RUN = ["run", "--backend", "torch_native", "--mode", "decode", "--exec", "eager"]


def _one_line_error(proc, code, *words):
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == code, out[-2000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for w in words:
        assert w in lines[0], lines[0]


def _run(*args):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True)


def _main(main, *args):
    """`main(args)` here, as the process would end: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code
    return subprocess.CompletedProcess(args, code or 0, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("args, words", [
    (RUN + ["--case", "nosuch"], ["no decode case named 'nosuch'", "python -m kit list"]),
    (["list", "--case-set", "nosuch"], ["unknown case set 'nosuch'", "smoke"]),
    (RUN + ["--case", "mqa_p1_shuf", "--device", "cuda"], ["CUDA is not available", "--device cpu"]),
    (["run", "--backend", "torch_native", "--mode", "decod", "--exec", "eager", "--case", "x"], ["unknown mode"]),
    (["list", "--cases", "nosuch:CATALOG"], ["--cases nosuch:CATALOG", "No module named 'nosuch'"]),
    (["list", "--no-such-option"], ["unrecognized arguments", "--help"]),
    (["run", "--backend", "nosuch", "--mode", "decode", "--exec", "eager", "--case", "mqa_p1_shuf"],
     ["--backend nosuch: unknown backend 'nosuch'; known:", "torch_native"]),
    (["run", "--backend", "nosuchmodule:Thing", "--mode", "decode", "--exec", "eager", "--case", "mqa_p1_shuf"],
     ["--backend nosuchmodule:Thing: No module named 'nosuchmodule'"]),
    (RUN + ["--case", "mqa_p1_shuf", "--timeout", "-3"], ["--timeout", "-3", "seconds >= 0"]),
    (RUN + ["--case", "mqa_p1_shuf", "--timeout", "1e300"], ["--timeout", "1e300: give at most 1e+06 seconds"]),
    (RUN + ["--case", "mqa_p1_shuf", "--device", "tpu"], ["--device: tpu: give cpu or cuda"]),
    (RUN + ["--case", "mqa_p1_shuf", "--device", "meta"], ["--device: meta: give cpu or cuda"]),
    (["fuzz", "--backend", "torch_native", "--device", "tpu"], ["--device: tpu: give cpu or cuda"]),
    (["run", "--backend", "torch_native", "--exec", "eager", "--case-line",
      'Case("x", mode=ForwardMode.DECODE, prefix=(1,), page=__import__("os"))'], ["is not a literal"]),
    (["run", "--backend", "torch_native", "--exec", "eager", "--case", "x"], ["--case needs --mode", "--case-line"]),
], ids=["case", "case_set", "device", "mode", "cases", "option", "backend", "backend_target", "timeout",
        "timeout_overflow", "device_tpu", "device_meta", "fuzz_device", "case_line",
        "case_without_mode"])
def test_kit_usage_errors(args, words):
    if "cuda" in args:
        pytest.importorskip("torch").cuda.is_available() and pytest.skip("CUDA is present here")
    _one_line_error(_main(kit_main, *args), USAGE, *words)


def test_kit_run_answers_an_unknown_backend_before_torch_and_the_catalog(monkeypatch):
    """It took ~15 s to refuse a misspelt backend: the catalog (torch with it) was loaded first."""
    import kit.engine.catalog

    def load_nothing(*args):
        raise AssertionError("the catalog was loaded")
    monkeypatch.setattr(kit.engine.catalog, "load_catalog", load_nothing)
    _one_line_error(_main(kit_main, "run", "--backend", "nosuch", "--mode", "decode", "--exec", "eager", "--case",
                          "x"), USAGE, "--backend nosuch: unknown backend 'nosuch'; known:")


def test_a_kit_usage_error_ends_the_process_with_one_line():
    _one_line_error(_run("-m", "kit", *RUN, "--case", "nosuch"), USAGE, "no decode case named 'nosuch'")


@pytest.mark.parametrize("backend, words", [
    ("nosuchmodule:Thing", ["--backend nosuchmodule:Thing: No module named 'nosuchmodule'", "module:attr"]),
    ("os:missing_attr", ["--backend os:missing_attr: module 'os' has no attribute 'missing_attr'"]),
    ("nosuch", ["unknown backend 'nosuch'; known:", "torch_native"]),
], ids=["module", "attr", "name"])
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_pytest_bad_backend_is_one_line(backend, words, xdist):
    proc = _run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--backend", backend, *xdist)
    _one_line_error(proc, USAGE, "ERROR: ", *words)


def test_kit_run_labels_a_module_attr_backend_as_pytest_does():
    """By the class's `name` (here the toy's), not the spec, as in test ids, records and tables."""
    proc = _main(kit_main, "run", "--backend", "tests.toys.crashing:HangBackend", "--mode", "decode",
                 "--exec", "eager", "--case", "gqa_ragged_p16_fp32", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["backend"] == "toy_hang" and record["outcome"] == "pass", record
    assert "--backend tests.toys.crashing:HangBackend" in record["repro"], record


@pytest.mark.parametrize("write, code, words", [
    (lambda p: None, USAGE, ["no such file", "--results-json"]),
    (lambda p: p.mkdir(), USAGE, ["a directory, not a results file"]),
    (lambda p: os.mkfifo(p), USAGE, ["not a regular file", "--results-json"]),  # /dev/null read "no such file"
    (lambda p: p.write_text('{"schema": 2, "records": [{"backend": "a"'), FAILED, ["bad JSON", "truncated?"]),
    (lambda p: p.write_text("not json at all"), FAILED, ["bad JSON"]),
    (lambda p: p.write_text('{"schema": 9, "records": []}'), FAILED, ["results schema 9, expected 2", "regenerate"]),
    (lambda p: p.write_text('{"schema": 2, "records": [{"x": 1}]}'), FAILED,
     ["record 1: missing backend, mode", "fields no record has: x"]),
], ids=["missing", "directory", "not_a_file", "truncated", "not_json", "schema", "records"])
@pytest.mark.parametrize("command", [["check", "--fresh"], ["html", "--results"]], ids=["check", "html"])
def test_a_bad_results_file_reads_the_same_to_check_and_html(project, tmp_path, write, code, words, command):
    path = tmp_path / "fresh.json"
    write(path)
    if command[0] == "html":
        proc = _run("-m", "matrix", "html", "--known-failures", str(project["known_path"]), "--results", str(path),
                    "--out", str(tmp_path / "m.html"))
    else:
        proc = run_matrix("check", project, "--fresh", str(path))
    _one_line_error(proc, code, *words)
    assert not (tmp_path / "m.html").exists()


def test_corrupted_committed_files_and_deleted_known_failures(project):
    results = project["results_dir"]
    (results / "cpu.json").write_text((results / "cpu.json").read_text()[:50])
    for command in ("check", "write"):
        proc = run_matrix(command, project)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert [l for l in proc.stderr.splitlines() if "cpu.json" in l and "bad JSON" in l], proc.stderr
    shutil.rmtree(results / "mutation")
    (results / "mutation").mkdir()
    (results / "mutation" / "gpu.json").write_text(json.dumps({"scores": []}))
    project["known_path"].unlink()
    proc = run_matrix("write", project)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert any("gpu.json: not a mutation scores file" in l and "kit.mutate --json" in l
               for l in proc.stderr.splitlines()), proc.stderr
    assert any("KNOWN_FAILURES.md: no such file" in l and "--known-failures" in l for l in proc.stderr.splitlines())


@pytest.mark.parametrize("command", ["write", "check", "html"])
@pytest.mark.parametrize("folder, words", [("nosuch", ["no such directory"]), ("empty", ["no results file (*.json)"])])
def test_a_results_dir_with_nothing_to_write_is_refused_and_nothing_overwritten(project, tmp_path, command, folder,
                                                                               words):
    """`matrix write --results-dir nosuchdir` rendered "No results yet." over every table, exit 0."""
    (tmp_path / "empty").mkdir()
    before = project["readme_path"].read_text()
    where = ["--out", str(tmp_path / "m.html")] if command == "html" else ["--readme", str(project["readme_path"])]
    proc = _main(matrix_main, command, "--known-failures", str(project["known_path"]),
                 "--results-dir", str(tmp_path / folder), *where)
    _one_line_error(proc, USAGE, f"--results-dir {tmp_path / folder}", *words)
    assert project["readme_path"].read_text() == before
    assert not (tmp_path / "m.html").exists()


@pytest.mark.parametrize("args, words", [
    (RUN[:5] + ["--mode", "extend", "--exec", "eager", "--case", "x"], ["--mode given twice (decode, extend)"]),
    (RUN + ["--case", "x", "--case", "y"], ["--case given twice (x, y)", "give it once"]),
    (["list", "--case-set", "smoke", "--case-set", "full"], ["--case-set given twice (smoke, full)"]),
], ids=["mode", "case", "case_set"])
def test_a_single_valued_option_given_two_values_is_refused(args, words):
    """`kit run --mode decode --mode extend` ran extend alone, saying nothing."""
    _one_line_error(_main(kit_main, *args), USAGE, *words)


def test_options_named_twice_select_each_value_once():
    assert options.csv(["torch_native", "torch_native,triton", "triton"]) == ["torch_native", "triton"]
    assert options.modes(["decode", "DECODE,extend", "decode"]) == [ForwardMode.DECODE, ForwardMode.EXTEND]
    assert options.execs(["eager", "eager"]) == [Exec.EAGER]


def _collected(*args):
    proc = _run("-m", "pytest", "tests/test_conformance.py", "--co", "-q", "-p", "no:cacheprovider",
                "--cases", "tests.toys.tiny:CATALOG", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if "::test_conformance[" in line]


def test_a_repeated_pytest_option_does_not_double_the_runs():
    """`--backend x --backend x --mode decode --mode decode` ran each run twice, and the results file
    then read as interrupted."""
    once = _collected("--backend", "torch_native", "--mode", "decode", "--progress-every", "5")
    assert once and _collected("--backend", "torch_native", "--backend", "torch_native", "--mode", "decode",
                               "--mode", "decode", "--progress-every", "5", "--progress-every", "5") == once


@pytest.mark.parametrize("args, words", [
    (["--case-set", "smoke", "--case-set", "full"], ["--case-set given twice (smoke, full)", "give it once"]),
    (["--progress-every", "-5"], ["--progress-every: -5: give seconds >= 0 (0: never)"]),
], ids=["case_set", "progress_every"])
def test_pytest_refuses_what_argparse_let_through(args, words):
    proc = _run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--co", *args)
    _one_line_error(proc, USAGE, "ERROR: ", *words)


TOYS = "tests.toys.crashing"


def test_ctrl_c_in_kit_run_is_one_line_saying_what_was_kept():
    """Ctrl-C printed a KeyboardInterrupt traceback; pytest's answer is one line and exit code 2."""
    proc = _main(kit_main, "run", "--backend", f"{TOYS}:InterruptBackend", "--mode", "decode", "--exec", "eager",
                 "--case", "mqa_p1_shuf")
    _one_line_error(proc, INTERRUPTED, "python -m kit run: interrupted (Ctrl-C); kept: nothing")


def test_ctrl_c_in_kit_fuzz_writes_its_ledger_record(tmp_path, monkeypatch):
    from tests.toys.crashing import InterruptsLaterBackend

    monkeypatch.setattr(InterruptsLaterBackend, "batches", 0)
    ledger = tmp_path / "ledger.jsonl"
    proc = _main(kit_main, "fuzz", "--backend", f"{TOYS}:InterruptsLaterBackend", "--mode", "decode", "--exec",
                 "eager", "--database", "none", "--ledger", str(ledger), "--budget", "120")
    _one_line_error(proc, INTERRUPTED, "python -m kit fuzz: interrupted (Ctrl-C) at example", str(ledger))
    [record] = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert record["stopped"].startswith("interrupted (Ctrl-C)") and record["examples"] >= 1


def test_every_command_says_what_ctrl_c_keeps():
    commands = kit_parser()._subparsers._group_actions[0].choices
    assert set(KEPT) == set(commands)


def test_a_known_failures_file_that_never_existed_is_not_to_be_restored():
    proc = _main(kit_main, *RUN, "--case", "mqa_p1_shuf", "--known-failures", "nosuch.md")
    _one_line_error(proc, FAILED, "--known-failures: nosuch.md: no such file", "name an existing known-failures")
    assert "git checkout" not in proc.stderr


@pytest.mark.parametrize("args", [
    ["html", "--out", "/proc/x/report.html"],
    ["merge", "/proc/x/report.json", "a.json"],
], ids=["html", "merge"])
def test_a_file_that_cannot_be_written_is_one_line(args):
    """`matrix html --out /proc/x/report.html` ended in a FileNotFoundError traceback."""
    _one_line_error(_main(matrix_main, *args), USAGE, "/proc/x/report.", "cannot make its folder",
                    "name a file in a folder you can write")


def test_pytest_refuses_a_results_file_it_cannot_write():
    """`--results-json /proc/x/r.json` was an INTERNALERROR before any run."""
    proc = _run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--co",
                "--results-json", "/proc/x/r.json")
    _one_line_error(proc, USAGE, "ERROR: --results-json /proc/x/r.json: cannot make its folder")


def test_mutate_usage_error():
    _one_line_error(_run("-m", "kit.mutate", "--case-set", "nosuch"), USAGE, "unknown case set 'nosuch'")


def test_mutate_chooses_the_interpreter_before_its_catalog_imports_triton(tmp_path):
    """A catalog whose modules import triton (vLLM's adapters do) made every later set-up that defines
    kernels raise TritonImportedFirst on CPU: kit.mutate reported SGLang's mutants 121 and 122 missed,
    'crash' with no message, where the suite catches them."""
    (tmp_path / "triton_first.py").write_text(
        "import triton  # noqa: F401 - first, as an engine adapter's import takes it\n"
        "from tests.mutants import MUTANTS as ALL\n"
        "MUTANTS = [m for m in ALL if m.name == 'sglang_mamba2_decode_dt_without_softplus']\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    env.pop("TRITON_INTERPRET", None)  # as a shell starts it: this process chose the interpreter already
    proc = subprocess.run([sys.executable, "-m", "kit.mutate", "--catalog", "triton_first:MUTANTS", "--case-set",
                           "smoke", "--stop-when-caught", "-j", "1"], cwd=REPO, capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0 and "MISSED" not in proc.stdout, (proc.stdout + proc.stderr)[-2000:]


@pytest.mark.parametrize("args, words", [
    (["fuzz", "--backend", "torch_native", "--budget", "-5"], ["--budget", "-5: give seconds >= 0"]),
    (["fuzz", "--backend", "torch_native", "--shrink-budget", "-1"], ["--shrink-budget", "give seconds >= 0"]),
    (["fuzz", "--backend", "torch_native", "--max-examples", "0"], ["--max-examples", "0: give 1 or more"]),
    (["fuzz", "--backend", "torch_native", "--timeout", "-2"], ["--timeout", "give seconds >= 0"]),
    (["warmup", "--jobs", "0"], ["--jobs", "give 1 or more"]),
], ids=["budget", "shrink_budget", "max_examples", "timeout", "jobs"])
def test_nonsense_numbers_are_refused(args, words):
    """A negative budget searched nothing and said green; each is a usage error now."""
    _one_line_error(_main(kit_main, *args), USAGE, *words)


@pytest.mark.parametrize("timeout, words", [
    (["--timeout", "-1"], ["-1: give seconds >= 0 (0: no limit)"]),
    (["-o", "timeout=-1"], ["-1: give seconds >= 0 (0: no limit)"]),
    (["--timeout", "1e300"], ["1e+300: give at most 1e+06 seconds"]),
], ids=["option", "ini", "overflow"])
def test_pytest_refuses_a_time_limit_it_cannot_keep(timeout, words):
    """pytest-timeout took -1 for no limit: a hung run kept the session, and its file, running;
    1e300 overflowed the system's timer, recorded as every run's crash."""
    proc = _run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--co", *timeout)
    _one_line_error(proc, USAGE, "ERROR: ", "timeout", *words)


def test_exit_codes_are_one_scheme_written_in_one_place():
    """docs/running.md's table is kit.cli's scheme, code for code; no other page gives a code."""
    from kit.cli import EXIT_CODES

    section = (REPO / "docs" / "running.md").read_text().split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| code")]
    assert [int(line.split("|")[1].strip().strip("`")) for line in rows] == list(EXIT_CODES), rows
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text() if page.name != "running.md" else section
        assert page.name == "running.md" or "exit code 2" not in text and "exits 2" not in text, page


# ------------------------------------------------------------------------------------------- help


def _actions(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield choice
            for sub in action.choices.values():
                yield from _actions(sub)
        elif action.help != argparse.SUPPRESS:
            yield action


@pytest.mark.parametrize("parser", [kit_parser, matrix_parser], ids=["kit", "matrix"])
def test_every_subcommand_and_option_has_help(parser):
    undocumented = [a.option_strings or a.dest for a in _actions(parser()) if not a.help]
    assert not undocumented


@pytest.mark.parametrize("main, args, words", [
    (kit_main, ["--help"], ["run", "list"]),
    (kit_main, ["list", "--help"], ["--backends", "--case-set", "--cases"]),
    (kit_main, ["run", "--help"], ["--timeout", "--device", "--json"]),
    (matrix_main, ["--help"], ["write", "check"]),
    (matrix_main, ["check", "--help"], ["--fresh", "--results-dir", "--known-failures", "--readme"]),
])
def test_help_shows_them(main, args, words):
    proc = _main(main, *args)
    assert proc.returncode == 0 and all(w in proc.stdout for w in words), proc.stdout


def _known_failures_file(tmp_path, rows):
    from kit.report.known_failures import BEGIN, COLUMNS, END

    header = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    path = tmp_path / "KNOWN_FAILURES.md"
    path.write_text(f"# Known failures\n\n{BEGIN}\n{header}\n" + "".join(r + "\n" for r in rows) + f"{END}\n")
    return path


TORCH_ERROR = ["run", "--backend", "tests.toys.crashing:TorchErrorBackend", "--mode", "decode", "--exec", "eager",
               "--case", "mqa_p1_shuf"]


@pytest.mark.parametrize("klass, said", [
    ("crash", "known failure: KF-7 ("),
    ("kernel", "not the known failure: KF-7 ("),
], ids=["known", "other_class"])
def test_a_failing_kit_run_says_whether_it_is_a_known_failure(tmp_path, klass, said):
    path = _known_failures_file(tmp_path, [
        f"| KF-7 | toy_torch_error | decode | eager | mqa_* | * | {klass} | xfail | the toy's einsum | tests/toys/crashing.py |"])
    proc = _main(kit_main, *TORCH_ERROR, "--known-failures", str(path))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(said) and str(path) in last, proc.stdout[-2000:]
    assert ("the toy's einsum" in last) == (klass == "crash"), last
    no_entry = _main(kit_main, *TORCH_ERROR, "--known-failures", str(_known_failures_file(tmp_path, [])))
    assert no_entry.returncode == 1 and "KF-" not in no_entry.stdout, no_entry.stdout[-2000:]


# ----------------------------------------------------------------------------- what a user meets


def test_a_case_of_another_mode_is_named_as_such():
    """Not the 134 names of the mode asked for: the mode the case has."""
    proc = _main(kit_main, "run", "--backend", "torch_native", "--mode", "decode", "--exec", "eager",
                 "--case", "gqa_chain4_p16_fp32")
    _one_line_error(proc, USAGE, "'gqa_chain4_p16_fp32' is a target_verify case, not a decode one: give --mode "
                                 "target_verify")
    near = _main(kit_main, *RUN, "--case", "mqa_p1_shu")
    _one_line_error(near, USAGE, "no decode case named 'mqa_p1_shu'; did you mean mqa_p1_shuf")
    assert len(near.stderr) < 300, near.stderr


def test_two_backends_of_one_name_are_refused():
    """A copy of a backend keeping its `name` would share its test ids and records (the results file
    then read interrupted, 0 of 2 runs recorded)."""
    proc = _run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--co",
                "--backend", "torch_native", "--backend", "tests.toys.copied:TorchNativeCopy")
    _one_line_error(proc, USAGE, "ERROR: --backend torch_native and --backend tests.toys.copied:TorchNativeCopy: both "
                                 "are named 'torch_native'", "give each its own `name`")
    once, twice = (_run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--co", "--mode",
                        "decode", *backends) for backends in (["--backend", "torch_native"], [
                            "--backend", "torch_native", "--backend", "backends.torch_native:TorchNativeBackend"]))
    ids = [[line for line in proc.stdout.splitlines() if "::" in line] for proc in (once, twice)]
    assert once.returncode == twice.returncode == 0 and ids[0] == ids[1] and ids[0]  # one backend named twice: once


def test_a_known_failure_naming_no_backend_is_refused(tmp_path):
    """A misspelt backend column left its failure uncovered, and only the gate saw it."""
    path = _known_failures_file(tmp_path, [
        "| KF-7 | torch_natvie | decode | eager | mqa_* | * | kernel | xfail | a typo | tests/toys/crashing.py |"])
    proc = _run("-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider", "--co",
                "--backend", "torch_native", "--known-failures", str(path))
    _one_line_error(proc, USAGE, "ERROR: --known-failures: ", "KF-7 names backend 'torch_natvie', which is none of",
                    "fix its backend column")


def test_a_repro_of_a_backend_outside_the_kit_works_in_a_fresh_shell(tmp_path):
    """Importable here through PYTHONPATH, the backend's module is not in a fresh shell elsewhere: the
    repro names the folder it is imported from."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "mybackend.py").write_text("from backends.torch_native import TorchNativeBackend\n\n\n"
                                      "class MyBackend(TorchNativeBackend):\n    name = 'mine'\n")
    env = {**os.environ, "PYTHONPATH": str(own)}
    proc = subprocess.run([sys.executable, "-m", "kit", *RUN[:1], "--backend", "mybackend:MyBackend", *RUN[3:],
                           "--case", "mqa_p1_shuf", "--json"], cwd=REPO, capture_output=True, text=True, env=env)
    repro = json.loads(proc.stdout.strip().splitlines()[-1])["repro"]
    assert repro.startswith(f"PYTHONPATH={own} python -m kit run --backend mybackend:MyBackend"), repro
    fresh = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = subprocess.run(["bash", "-c", repro], cwd=elsewhere, capture_output=True, text=True, env=fresh)
    assert again.returncode == 0 and "mine-decode-eager-mqa_p1_shuf: pass" in again.stdout, again.stderr[-2000:]
    inside = _main(kit_main, "run", "--backend", "tests.toys.dense:DenseGraphBackend", *RUN[3:], "--case",
                   "gqa_ragged_p16_fp32", "--json")
    assert json.loads(inside.stdout.splitlines()[-1])["repro"].startswith("python -m kit run"), inside.stdout


def test_fuzzing_ones_own_backend_leaves_the_checkout_as_it_was(tmp_path, monkeypatch, capsys):
    """Its ledger goes to the user's cache; the kit's own backends' goes to the tracked one."""
    from kit.fuzz import ledger

    monkeypatch.setenv("HOME", str(tmp_path))
    tracked = REPO / ledger.DEFAULT
    before = tracked.read_bytes() if tracked.exists() else None
    monkeypatch.chdir(REPO)
    code = kit_main(["fuzz", "--backend", "tests.toys.dense:DenseGraphBackend", "--mode", "decode", "--exec", "eager",
                     "--max-examples", "1", "--budget", "60", "--seed", "1", "--database", "none", "--device", "cpu"])
    assert code == 0, capsys.readouterr()
    assert (tracked.read_bytes() if tracked.exists() else None) == before
    own = tmp_path / ".cache" / "attention-conformance-kit" / "fuzz-ledger.jsonl"
    assert json.loads(own.read_text())["backend"] == "tests.toys.dense:DenseGraphBackend"
    assert f"ledger: {own}" in capsys.readouterr().out
    assert ledger.default(in_box=True) == ledger.DEFAULT


def test_ci_leaves_no_file_git_does_not_ignore():
    """.ci/run's HTML report goes beside the results file, which git ignores as it ignores the file."""
    from kit.report.results import page_path

    trap = next(line for line in (REPO / ".ci" / "run").read_text().splitlines() if "matrix html" in line)
    assert "--out" not in trap and "--results results-local.json" in trap, trap
    for path in ("results-local.json", page_path(["results-local.json"]), page_path([])):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO)
        assert ignored.returncode == 0, f"{path} is not ignored by git"
