"""Long sessions show, per backend and for the kit's own tests, what is done, and an estimate of the
time left that holds steady, at a modest rate."""
import heapq
import random
import re
import subprocess
import sys

import pytest

from cases import CATALOG
from kit.modes import MODES
from kit.plugin.progress import KIT_TESTS, Progress, kit_tests, shown
from tests.test_matrix import REPO, known_failures_session
from tests.test_runs_end import misbehaving_session


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_per_backend_and_for_the_kits_tests_at_most_every_period():
    clock = Clock()
    progress = Progress(["fast"] * 10 + ["slow"] * 4 + [KIT_TESTS] * 6, every_s=30, clock=clock)
    shown = []
    for i in range(6):  # one run a second: no period has passed
        clock.now += 1
        shown += progress.add("fast", 1.0)
    assert shown == []
    clock.now += 30
    lines = progress.add("slow", 10.0)
    assert lines[:3] == ["progress: fast 6/10 runs", "progress: slow 1/4 runs", f"progress: {KIT_TESTS} 0/6 tests"]
    assert re.fullmatch(r"progress: all 7/20, ~(\d+m)?\d+s left", lines[3]), lines
    assert progress.add("fast", 1.0) == []  # the next line waits a period again


def test_the_time_left_is_the_work_left_over_the_work_done_a_second():
    """gw0 ran 6 fast runs by t=0 (its first a load: 9 s), gw1 one slow run (a load too) ending at
    t=36, after which gw0 has been busy 36 s on a run not ended: 24 s of work done, 36 s of it in
    flight, in 36 s of wall time. Left: 4 fast runs at the mean of the 5 that loaded nothing (1 s),
    3 slow ones at every group's mean, as the slow one ran nothing but its load."""
    clock = Clock()
    progress = Progress(["fast"] * 10 + ["slow"] * 4, every_s=30, clock=clock)
    progress.add("fast", 9.0, "gw0")
    for _ in range(5):
        progress.add("fast", 1.0, "gw0")
    clock.now = 36
    progress.add("slow", 10.0, "gw1")
    assert abs(progress.left_s() - (4 * 1.0 + 3 * 1.0) * 36 / (24 + 36)) < 1e-9


SESSIONS = {
    # The README's test command on CPU: the kit's tests (most short, a few subprocess sessions) and
    # two backends; a worker's first run of a backend loads it (eight runs' time).
    "tests_and_two_backends": dict(runs=[("fast", 1.0, 200), ("slow", 5.0, 60)], load=8, kit=(0.2, 20.0), start=0.0),
    # A JIT backend on a fresh machine: its first run on each worker builds for 50 runs' time, the
    # workers starting 3 s apart (the count of workers seen grows while they start).
    "jit_and_staggered_workers": dict(runs=[("fast", 1.0, 200), ("jit", 2.0, 40)], load=50, kit=(0.2, 5.0),
                                      start=3.0),
    # A machine that other work loads from the middle of the session on: every test started after
    # half of them takes 3x as long (a 2-core machine going from idle to a load of 6).
    "loaded_midway": dict(runs=[("fast", 1.0, 200), ("slow", 5.0, 60)], load=8, kit=(0.2, 20.0), start=0.0,
                          slowdown=(0.5, 3.0)),
}


def _session(kind: str, seed: int):
    """A session of 4 workers running the tests of SESSIONS[kind] in a shuffled order."""
    spec, rng = SESSIONS[kind], random.Random(seed)
    items = [(group, seconds) for group, seconds, n in spec["runs"] for _ in range(n)]
    items += [(KIT_TESTS, rng.choice((spec["kit"][0],) * 3 + (spec["kit"][1],))) for _ in range(150)]
    rng.shuffle(items)
    return _timeline(items, 4, spec["load"], spec["start"], spec.get("slowdown", (1.0, 1.0)))


def _timeline(items, workers: int, load: float, start: float, slowdown=(1.0, 1.0)):
    """`workers` running `items` ((group, seconds) each) in their order, each taking the next when
    free, a worker's first run of a backend `load` times as long, the workers starting `start` s
    apart, every test after a share `slowdown[0]` of them `slowdown[1]` times as long: when each
    progress line came, the time left it said, and the time that was left; and the session's length."""
    clock = Clock()
    progress = Progress([group for group, _ in items], every_s=10, clock=clock)
    free, loaded, ends, said = [(start * w, w) for w in range(workers)], set(), [], []
    slow_from, factor = slowdown
    for i, (group, seconds) in enumerate(items):
        begin, worker = heapq.heappop(free)
        seconds *= factor if i >= slow_from * len(items) else 1.0
        if shown(group) != KIT_TESTS and (worker, group) not in loaded:
            loaded.add((worker, group))
            seconds *= load
        heapq.heappush(free, (begin + seconds, worker))
        ends.append((begin + seconds, group, seconds, worker))
    last = max(end for end, _, _, _ in ends)
    for end, group, seconds, worker in sorted(ends):
        clock.now = end
        for line in progress.add(group, seconds, worker):
            found = re.fullmatch(r"progress: all \d+/\d+, ~(?:(\d+)m)?(\d+)s left", line)
            if found:
                said.append((end, int(found[1] or 0) * 60 + int(found[2]), last - end))
    return said, last


