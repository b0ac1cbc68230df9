"""Every collected run ends with a record: a backend that exits, raises past `except Exception`,
is no backend class, or hangs is a `crash` naming its stage, and the session goes on."""
import inspect
import json
import os
import subprocess
import sys

import pytest

from tests import SUBPROCESS_TIMEOUT_S
from cases import CATALOG as catalog
from kit.modes import Exec, ForwardMode
from kit.report.record import CRASH, FAIL, KERNEL, PASS
from kit.harness.runner import run_case
from kit.harness.timeout import EXIT_STUCK
from tests.helpers import once_per_session
from tests.test_matrix import REPO, SMOKE_DECODE, run_suite, suite_records
from tests.toys import tiny
from backends.torch_native import TorchNativeBackend
from tests.toys.crashing import GuardedOpErrorBackend, HangBackend, TorchErrorBackend

TOYS = "tests.toys.crashing"
BS3 = catalog.find_case(ForwardMode.DECODE, "mqa_p1_shuf")  # the smoke decode case the toys misbehave on
# Where a test times runs out, the runs are tiny (tests.toys.tiny): a short limit then stops the hung
# run alone, however busy the machine; of its catalog the toys misbehave on after_b only (its eager
# sequence begins with a batch of 3 requests of its MQA model).
TINY = "tests.toys.tiny:CATALOG"
TINY_VICTIM = "after_b"
TINY_BS3 = BS3.with_(prefix=(2, 5, 1), head_dim=16)


@pytest.mark.parametrize("backend, message", [
    (f"{TOYS}:SysExitBackend", "forward (layer 0): SystemExit: 3 at "),
    (f"{TOYS}:BaseExceptionBackend", "forward (layer 0): Abort: raised past except Exception at "),
    (f"{TOYS}:NoSupports", "loading backend: TypeError: tests.toys.crashing:NoSupports: the class NoSupports has no "
                           "`supports` classmethod"),
    ("os:path", "loading backend: TypeError: os:path: a module, not a backend class"),
], ids=["sys_exit", "base_exception", "no_supports", "not_a_class"])
def test_misbehaving_backend_is_a_crash_record(backend, message):
    r = run_case(backend, BS3, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH) and message in r.message, r.message


def test_keyboard_interrupt_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        run_case(f"{TOYS}:InterruptBackend", BS3, Exec.EAGER)


def test_hung_backend_times_out_at_its_stage():
    # A run within its limit first (it also does this process's first-run imports, which a short
    # limit must not interrupt).
    assert run_case(f"{TOYS}:HangBackend", TINY_BS3.with_(prefix=(5, 3)), Exec.EAGER, timeout=120).outcome == PASS
    r = run_case(f"{TOYS}:HangBackend", TINY_BS3, Exec.EAGER, timeout=2)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH)
    assert r.message.startswith("forward (layer 0): RunTimeout: timeout after 2 s at ") and r.seconds < 60, r.message
    assert r.repro.endswith(" --timeout 2"), r.repro
    # Where it was stopped: the backend's line (the sleep; on a loaded machine the limit may come
    # earlier, in the torch_native code it inherits), never the time limit's signal handler.
    sleep_line = inspect.getsourcelines(HangBackend.misbehave)[1] + 1
    stopped_at = r.message.rsplit(" at ", 1)[1]
    assert (stopped_at == f"{inspect.getsourcefile(HangBackend)}:{sleep_line}"
            or stopped_at.startswith(inspect.getsourcefile(TorchNativeBackend) + ":")), r.message


def test_a_crash_inside_torch_names_the_backends_line_too():
    r = run_case(f"{TOYS}:TorchErrorBackend", BS3, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH)
    einsum_line = inspect.getsourcelines(TorchErrorBackend.misbehave)[1] + 3
    assert f"{os.sep}torch{os.sep}" in r.message.split(" at ")[-1], r.message
    assert r.message.endswith(f"(called from {inspect.getsourcefile(TorchErrorBackend)}:{einsum_line})"), r.message
    assert "--timeout" not in r.repro


