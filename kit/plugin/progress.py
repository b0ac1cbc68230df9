"""Progress of a long session: every `every_s` seconds (not per test) one line per backend that
has runs left, one for the kit's own tests where the session has them (the README's test
command), and a total with an estimate of the time left (Progress.left_s). Torch-free."""
from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Dict, Iterable, List, Optional, Tuple

EVERY_S = 30.0  # a line per backend this often at most: a long run's pulse, not a log


class RunTimes:
    """Per backend: finished runs and the seconds they took; their mean."""

    def __init__(self):
        self.finished: Dict[str, int] = collections.Counter()
        self.spent: Dict[str, float] = collections.Counter()

    def add(self, backend: str, seconds: float) -> None:
        self.finished[backend] += 1
        self.spent[backend] += seconds

    def mean(self, backend: Optional[str] = None, default: Optional[float] = None) -> Optional[float]:
        """The mean time of `backend`'s finished runs (of every backend's where it has none);
        `default` before any run finished."""
        runs = self.finished[backend] if backend else sum(self.finished.values())
        spent = self.spent[backend] if backend else sum(self.spent.values())
        if runs and spent > 0:
            return spent / runs
        return self.mean(None, default) if backend else default


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


KIT_TESTS = "the kit's own tests"  # the tests of a session that are no conformance run


def kit_tests(path: str) -> str:
    """The group of the kit's own tests of the file at `path`: a file's tests cost alike (a file of
    subprocess sessions, one of arithmetic), the kit's tests as a whole do not; shown as KIT_TESTS."""
    return f"{KIT_TESTS} in {path}"


def shown(group: str) -> str:
    """The line a group's tests are counted on: a backend's own, or KIT_TESTS for every test file's."""
    return KIT_TESTS if group.startswith(KIT_TESTS) else group

SHRINK = 3  # a group's mean is drawn toward every group's by this many runs' weight
# The tests finished in the last RECENT_S seconds of wall time (or the last fifth of the session, if
# longer) say how loaded the machine is now: long enough to hold a few of a file's slowest tests.
RECENT_S = 180.0


class Progress:
    def __init__(self, planned: Iterable[str], every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        """`planned`: the group of every selected test: a run's backend, or KIT_TESTS."""
        self.planned: Dict[str, int] = collections.Counter(planned)
        self.every_s, self.clock = every_s, clock
        self.finished: Dict[str, int] = collections.Counter()
        self.spent = 0.0  # seconds of every finished test
        self.steady = RunTimes()  # per group, its tests but each worker's first run of a backend
        self.loaded: set = set()  # (backend, worker) of the first runs seen
        self.recent: Deque[Tuple[float, str, float]] = collections.deque()  # (ended at, group, seconds) in self.steady
        self.reported: Dict[object, float] = {}  # per worker, when its last test ended
        self.start = self.last = clock()

    def add(self, group: str, seconds: float, worker: object = None) -> List[str]:
        """Counts a finished test of `group` on `worker`, of `seconds`; the lines to show now (none
        until `every_s` has passed)."""
        self.finished[group] += 1
        self.spent += seconds
        if shown(group) == KIT_TESTS or (group, worker) in self.loaded:
            self.recent.append((self.clock(), group, seconds))
            self.steady.add(group, seconds)
        self.loaded.add((group, worker))
        self.reported[worker] = self.clock()
        if self.every_s <= 0 or self.clock() - self.last < self.every_s:
            return []
        self.last = self.clock()
        return self.lines()

    def _mean(self, group: str) -> float:
        """The group's mean seconds, but a worker's first run of a backend, which loads what its
        other runs reuse (kernels, the backend's imports); drawn toward every group's while it has
        few runs."""
        overall = self.steady.mean(default=self.spent / max(sum(self.finished.values()), 1))
        n = self.steady.finished[group]
        return (self.steady.spent[group] + SHRINK * overall) / (n + SHRINK)

    def _pace(self) -> float:
        """How much longer than their groups' means the tests of the last RECENT_S seconds took,
        against the session's tests: a machine loaded since (or freed) makes every test left take
        that much longer (or shorter), which means over the whole session learn only slowly. Sums
        over a stretch of wall time, each test against its group's mean as it is now: a file's quick
        tests between its slow ones (a pace of per-test ratios took them for the machine),
        or a file of slow tests begun, are the file's cost, which its mean holds, not the machine's."""
        now = self.clock()
        while self.recent and self.recent[0][0] < now - max(RECENT_S, (now - self.start) / 5):
            self.recent.popleft()
        means = {group: self._mean(group) for group in self.steady.finished}
        usual = sum(self.steady.spent.values()) / max(sum(n * means[g] for g, n in self.steady.finished.items()), 1e-9)
        took = sum(seconds for _, _, seconds in self.recent)
        expected = sum(means[group] for _, group, _ in self.recent)
        return took / expected / usual if took > 0 and expected > 0 and usual > 0 else 1.0

    def left_s(self) -> Optional[float]:
        """The time left: the work left (each group's tests left times its mean, at the latest
        tests' pace) over the work done in a second of wall time so far. The work done is the
        finished tests' and what each worker has been running since its last test ended (a
        backend's first run may load it for minutes): no count of workers, which grows while they
        start, and no first runs' loads taken for what every run costs."""
        now = self.clock()
        busy = self.spent + sum(now - at for at in self.reported.values())
        if busy <= 0 or now <= self.start:
            return None
        left = sum(max(total - self.finished[g], 0) * self._mean(g) for g, total in self.planned.items())
        return left * self._pace() * (now - self.start) / busy

    def lines(self) -> List[str]:
        out = []
        planned, finished = collections.Counter(), collections.Counter()
        for group, total in self.planned.items():
            planned[shown(group)] += total
            finished[shown(group)] += self.finished[group]
        for group, total in planned.items():
            if finished[group] < total:
                out.append(f"progress: {group} {finished[group]}/{total} {'tests' if group == KIT_TESTS else 'runs'}")
        done, total = sum(self.finished.values()), sum(self.planned.values())
        left = self.left_s()
        out.append(f"progress: all {done}/{total}" + (f", ~{_duration(left)} left" if left is not None else ""))
        return out