def _holds_steady(said, last):
    """Past a fifth of the session no estimate over 3x the time left; past a third each within 3x of
    it either way; give or take a twentieth of the session (a test in flight, a backend's loads on
    workers yet to run it and the tests of a file not yet begun are not foreseen: they are read at
    the mean of every test so far)."""
    slack = last / 20
    assert said
    assert all(left <= 3 * truth + slack for at, left, truth in said if at > last / 5), said
    assert all(truth / 3 - slack <= left <= 3 * truth + slack for at, left, truth in said if at > last / 3), said


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", SESSIONS)
def test_the_estimate_holds_steady(kind, seed):
    """A count of workers that grows as they start, and a backend's loads taken for its runs, made
    the estimate swing from ~28s to ~5m44s."""
    _holds_steady(*_session(kind, seed))


# The README's test command on 2 cores, as the kit's test files come (in their order, each file's tests
# together): files of quick tests, and files of subprocess sessions, each test a pytest or kit process
# of half a minute or more; the conformance runs of two backends among them (as test_conformance.py).
README_FILES = [("a", 40, 0.3), ("b", 12, 30.0), ("c", 60, 0.2), ("d", 30, 40.0), ("e", 80, 0.1), ("f", 10, 25.0),
                ("g", 50, 0.5), ("h", 20, 60.0), ("i", 70, 0.2), ("j", 15, 35.0), ("k", 40, 0.3)]


def _readme_session(quick_among_slow: int = 0, seed: int = 0):
    """README_FILES with the conformance runs after file c; each file of slow tests also holds
    `quick_among_slow` quick tests (0.05 s) per slow one, in a shuffled order."""
    rng, items = random.Random(seed), []
    for name, n, seconds in README_FILES:
        tests = [seconds] * n + ([0.05] * (quick_among_slow * n) if seconds > 1 else [])
        rng.shuffle(tests)
        items += [(kit_tests(f"tests/test_{name}.py"), t) for t in tests]
        if name == "c":
            items += [("fast", 1.0)] * 200 + [("slow", 5.0)] * 60
    return _timeline(items, 2, 8, 0.0)


def test_the_estimate_holds_steady_through_files_of_slow_tests():
    """Files of subprocess sessions among files of quick tests: read at the mean of the kit's tests as
    a whole and at the pace of the latest 30 tests' seconds over it, the estimate said up to 15x the
    time left (a file of slow tests begun: the pace ~100x) and down to 1/100 of it (quick tests
    after slow ones)."""
    _holds_steady(*_readme_session())


@pytest.mark.parametrize("seed", range(4))
def test_the_estimate_holds_steady_through_files_of_quick_and_slow_tests(seed):
    """A file's quick tests between its slow ones: read at a pace that was the median of the latest
    30 tests' seconds over their files' means (each a quick test's, far under its file's mean), the
    estimate said ~8s left with 23 minutes to go, as the README's command on 2 cores showed (~1s left,
    then ~4m34s)."""
    _holds_steady(*_readme_session(quick_among_slow=4, seed=seed))


def test_the_suite_shows_progress_per_backend(tmp_path_factory):
    proc = known_failures_session(tmp_path_factory)[0]  # toy_stale_replay and toy_hard_crash
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("progress: ")]
    assert lines and all(re.fullmatch(r"progress: (toy_stale_replay|toy_hard_crash) \d+/\d+ runs", line) or
                         re.fullmatch(r"progress: all \d+/\d+, ~(\d+m)?\d+s left", line) for line in lines), lines
    assert all(any(line.startswith(f"progress: {name} ") for line in lines)
               for name in ("toy_stale_replay", "toy_hard_crash")), lines
    quiet = misbehaving_session(tmp_path_factory)[0]  # a session run with --progress-every 0
    assert "progress: " not in quiet.stdout and "INTERNALERROR" not in quiet.stdout, quiet.stdout[-2000:]


def test_a_session_with_the_kits_tests_counts_them_and_says_what_to_do_next(tmp_path):
    """The README's test command runs the kit's tests beside the conformance runs: both counted;
    at the end the results file, how complete, what `--case-set auto` left out on CPU, and the two
    commands to run next."""
    out = tmp_path / "results-local.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "tests/test_kit_capabilities.py",
                           "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--backend",
                           "tests.toys.dense:CiSubsetBackend", "--progress-every", "0.001", "--results-json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    kit_tests = [line for line in lines if line.startswith(f"progress: {KIT_TESTS} ")]
    totals = [line for line in lines if line.startswith("progress: all ")]
    assert kit_tests and totals, proc.stdout[-3000:]
    total = int(totals[0].split("/")[1].split(",")[0])
    assert total == 2 + int(kit_tests[0].split("/")[1].split()[0])  # mqa_p1_shuf eager and graph, and the tests
    if not pytest.importorskip("torch").cuda.is_available():
        smoke = sum(len(CATALOG.matrix_cases("smoke", m)) for m in MODES)
        assert (f"narrowed: toy_ci_subset ran its ci_cases only, 1 of {smoke} smoke cases (`--case-set auto` without "
                f"CUDA; `--case-set smoke` runs them all)") in lines, proc.stdout[-3000:]
    assert f"results: {out} (complete: 2 of 2 selected runs recorded)" in lines
    assert f"next: python -m matrix check --fresh {out}   (the gate: every failure known, verdicts as committed)" in lines
    assert any(line.strip().startswith(f"python -m matrix html --results {out}") and "results-local.html" in line
               for line in lines), proc.stdout[-3000:]


def test_tests_of_no_measurable_time_leave_no_estimate_to_divide_by_zero():
    """Records of crashed runs carry no seconds (0.0): the estimate still comes, or says nothing."""
    clock = Clock()
    progress = Progress(["crashing"] * 40 + ["fast"] * 5, every_s=30, clock=clock)
    for _ in range(40):
        clock.now += 1
        progress.add("crashing", 0.0, "gw0")
    clock.now += 30
    assert progress.add("fast", 0.0, "gw0")[-1].startswith("progress: all 41/45")