def test_a_crash_through_the_kits_guard_names_the_backends_line():
    """torch's dispatch runs the kit's guard while forward runs: the frame between torch and the
    backend is the kit's, and the crash names the backend's line, not the guard's (without it, a
    shape error in SGLang's EXTEND metadata reads `called from kit/harness/guard.py`)."""
    r = run_case(f"{TOYS}:GuardedOpErrorBackend", TINY_BS3, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH)
    line = inspect.getsourcelines(GuardedOpErrorBackend.misbehave)[1] + 3
    assert r.message.endswith(f"(called from {inspect.getsourcefile(GuardedOpErrorBackend)}:{line})"), r.message


def test_an_output_on_the_meta_device_is_the_kernels_failure():
    """A tensor with no values, of the right shape and dtype: the output check says where it is (it
    was the kit's own error, `the run ended without a verdict`, at the line that read it)."""
    r = run_case(f"{TOYS}:MetaOutputBackend", TINY_BS3, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, KERNEL), r.message
    assert "meta" in r.message and "cpu" in r.message, r.message


# One session for the backends each test below looks at (each its own backend's records): a session
# is a process (three under xdist) importing torch and collecting the suite.
MISBEHAVING = [f"{TOYS}:SysExitBackend", f"{TOYS}:BaseExceptionBackend", "os:path", f"{TOYS}:NoSupports"]


def misbehaving_session(tmp_path_factory):
    """(process, records by backend, folder); without progress lines (tests/test_progress.py reads
    that too)."""
    return once_per_session(tmp_path_factory, "misbehaving", lambda folder: suite_records(
        folder, MISBEHAVING, (), "--exec", "eager", "--progress-every", "0"))


@pytest.fixture
def misbehaving_suite(tmp_path_factory):
    return misbehaving_session(tmp_path_factory)


@pytest.mark.parametrize("backend", MISBEHAVING)
def test_suite_records_every_run(misbehaving_suite, backend):
    proc, by_backend, tmp = misbehaving_suite
    records = by_backend[backend]
    assert proc.returncode == 1 and "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stdout[-2000:]
    assert sorted(records) == sorted(f"{c}/eager" for c in SMOKE_DECODE)
    assert records["mqa_p1_shuf/eager"]["failure_class"] == CRASH
    assert json.loads((tmp / "results.json").read_text())["run"]["status"] == "complete"


# Under xdist, one session for the backends that end or stop their worker: each test looks at its own
# backend's records, and at the session going on past all of them.
HANG, NATIVE_HANG, HARD_CRASH, DEVICE_FAULT = (f"{TOYS}:{name}" for name in (
    "HangBackend", "NativeHangBackend", "HardCrashBackend", "DeviceFaultBackend"))
# The limit of the sessions of hung backends: a hang costs it, a hang in native code twice. Their runs
# are tiny: the limit leaves room for a process's first run on a 2-core machine loaded 4 times over.
LIMIT_S = 4


@pytest.fixture
def xdist_suite(tmp_path_factory):
    proc, by_backend, folder = once_per_session(tmp_path_factory, "xdist_misbehaving", lambda folder: suite_records(
        folder, [HANG, NATIVE_HANG, HARD_CRASH, DEVICE_FAULT], (), "--exec", "eager", "-n", "2", "--timeout", str(LIMIT_S),
        "--cases", TINY))
    assert proc.returncode == 1 and "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stdout[-2000:]
    assert json.loads((folder / "results.json").read_text())["run"]["status"] == "complete"
    return by_backend, folder, proc


def _only_failure(records):
    return [c.name for c in tiny.SMOKE if records[f"{c.name}/eager"]["outcome"] != PASS]


