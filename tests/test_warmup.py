"""`python -m kit warmup`: every kernel variant of the selection built once, in parallel, with
progress, before any run."""
import os
import subprocess
import sys

from kit.engine.catalog import Catalog
from kit.process.placement import threads_per_worker
from kit.modes import EXECS, MODES, Exec, ForwardMode
from kit.warmup import bar, builds, next_build, runs_here
from tests.test_matrix import REPO
from tests.toys import tiny


def test_one_build_per_backend_mode_and_variant_on_its_smallest_case():
    todo = builds(["a", "b"], list(MODES), list(EXECS), tiny.CATALOG, "smoke")
    assert len(todo) == 2 * len({c.kernel_variant for c in tiny.SMOKE}) == 8
    assert {b.case.name for b in todo} == {"first_a", "victim", "after_a", "after_b"}  # first_a: smaller than first_b
    assert {b.exec_ for b in todo} == {Exec.EAGER}
    assert {b.exec_ for b in builds(["a"], list(MODES), [Exec.GRAPH], tiny.CATALOG, "smoke")} == {Exec.GRAPH}
    assert builds(["a"], [ForwardMode.EXTEND], list(EXECS), tiny.CATALOG, "smoke") == []
    assert bar(3, 12).endswith("] 3/12") and bar(3, 12).count("#") == 6


def test_a_build_runs_the_smallest_case_its_backend_runs():
    """A case the backend declines builds nothing: the next smallest of its variant is built, and a
    variant it declines whole is not built (kit.harness.scope decides, as for the runs)."""
    todo = builds(["a"], list(MODES), list(EXECS), tiny.CATALOG, "smoke",
                  runs=lambda backend, case, exec_: case.name not in ("first_a", "after_b"))
    assert {b.case.name for b in todo} == {"first_b", "victim", "after_a"}
    assert runs_here("tests.toys.dense:DenseGraphBackend", tiny.SMOKE[0], Exec.GRAPH)
    assert builds(["tests.toys.unavailable:MissingLibraryBackend"], list(MODES), list(EXECS), tiny.CATALOG, "smoke",
                  runs=runs_here) == []


