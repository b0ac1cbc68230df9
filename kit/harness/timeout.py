"""A run's time limit. Past it the run is stopped where it is, as a RunTimeout raised in the
main thread, so the runner records a crash at its stage and the session goes on. A run stuck in
native code never returns to Python to see it: GRACE_S later the process ends, with every
thread's stack on stderr (under -n, xdist records the dead worker's run as a crash)."""
from __future__ import annotations

import contextlib
import faulthandler
import signal
import threading
from typing import Iterator, Optional

DEFAULT_S = 600.0  # a run's limit unless --timeout says otherwise
GRACE_S = 60


class RunTimeout(Exception):
    def __init__(self, seconds: float):
        super().__init__(f"timeout after {seconds:g} s")


@contextlib.contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    if not seconds or seconds <= 0:
        yield
        return
    use_signal = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()

    def expire(signum, frame):
        raise RunTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expire) if use_signal else None
    if use_signal:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + GRACE_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
