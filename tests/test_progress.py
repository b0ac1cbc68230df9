"""Long runs show, per backend, runs done and an estimate of the time left, at a modest rate."""
import re

from kit.plugin.progress import Progress
from tests.test_matrix import known_failures_session
from tests.test_runs_end import misbehaving_session


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_per_backend_with_its_time_left_at_most_every_period():
    clock = Clock()
    progress = Progress(["fast"] * 10 + ["slow"] * 4, every_s=30, clock=clock)
    shown = []
    for i in range(6):  # one run a second: no period has passed
        clock.now += 1
        shown += progress.add("fast", 1.0, worker="gw0")
    assert shown == []
    clock.now += 30
    lines = progress.add("slow", 10.0, worker="gw1")
    # fast: 6 of 10 done at 1 s each, over 2 workers -> 2 s; slow: 1 of 4 at 10 s -> 15 s
    assert lines == ["progress: fast 6/10 runs, ~2s left", "progress: slow 1/4 runs, ~15s left",
                     "progress: all 7/14 runs, ~17s left"]
    assert progress.add("fast", 1.0) == []  # the next line waits a period again


def test_a_backend_without_finished_runs_is_estimated_by_the_others_and_done_ones_leave():
    clock = Clock()
    progress = Progress(["a"] * 2 + ["b"] * 3, every_s=1, clock=clock)
    progress.add("a", 2.0)
    clock.now = 5
    lines = progress.add("a", 2.0)
    assert lines == ["progress: b 0/3 runs, ~6s left", "progress: all 2/5 runs, ~6s left"]


def test_the_suite_shows_progress_per_backend(tmp_path_factory):
    proc = known_failures_session(tmp_path_factory)[0]  # toy_stale_replay and toy_hard_crash
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("progress: ")]
    assert lines and all(re.fullmatch(r"progress: (toy_stale_replay|toy_hard_crash|all) \d+/\d+ runs, ~(\d+m)?\d+s left",
                                      line) for line in lines), lines
    assert all(any(line.startswith(f"progress: {name} ") for line in lines)
               for name in ("toy_stale_replay", "toy_hard_crash")), lines
    quiet = misbehaving_session(tmp_path_factory)[0]  # a session run with --progress-every 0
    assert "progress: " not in quiet.stdout and "INTERNALERROR" not in quiet.stdout, quiet.stdout[-2000:]
