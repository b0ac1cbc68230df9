"""Progress of a long run, per backend, with an estimate of the time left: every `every_s`
seconds (not per run) one line per backend that has runs left, and a total. The estimate is
each backend's runs left times the mean time of its finished runs (of all finished runs while
it has none), spread over the workers. Torch-free."""
from __future__ import annotations

import collections
import time
from typing import Callable, Dict, Iterable, List, Optional

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


class Progress:
    def __init__(self, planned: Iterable[str], every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        """`planned`: the backend of every selected run."""
        self.planned: Dict[str, int] = collections.Counter(planned)
        self.every_s, self.clock = every_s, clock
        self.times = RunTimes()
        self.workers: set = set()
        self.last = clock()

    def add(self, backend: str, seconds: float, worker: object = None) -> List[str]:
        """Counts a finished run; the lines to show now (none until `every_s` has passed)."""
        self.times.add(backend, seconds)
        self.workers.add(worker)
        if self.every_s <= 0 or self.clock() - self.last < self.every_s:
            return []
        self.last = self.clock()
        return self.lines()

    def _left_s(self, backend: str) -> Optional[float]:
        mean = self.times.mean(backend)
        left = self.planned[backend] - self.times.finished[backend]
        return None if mean is None else max(left, 0) * mean / max(len(self.workers), 1)

    def lines(self) -> List[str]:
        out = []
        for backend, total in self.planned.items():
            done = self.times.finished[backend]
            if done >= total:
                continue
            left = self._left_s(backend)
            out.append(f"progress: {backend} {done}/{total} runs" + (f", ~{_duration(left)} left" if left is not None else ""))
        done, total = sum(self.times.finished.values()), sum(self.planned.values())
        left = sum(s for s in map(self._left_s, self.planned) if s is not None)
        out.append(f"progress: all {done}/{total} runs, ~{_duration(left)} left")
        return out