def test_hang_under_xdist_times_out_and_the_session_completes(xdist_suite):
    records = xdist_suite[0][HANG]
    r = records[f"{TINY_VICTIM}/eager"]
    assert r["failure_class"] == CRASH and f"timeout after {LIMIT_S} s" in r["message"] and r["message"].startswith("forward")
    assert _only_failure(records) == [TINY_VICTIM]


def test_a_hang_in_native_code_under_xdist_is_the_runs_crash_and_the_session_goes_on(xdist_suite):
    records = xdist_suite[0][NATIVE_HANG]
    r = records[f"{TINY_VICTIM}/eager"]
    assert r["failure_class"] == CRASH and r["message"].startswith(f"timeout after {LIMIT_S} s, then {LIMIT_S} s more stuck"), r
    assert _only_failure(records) == [TINY_VICTIM]


def test_dead_worker_is_recorded_as_crash_and_the_run_completes(xdist_suite):
    """A hard crash under xdist kills one worker; its case is a crash record and every other case runs."""
    records = xdist_suite[0][HARD_CRASH]
    assert _only_failure(records) == [TINY_VICTIM]
    r = records[f"{TINY_VICTIM}/eager"]
    assert r["failure_class"] == CRASH and "crashed while running" in r["message"] and "exit code 3" in r["message"]
    assert r["repro"].startswith(f"python -m kit run --backend {HARD_CRASH}")
    proc = xdist_suite[2]  # said on screen, not only in the file
    said = f"toy_hard_crash-decode-eager-{TINY_VICTIM}: its worker died, exit code 3; recorded as a crash; repro: "
    assert said + r["repro"] in proc.stdout, proc.stdout[-3000:]
    assert len(records) == len(tiny.SMOKE)


def test_device_fault_ends_the_worker_and_keeps_its_record(xdist_suite):
    """A sticky device fault: its own record (with the real message) is kept, the worker is replaced,
    and no other case is blamed."""
    records, tmp = xdist_suite[0][DEVICE_FAULT], xdist_suite[1]
    r = records[f"{TINY_VICTIM}/eager"]
    assert r["failure_class"] == CRASH and r["device_lost"] and "device-side assert" in r["message"], r
    assert _only_failure(records) == [TINY_VICTIM]
    assert not (tmp / "results.json.lost").exists()


def test_a_hang_in_native_code_without_xdist_is_recorded_with_the_stacks_on_stderr(tmp_path):
    """Stuck where the time limit's signal is never seen: the process ends a grace period later
    (the limit itself, when shorter than a minute), the run recorded as a crash in an interrupted
    results file, every thread's stack on stderr."""
    proc, records = run_suite(tmp_path, f"{TOYS}:NativeHangBackend", (), "--exec", "eager", "-p", "no:xdist",
                              "--timeout", str(LIMIT_S), "--cases", TINY)
    assert proc.returncode == EXIT_STUCK, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = records[f"{TINY_VICTIM}/eager"]
    assert r["failure_class"] == CRASH and r["message"].startswith(f"timeout after {LIMIT_S} s, then {LIMIT_S} s more stuck"), r
    assert r["repro"].endswith(f" --timeout {LIMIT_S}"), r["repro"]
    run = json.loads((tmp_path / "results.json").read_text())["run"]
    assert run["status"] == "interrupted", run["status"]
    assert "stuck in native code" in proc.stderr and "in misbehave" in proc.stderr, proc.stderr[-3000:]
    assert "recorded as a crash in" in proc.stderr, proc.stderr[-3000:]


def test_runs_have_a_time_limit_by_default():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-p", "no:cacheprovider",
                           "tests/test_kit_guard.py"], cwd=REPO, capture_output=True, text=True)
    assert "timeout: 600.0s" in proc.stdout, proc.stdout[-1000:]


