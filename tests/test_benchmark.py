"""The benchmarks: kit_throughput appends a complete row of one timed matrix run on a tiny selection;
many_backends and gpus keep their steps, rows and measures (busy shares, verdicts) as they say."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import SUBPROCESS_TIMEOUT_S
from benchmarks.kit_throughput import IN_BOX, SLOWEST, device, matrix_command
from benchmarks.timeline import phases
from kit.report.results import REPO, write_results

from backends.torch_native import TorchNativeBackend
from cases import CATALOG
from kit.modes import ForwardMode

# torch_native runs every smoke decode case eager (graph: unsupported, not counted)
# torch_native's smoke DECODE runs: the cases of the kinds it implements (the rest read unsupported)
SMOKE_DECODE_RUNS = len([c for c in CATALOG.cases("smoke", ForwardMode.DECODE)
                         if c.kind in TorchNativeBackend.attention_kinds])


def test_throughput_row(tmp_path):
    out, kept = tmp_path / "bench.json", tmp_path / "results.json"
    out.write_text(json.dumps([{"earlier": "row"}]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kit_throughput", "--workers", "2", "--out", str(out),
                           "--results-json", str(kept), "--case-set", "smoke", "--backend", "torch_native",
                           "--mode", "decode"],
                          cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    earlier, row = json.loads(out.read_text())
    assert earlier == {"earlier": "row"}  # appended, not replaced
    assert row["device"] == device()[0] and row["workers"] == "2" and row["cold"] is False
    assert row["runs"] == SMOKE_DECODE_RUNS and row["seconds"] > 0
    assert row["runs_per_s"] == round(row["runs"] / row["seconds"], 2)
    assert row["kit_commit"] and row["args"] == ["--backend", "torch_native", "--mode", "decode"]
    assert len(row["slowest"]) == min(SLOWEST, SMOKE_DECODE_RUNS)
    assert all(s["run"].startswith("torch_native-decode-eager-") for s in row["slowest"])
    assert [s["seconds"] for s in row["slowest"]] == sorted((s["seconds"] for s in row["slowest"]), reverse=True)
    # --results-json keeps the timed run's results: the matrix and its timing from one run
    assert len(json.loads(kept.read_text())["records"]) == 2 * len(CATALOG.matrix_cases("smoke", ForwardMode.DECODE))
    where = row["phases"]  # from the workers' timelines
    assert 0 < where["workers_ready_median_s"] <= where["workers_ready_last_s"] < row["seconds"]
    assert 0 < where["test_s"] and 0 < where["busy_share"] <= 1 and where["other_runs_median_s"] > 0
    assert where["workers_ready_last_s"] < where["last_run_end_s"] < row["seconds"] and 0 < where["cpu_share"]
    assert isinstance(row["bytecode_cached"], bool)


def test_the_in_box_matrix_unless_backends_are_named():
    default = matrix_command("auto", "full", "r.json", [])
    assert [a for a in default if a.startswith("--backend")] == [f"--backend={b}" for b in IN_BOX]
    named = matrix_command("auto", "full", "r.json", ["--backend", "triton"])
    assert [a for a in named if a.startswith("--backend")] == ["--backend"]


def _timeline(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_phases_from_timelines(tmp_path):
    """Two workers started at 1 s and 2 s: ready when their first test starts, each backend's first
    test apart from the rest, the CPU share of the tests that recorded theirs."""
    test = lambda run, t, end, **cpu: dict(event="test", id=run, t=t, end=end, **cpu)  # noqa: E731
    _timeline(tmp_path / "gw0.jsonl", [dict(event="start", t=101.0), test("a-decode-eager-x", 104.0, 106.0),
                                       test("a-decode-graph-x", 106.0, 106.5), test("b-decode-eager-x", 106.5, 109.0, cpu=2.0),
                                       dict(event="end", t=110.0)])
    _timeline(tmp_path / "gw1.jsonl", [dict(event="start", t=102.0), test("a-extend-eager-y", 105.0, 105.5),
                                       test("a-extend-graph-y", 105.5, 106.0, cpu=0.4)])
    _timeline(tmp_path / "main.jsonl", [dict(event="start", t=100.0)])  # the controller: no tests
    where = phases(str(tmp_path), t0=100.0, seconds=10.0)
    assert where == dict(workers=2, workers_ready_median_s=4.5, workers_ready_last_s=5.0, test_s=6.0, busy_share=0.3,
                         cpu_share=0.8, first_of_backend_s=5.0, other_runs_median_s=0.5, last_run_end_s=9.0)


def test_a_benchmark_step_past_its_limit_ends_with_everything_it_started(tmp_path):
    """benchmarks.many_backends: a step's command that outlives the limit is killed with its whole
    process group; a process it started (a warmup's, a compiler) would hold the output open and
    run on, and the step would wait for it."""
    from benchmarks.many_backends import Clock, _run
    pid_file = tmp_path / "child"
    child = "import time; time.sleep(60)"
    cmd = [sys.executable, "-c", f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
           f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)"]
    ran = _run(cmd, Clock(3))
    assert ran["exit_code"] == "past the time limit" and ran["seconds"] < 20, ran
    assert ran["output"] == "started\n", ran
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the step's child outlived it"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead, waiting for its parent (here init) to reap it


def test_a_benchmark_step_keeps_its_output_and_how_busy_the_cores_were(tmp_path, monkeypatch):
    """benchmarks.many_backends: `--keep` keeps a step's whole output; `cpu_busy` is the share of
    the host's cores busy over the step, from /proc/stat before and after it (read here from
    figures of the test's own: the host's real load is any other process's too)."""
    import benchmarks.many_backends as many
    readings = iter([(150, 1000), (230, 1200)])  # +80 busy of +200
    monkeypatch.setattr(many, "_cpu_ticks", lambda: next(readings))
    ran = many._run([sys.executable, "-c", "print('spun')"], many.Clock(30), keep=tmp_path / "step.log")
    assert ran["exit_code"] == 0 and (tmp_path / "step.log").read_text() == "spun\n"
    assert ran["cpu_busy"] == 0.4, ran["cpu_busy"]


def test_cpu_busy_leaves_out_idle_and_iowait(tmp_path):
    """/proc/stat's first line: user nice system idle iowait irq softirq steal; busy is all but
    idle and iowait."""
    from benchmarks.many_backends import _cpu_ticks, busy_share
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0\ncpu0 1 2 3\n")
    before = _cpu_ticks(stat)
    stat.write_text("cpu  160 0 70 860 110 0 0 0\ncpu0 1 2 3\n")  # +80 busy, +60 idle, +60 iowait
    assert before == (150, 1000) and busy_share(before, _cpu_ticks(stat)) == 0.4
    assert busy_share(None, before) is None and busy_share(before, before) is None
    assert _cpu_ticks(tmp_path / "absent") is None


# ------------------------------------------------------------- benchmarks.gpus: one GPU against all


def test_gpu_settings_are_the_first_gpu_alone_and_every_gpu():
    from benchmarks.gpus import settings
    assert settings(["1", "all"], ["2", "3"]) == [("1 GPU", "2", 1), ("2 GPUs", None, 2)]
    assert settings(["all"], ["0"]) == [("1 GPUs", None, 1)]
    with pytest.raises(SystemExit, match="no GPU here"):
        settings(["1"], [])
    with pytest.raises(SystemExit, match="--gpus 2: give 1, all or 1,all"):
        settings(["1", "2"], ["0", "1"])


def test_workers_busy_by_gpu_follows_the_placement(tmp_path):
    """Worker N runs on GPU N mod the GPUs (kit.engine.placement): gw0 and gw2 on GPU 0."""
    from benchmarks.gpus import busy_by_gpu
    from benchmarks.timeline import test_seconds
    test = lambda t, end: dict(event="test", id="a-decode-eager-x", t=t, end=end)  # noqa: E731
    for worker, tests in (("gw0", [test(0, 4), test(5, 9)]), ("gw1", [test(0, 1)]), ("gw2", [test(0, 2)]),
                          ("gw3", []), ("main", [])):
        _timeline(tmp_path / f"{worker}.jsonl", [dict(event="start", t=0.0)] + tests)
    assert test_seconds(str(tmp_path)) == dict(gw0=8.0, gw1=1.0, gw2=2.0, gw3=0.0, main=0.0)
    assert busy_by_gpu(test_seconds(str(tmp_path)), 2, 10.0) == {
        "0": dict(workers=2, test_s=10.0, busy_share=0.5), "1": dict(workers=2, test_s=1.0, busy_share=0.05)}


def test_verdicts_are_compared_run_by_run_with_the_committed_ones():
    from benchmarks.gpus import compare_verdicts
    from tests.test_matrix import record as rec
    committed = [rec("a"), rec("b", "fail", "graph"), rec("c", "unsupported")]
    assert compare_verdicts([rec("a"), rec("b", "fail", "graph")], committed) == dict(
        verdicts_equal=True, verdicts_differ=[], verdicts_differing=0)
    other = compare_verdicts([rec("a"), rec("b", "fail", "kernel"), rec("d")], committed)
    assert other == dict(verdicts_equal=False, verdicts_differ=["be-decode-eager-b", "be-decode-eager-d"],
                         verdicts_differing=2)
    assert compare_verdicts([], committed)["verdicts_equal"] is False


def test_gpu_samples_give_each_gpus_utilization_and_the_memory_peak():
    from benchmarks.many_backends import GpuPoll, gpu_sample
    assert gpu_sample("0, 1200, 35\n1, 800, 90\n") == {"0": (1200, 35), "1": (800, 90)}
    poll = GpuPoll()
    poll.samples = [gpu_sample("0, 1200, 30\n1, 800, 90\n"), gpu_sample("0, 1000, 50\n1, 1500, 70\n")]
    assert poll.peak == 2500 and poll.utilization() == {"0": 40.0, "1": 80.0}
    assert GpuPoll().peak is None and GpuPoll().utilization() == {}


def test_the_backends_are_the_in_box_four_unless_named():
    from benchmarks.gpus import IN_BOX, backends
    from kit.harness.registry import known_backends
    assert backends(False, ["--mode", "decode"]) == (list(IN_BOX), ["--mode", "decode"])
    assert backends(True, []) == (known_backends(), [])
    assert backends(True, ["--backend", "triton", "-k", "x", "--backend=a,b"]) == (["triton", "a", "b"], ["-k", "x"])


def test_one_command_appends_a_warmup_row_then_each_setting_in_turn(monkeypatch, tmp_path):
    """The matrix runs stand in (their results file and timelines planted): the rows, in order, each
    with its GPUs, CUDA_VISIBLE_DEVICES, workers busy by GPU and verdicts against the committed."""
    import benchmarks.gpus as gpus
    from tests.test_matrix import rec
    committed = tmp_path / "committed.json"
    write_results(committed, [rec("a"), rec("b")])
    ran = []

    def measure(name, workers, case_set, cold, extra, keep, timeline, env):
        ran.append((env.get("CUDA_VISIBLE_DEVICES"), extra))
        verdict_b = "fail" if len(ran) == 2 else "pass"  # the second run disagrees on b
        write_results(keep, [rec("a"), rec("b", verdict_b, "kernel" if verdict_b == "fail" else None)])
        os.makedirs(timeline)
        _timeline(Path(timeline) / "gw0.jsonl", [dict(event="test", id="a-decode-eager-a", t=0.0, end=3.0)])
        _timeline(Path(timeline) / "gw1.jsonl", [dict(event="test", id="a-decode-eager-b", t=0.0, end=1.0)])
        return dict(device=name, workers=workers, runs=2, seconds=4.0, runs_per_s=0.5, cold=cold, kit_commit="x",
                    case_set=case_set, args=extra, phases=None, slowest=[])

    monkeypatch.setattr(gpus, "measure", measure)
    monkeypatch.setattr(gpus, "warmup", lambda specs, *a: dict(step="warmup", seconds=9.0, exit_code=0,
                                                               builds=len(specs)))
    monkeypatch.setattr(gpus, "gpus_here", lambda: ["0", "1"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "rows.json"
    gpus.main(["--out", str(out), "--committed", str(committed), "--mode", "decode"])
    rows = json.loads(out.read_text())
    assert [(r["step"], r.get("label")) for r in rows] == [("warmup", None), ("matrix", "1 GPU"), ("matrix", "2 GPUs"),
                                                          ("matrix", "1 GPU"), ("matrix", "2 GPUs")]
    assert [env for env, _ in ran] == ["0", None, "0", None]
    assert ran[0][1] == [f"--backend={b}" for b in gpus.IN_BOX] + ["--mode", "decode"]
    assert rows[0]["builds"] == len(gpus.IN_BOX) and all(r["backends"] == list(gpus.IN_BOX) for r in rows)
    one, two = rows[1], rows[2]
    assert (one["gpus"], one["cuda_visible_devices"], two["gpus"], two["cuda_visible_devices"]) == (1, "0", 2, None)
    assert one["workers_busy_by_gpu"] == {"0": dict(workers=2, test_s=4.0, busy_share=0.5)}
    assert two["workers_busy_by_gpu"] == {"0": dict(workers=1, test_s=3.0, busy_share=0.75),
                                          "1": dict(workers=1, test_s=1.0, busy_share=0.25)}
    assert [r["verdicts_equal"] for r in rows[1:]] == [True, False, True, True]
    assert two["verdicts_differ"] == ["be-decode-eager-b"] and two["compared_with"] == str(committed)
    assert one["seconds"] == 4.0 and one["runs"] == 2 and "kit_commit" in one and one["device"] == rows[0]["device"]


def test_keep_leaves_each_settings_results_file_in_the_folder(monkeypatch, tmp_path):
    """--keep DIR: the matrix runs' results files stay there, one per setting, named by its GPUs."""
    import benchmarks.gpus as gpus
    from tests.test_matrix import rec
    committed = tmp_path / "committed.json"
    write_results(committed, [rec("a")])

    def measure(name, workers, case_set, cold, extra, keep, timeline, env):
        write_results(keep, [rec("a")])
        os.makedirs(timeline)
        return dict(device=name, workers=workers, runs=1, seconds=1.0, runs_per_s=1.0, cold=cold, kit_commit="x",
                    case_set=case_set, args=extra, phases=None, slowest=[])

    monkeypatch.setattr(gpus, "measure", measure)
    monkeypatch.setattr(gpus, "gpus_here", lambda: ["0", "1"])
    kept = tmp_path / "kept"
    kept.mkdir()
    gpus.main(["--out", str(tmp_path / "rows.json"), "--committed", str(committed), "--no-warmup", "--repeat", "1",
               "--keep", str(kept)])
    assert sorted(p.name for p in kept.iterdir()) == ["results-1gpu.json", "results-2gpu.json"]


def test_time_split_row_says_where_each_backend_and_modes_seconds_went(tmp_path):
    """A planted compile (tests.toys.compiling, a real Triton compile on an empty cache) shows as
    its backend's compile, apart from its kernel; the references, kernels and the kit's rest add up
    to the seconds in runs."""
    out = tmp_path / "split.json"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.time_split", "--workers", "0", "--out", str(out),
                           "--case-set", "smoke", "--cases", "tests.toys.tiny:CATALOG", "--backend", "torch_native",
                           "--backend", "tests.toys.compiling:CompilingBackend"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["cores"] == os.cpu_count() and row["versions"]["torch"] and row["gpu_busy_share"] is None  # no GPU
    assert row["compiles"] == {"triton": 2} and row["compiles_total"] == 2  # one kernel per head_dim
    toy, native = row["split"]["toy_compiling decode"], row["split"]["torch_native decode"]
    assert toy["compiles"] == {"triton": 2} and 0 < toy["compile_by_library_s"]["triton"] == toy["compile_s"]
    assert native["compiles"] == {} and native["compile_s"] == 0
    for part in (toy, native):
        assert part["runs"] > 0 and part["reference_s"] > 0 and part["kernel_s"] > 0 and part["kit_s"] > 0
        parts = part["compile_s"] + part["reference_s"] + part["kernel_s"] + part["load_s"] + part["kit_s"]
        assert abs(parts - part["run_s"]) < 0.05, part
