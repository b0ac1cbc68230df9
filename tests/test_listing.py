"""`python -m kit list --backends`: what each backend runs here, counted by the runner's own
decision, the main reason first, on short lines."""
import importlib
import re
import subprocess
import sys

import pytest

from cases import CATALOG
from kit.__main__ import main as kit_main
from kit.harness.run import Run
from kit.harness.runner import unsupported_here
from kit.listing import WIDTH
from kit.modes import EXECS, MODES
from tests.test_cli import _main
from tests.test_matrix import REPO, STALE, known_failures_session

DENSE_TOY = "tests.toys.dense:DenseGraphBackend"


def _listing(*args):
    proc = _main(kit_main, "list", "--backends", "--case-set", "smoke", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _counts(first_line):
    return {e: (int(n), int(of)) for e, n, of in re.findall(r"(eager|graph) (\d+)/(\d+)", first_line)}


def test_list_backends_counts_what_the_runner_runs():
    """For a dense-only toy (no MLA, sinks or fp8 KV; no EXTEND; no windowed verify): the count per
    exec is the number of runs the runner does not record as unsupported."""
    counts = _counts(_listing("--backend", DENSE_TOY)[0])
    runs = [Run(DENSE_TOY, "toy_dense", case, e) for m in MODES for case in CATALOG.matrix_cases("smoke", m) for e in EXECS]
    run_here = {e: sum(unsupported_here(r) is None for r in runs if r.exec_ is e) for e in EXECS}
    assert counts == {e.value: (run_here[e], len(runs) // 2) for e in EXECS}, counts
    assert 0 < run_here[EXECS[0]] < len(runs) // 2


def test_list_backends_counts_what_a_session_ran(tmp_path_factory):
    """The same count, for the smoke decode cases, as a pytest session's records of that toy's kind."""
    _, by_backend, _ = known_failures_session(tmp_path_factory)
    ran = [key for key, r in by_backend[STALE].items() if r["outcome"] != "unsupported"]
    counts = _counts(_listing("--backend", STALE, "--mode", "decode")[0])
    assert counts == {e.value: (sum(k.endswith("/" + e.value) for k in ran), len(by_backend[STALE]) // 2)
                      for e in EXECS}, (counts, ran)


def test_list_backends_gives_the_main_reason_first_on_short_lines():
    """The missing library, not the dtype most smoke cases have, on the first line; no line a
    terminal wraps."""
    lines = _listing("--backend", "tests.toys.unavailable:MissingLibraryBackend")
    assert lines[0].startswith("tests.toys.unavailable:MissingLibraryBackend unavailable: toylib cannot be imported")
    assert " ".join(lines).count("fp32: toylib's kernels") == 1
    assert all(len(line) <= WIDTH for line in lines), [len(line) for line in lines]
    assert " ".join(lines).count("toylib cannot be imported") == 1


def test_list_backends_says_what_a_cpu_run_narrows_to():
    """Under `--case-set auto` without CUDA a backend naming ci_cases gets those alone: said so."""
    pytest.importorskip("torch").cuda.is_available() and pytest.skip("CUDA here: auto is the full set")
    lines = _main(kit_main, "list", "--backends", "--backend", "tests.toys.dense:CiSubsetBackend").stdout.splitlines()
    assert _counts(lines[0]) == {"eager": (1, 1), "graph": (1, 1)}, lines
    smoke = sum(len(CATALOG.matrix_cases("smoke", m)) for m in MODES)
    said = " ".join(" ".join(lines).split())
    assert f"ci_cases: 1 of its {smoke} smoke cases" in said and "`--case-set smoke` runs all" in said, said


def test_list_backends_says_why_each_run_goes_to_a_process_of_its_own():
    """A backend declaring `own_process` is listed with its reason; one declaring none, without."""
    said = " ".join(" ".join(_listing("--backend", "tests.test_process_state:FirstInItsProcess")).split())
    assert "each run in a process of its own: planted: right only as its process's first backend" in said, said
    said = " ".join(_listing("--backend", "tests.test_process_state:FirstInItsProcessUndeclared"))
    assert "process of its own" not in said, said


def test_list_backends_in_box():
    lines = _main(kit_main, "list", "--backends").stdout.splitlines()
    first = {line.split()[0]: line for line in lines if not line.startswith(" ")}
    assert {"torch_native", "triton", "flashinfer"} <= set(first)
    assert _counts(first["torch_native"])["graph"][0] == 0 and "no capture hooks" in " ".join(lines)
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        assert first["flashinfer"].startswith("flashinfer unavailable: flashinfer-python cannot be imported")


def test_list_backends_asks_a_backend_once_per_case_and_exec(monkeypatch):
    """The listing asks of the catalog's cases both those the selection gives and, for each reason's
    weight, all of them: each (case, exec) once. Asked twice, vLLM's backends made its config (seconds
    each) for every case twice."""
    from kit.harness.capabilities import Capabilities
    from kit.harness.registry import load_backend
    from kit.harness.scope import declined
    from kit.listing import scope

    asked = []

    def counting(cls, caps, case, exec_):
        asked.append((case.name, case.mode, exec_))
        return declined(cls, caps, case, exec_)
    monkeypatch.setattr("kit.harness.scope.declined", counting)
    cls = load_backend(DENSE_TOY)
    scope(cls, Capabilities.of(cls), CATALOG, "smoke", MODES, EXECS, None)
    assert asked and len(asked) == len(set(asked))


ENGINE_TOY = "tests.toys.engine:ToyEngineBackend"


@pytest.fixture
def plant_engine(tmp_path, monkeypatch):
    """plant(source): the distribution toy-engine 1.0 installed in a folder on sys.path, its module
    `toy_engine` that source; plant(None): nothing installed."""
    from backends import pinned

    monkeypatch.syspath_prepend(str(tmp_path))

    def plant(source):
        if source is not None:
            (tmp_path / "toy_engine").mkdir()
            (tmp_path / "toy_engine" / "__init__.py").write_text(source)
            (tmp_path / "toy_engine-1.0.dist-info").mkdir()
            (tmp_path / "toy_engine-1.0.dist-info" / "METADATA").write_text(
                "Metadata-Version: 2.1\nName: toy-engine\nVersion: 1.0\n")
        importlib.invalidate_caches()
        pinned.installed_version.cache_clear()

    yield plant
    sys.modules.pop("toy_engine", None)
    pinned.installed_version.cache_clear()


@pytest.mark.parametrize("source, default, checked", [
    ("raise ImportError('planted: a broken install')", "not checked: its engine is imported only under `--check`",
     "unavailable: its engine does not import here (ImportError: planted: a broken install)"),
    ("", "not checked: its engine is imported only under `--check`", "available: eager "),
    (None, "unavailable: toy-engine 1.0 is not installed: pip install toy-engine",
     "unavailable: toy-engine 1.0 is not installed: pip install toy-engine"),
], ids=["installed_but_broken", "installed_and_importing", "not_installed"])
def test_list_backends_says_available_only_of_an_engine_it_imported(plant_engine, source, default, checked):
    """Without --check an engine adapter's engine is not imported (seconds to minutes for SGLang's and
    vLLM's), so the backend reads `not checked`, never available; --check imports it, and a package
    installed but broken reads unavailable with its error."""
    plant_engine(source)
    said = " ".join(" ".join(_listing("--backend", ENGINE_TOY, "--mode", "decode")).split())
    assert said.startswith(f"{ENGINE_TOY} {default}"), said
    assert "toy_engine" not in sys.modules
    said = " ".join(" ".join(_listing("--backend", ENGINE_TOY, "--mode", "decode", "--check")).split())
    assert said.startswith(f"{ENGINE_TOY} {checked}"), said


def test_list_backends_imports_no_engine_without_check():
    """The default listing of every registered backend, in a fresh process: neither SGLang nor vLLM
    imported, and none of their adapters said to be available."""
    code = ("import sys\nfrom kit.__main__ import main\nmain(['list', '--backends'])\n"
            "print('imported:', sorted(m for m in ('sglang', 'vllm') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-1] == "imported: []", proc.stdout[-3000:]
    engines = [line for line in lines if line.startswith(("sglang_", "vllm_"))]
    assert engines and not [line for line in engines if " available: " in line], engines


def test_check_goes_with_backends():
    proc = _main(kit_main, "list", "--check")
    assert proc.returncode == 4 and proc.stderr.strip().endswith("--check checks backends: give it with --backends"), \
        proc.stderr


def test_list_cases_names_every_case_the_matrix_runs():
    """`kit list` (no --backends) prints one line per case of each mode the matrix runs, the recurrent
    kinds' cases among them, each with its kind's shape (a listing of the softmax cases alone hid them)."""
    lines = _main(kit_main, "list", "--case-set", "smoke").stdout.splitlines()
    listed = [(line.split()[0], line.split()[1]) for line in lines]
    assert listed == [(m.value, case.name) for m in MODES for case in CATALOG.matrix_cases("smoke", m)]
    assert any(" kda " in line and "v=32" in line for line in lines), lines
    assert any("hybrid_gdn_decode_fp32" in line and "layers=linear/full/linear/full" in line for line in lines), lines