# Each backend kills its worker at one stage of the victim case's runs (tests.toys.dying), in the
# execs that reach that stage: a graph run constructs, captures and replays (its forward runs in
# capture and replays), an eager run constructs and runs metadata and forward.
DYING = {"DiesConstructionSigkill": ("eager", "graph"), "DiesMetadataAbort": ("eager",),
         "DiesForwardSegfault": ("eager", "graph"), "DiesCaptureSigkill": ("graph",),
         "DiesReplayAbort": ("graph",)}


def test_dead_workers_cost_only_their_runs_under_loadgroup(tmp_path):
    """Workers killed (SIGKILL, abort, segfault) at every stage of a run, under `-n 2 --dist
    loadgroup`: each death is its own run's crash, never run again, the replacement workers take
    the rest, and the session completes without an INTERNALERROR. Seven deaths, past a limit of
    two restarts: xdist's limit is for workers that die outside runs."""
    out = tmp_path / "results.json"
    backends = [a for name in DYING for a in ("--backend", f"tests.toys.dying:{name}")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-p", "no:cacheprovider",
                           "-q", "-n", "2", "--dist", "loadgroup", "--max-worker-restart", "2", "--cases", "tests.toys.tiny:CATALOG",
                           "--case-set", "smoke", "--results-json", str(out), *backends],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "INTERNALERROR" not in output, output[-3000:]
    doc = json.loads(out.read_text())
    assert doc["run"]["status"] == "complete", output[-3000:]
    from tests.toys import dying, tiny
    crashed = {(r["backend"], r["case"], r["exec"]) for r in doc["records"] if r["outcome"] != PASS}
    assert crashed == {(getattr(dying, name).name, "victim", e) for name, execs in DYING.items() for e in execs}
    assert len(doc["records"]) == len(DYING) * len(tiny.SMOKE) * 2
    signals = {"sigkill": "killed by SIGKILL", "abort": "killed by SIGABRT", "segfault": "killed by SIGSEGV"}
    for r in doc["records"]:
        if r["outcome"] != PASS:
            assert r["failure_class"] == CRASH and "crashed while running" in r["message"], r
            assert signals[r["backend"].rsplit("_", 1)[1]] in r["message"], r  # a kill and an exit read apart
    # one worker death per crash: a run that took its worker down and ran again would take another
    assert output.count("node down") == len(crashed), "a run that took its worker down ran again"



def test_a_limit_shorter_than_the_unwinding_is_a_timeout_not_a_native_hang():
    """`kit run --timeout 0.001` stopped Python mid-import; unwinding took longer than a grace as
    short as the limit, and the watchdog ended the process blaming native code (exit 75)."""
    code = ("import time\n"
            "from kit.harness.timeout import RunTimeout, time_limit\n"
            "try:\n"
            "    with time_limit(0.001):\n"
            "        try:\n"
            "            time.sleep(5)\n"
            "        except RunTimeout:\n"
            "            end = time.perf_counter() + 0.3  # unwinding through Python, slowly\n"
            "            while time.perf_counter() < end:\n"
            "                pass\n"
            "            raise\n"
            "except RunTimeout as exc:\n"
            "    print('stopped:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0 and "stopped: timeout after 0.001 s" in proc.stdout, proc.stdout + proc.stderr



@pytest.mark.parametrize("backend", ["InterpretedTimeoutBackend", "WrongThenTimesOutBackend"])
def test_a_timeout_inside_tritons_interpreter_is_a_timeout(backend, monkeypatch):
    """The interpreter wraps the kit's RunTimeout in an InterpreterError: the run was not taken for a
    timeout (no time left, it ran the batch again), and the host-mirror re-run read it as wrong."""
    import tests.toys.crashing as toys

    monkeypatch.setattr(toys.WrongThenTimesOutBackend, "instances", 0)
    r = run_case(f"{TOYS}:{backend}", BS3, Exec.EAGER, timeout=30)
    assert r.outcome == FAIL and r.failure_class == CRASH, r
    assert "InterpreterError: RunTimeout('timeout after 2 s')" in r.message, r.message
    assert r.repro.endswith(" --timeout 30"), r.repro