def test_warmup_builds_each_variant_once_in_parallel_with_progress(tmp_path):
    log = tmp_path / "builds"
    log.touch()
    proc = subprocess.run([sys.executable, "-m", "kit", "warmup", "--backend", "tests.toys.building:RecordingBackend",
                           "--cases", "tests.toys.tiny:CATALOG", "--case-set", "smoke", "--jobs", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
                               "KIT_TOY_BUILDS": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().splitlines()
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)
    # each process runs torch on its share of the cores, as a session's worker does
    assert {line.rsplit(" threads ", 1)[1] for line in lines} == {str(threads_per_worker(default, 2))}, lines
    lines = [line.rsplit(" threads ", 1)[0] for line in lines]
    variants = [line.rsplit(" pid ", 1)[0] for line in lines]
    assert len(variants) == len(set(variants)) == len({c.kernel_variant for c in tiny.SMOKE}), lines
    # Two processes, each running builds one after another (not a process a build)
    assert len({line.rsplit(" pid ", 1)[1] for line in lines}) == 2 < len(lines), lines
    assert (tmp_path / "builds.overlap").read_text().split() == ["together"] * len(lines), "not in parallel"
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [p.split("] ", 1)[1].split()[0] for p in progress] == [f"{i}/{len(lines)}" for i in range(1, len(lines) + 1)]
    assert all(": pass, " in p for p in progress), proc.stdout  # what the backend printed did not get in the way
    assert proc.stdout.splitlines()[-1].endswith(", 2 processes, 0 compiles (every kernel came from the caches)"), proc.stdout


def test_a_build_that_takes_its_process_down_costs_only_that_build():
    proc = subprocess.run([sys.executable, "-m", "kit", "warmup", "--backend", "tests.toys.dying:DiesConstructionSigkill",
                           "--cases", "tests.toys.tiny:CATALOG", "--case-set", "smoke", "--jobs", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(progress) == len({c.kernel_variant for c in tiny.SMOKE}) == 4, proc.stdout
    lost = [p for p in progress if "(victim)" in p]
    assert len(lost) == 1 and ": its process ended with no verdict, killed by SIGKILL (exit code -9)" in lost[0], proc.stdout
    assert all(": pass, " in p for p in progress if p not in lost), proc.stdout
    assert proc.stdout.splitlines()[-1].endswith(", 2 processes, 0 compiles (every kernel came from the caches)"), proc.stdout  # a new one took the rest


def test_a_backend_derived_from_a_registered_one_builds_as_that_one():
    """33 mutants of the Triton backend build Triton's kernels once, not 33 times."""
    from kit.harness.registry import kernels_of
    mutants = ["tests.mutants.triton:BsFromBufferLength", "tests.mutants.triton:WindowOneShort"]
    assert {kernels_of(spec) for spec in mutants + ["triton"]} == {"triton"}
    assert kernels_of("tests.toys.building:RecordingBackend") == "tests.toys.building:RecordingBackend"
    assert kernels_of("os:path") == "os:path"  # no backend class: its own (the run says what is wrong)
    one = builds(["triton"], list(MODES), list(EXECS), tiny.CATALOG, "smoke", kernels_of)
    assert builds(mutants + ["triton"], list(MODES), list(EXECS), tiny.CATALOG, "smoke", kernels_of) == one


def test_a_process_keeps_to_its_backend_then_helps_where_most_is_left_per_process():
    todo = builds(["quick", "slow", "mid"], list(MODES), list(EXECS), tiny.CATALOG, "smoke")
    pending = list(todo)
    assert next_build("quick", pending, {}).backend == "quick"  # its backend is loaded
    pending = [b for b in pending if b.backend != "quick"]  # quick is done: 4 slow and 4 mid left
    assert next_build("quick", list(pending), {"slow": 3, "mid": 1}).backend == "mid"  # 4/2 > 4/4
    assert next_build("quick", list(pending), {"slow": 1, "mid": 3}).backend == "slow"
    pending = [b for b in pending if b.backend != "mid" or b.case.name == "victim"]  # 4 slow, 1 mid
    assert next_build("quick", pending, {"slow": 3}).backend == "slow"
    assert len(pending) == 4


def test_a_process_whose_device_faulted_runs_no_more_builds():
    """A sticky device fault stays in its process: the build that met it is its backend's crash,
    and a new process runs the rest (in the faulted one they would all fail)."""
    proc = subprocess.run([sys.executable, "-m", "kit", "warmup", "--backend", "tests.toys.dying:DiesForwardFault",
                           "--cases", "tests.toys.tiny:CATALOG", "--case-set", "smoke", "--jobs", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [": fail [crash], " in p for p in progress] == ["(victim)" in p for p in progress], proc.stdout
    assert sum(": pass, " in p for p in progress) == 3, proc.stdout
    assert proc.stdout.splitlines()[-1].endswith(", 2 processes, 0 compiles (every kernel came from the caches)"), proc.stdout


def test_a_build_has_longer_than_a_run_since_a_compile_stopped_at_its_limit_is_lost(monkeypatch):
    """With a compiler busy on every core, one of SGLang's FlashInfer modules took over a run's
    600 s; stopped there, its compile is lost and the next process begins it again."""
    from kit import __main__ as cli, warmup
    from kit.harness.timeout import DEFAULT_S
    limits = []
    monkeypatch.setattr(warmup, "warmup", lambda todo, jobs, cases, timeout: limits.append(timeout) or [])
    argv = ["warmup", "--backend", "tests.toys.building:RecordingBackend", "--cases", "tests.toys.tiny:CATALOG",
            "--case-set", "smoke"]
    assert cli.main(argv) == 0 and cli.main([*argv, "--timeout", "90"]) == 0
    assert limits[0] >= 6 * DEFAULT_S and limits[1] == 90, limits


def test_a_long_build_is_named_while_it_runs(tmp_path, monkeypatch):
    """A FlashInfer module can compile for ten minutes: with no build finished for `quiet_s`, a
    line names the builds running longest and for how long (not a progress line: counts of those
    stay the builds')."""
    import io
    from kit import warmup
    monkeypatch.setenv("KIT_TOY_BUILDS", str(tmp_path / "builds"))
    monkeypatch.setenv("KIT_TOY_BUILD_WAIT_S", "3")  # alone, each build waits this long for another
    todo = builds(["tests.toys.building:RecordingBackend"], list(MODES), list(EXECS), tiny.CATALOG, "smoke")[:1]
    out = io.StringIO()
    assert warmup.warmup(todo, 1, "tests.toys.tiny:CATALOG", timeout=120, out=out, quiet_s=1.0) == []
    lines = out.getvalue().splitlines()
    named = [line for line in lines if line.startswith("warmup: 0/1 done, still building 1: ")]
    assert len(named) >= 2 and named[-1].startswith(f"warmup: 0/1 done, still building 1: {todo[0].what} "), lines
    assert named[-1].endswith(" s") and int(named[-1].rsplit(" ", 2)[1]) >= 3, lines  # how long it has run
    assert [line for line in lines if line.startswith("[")] == [lines[-2]] and ": pass, " in lines[-2], lines
