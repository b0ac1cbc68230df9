"""A run's time limit. Past it the run is stopped where it is, as a RunTimeout raised in the
main thread, so the runner records a crash at its stage and the session goes on. A run stuck in
native code never returns to Python to see it (a kernel that never ends, a wait on the device):
a grace period later (GRACE_S, or the limit itself if shorter, but MIN_GRACE_S at least) a
watchdog thread ends the process, with every thread's stack on stderr and the handler set by
`on_stuck` told first (the plugin records the run as a crash: in the results file, or for the xdist controller). Where the stuck
code holds the GIL, no thread can run: another grace period later faulthandler ends the process
from C, with the stacks."""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
from typing import Callable, Iterator, Optional

from kit.cli import STUCK

DEFAULT_S = 600.0  # a run's limit unless --timeout says otherwise
# A warmup build's limit (`kit warmup --timeout`). Longer than a run's: with a compiler busy on every
# core a FlashInfer module can compile for longer than a run's limit, and a build stopped at its limit
# loses its compile (FlashInfer's ninja goes with it), which the next process begins again.
BUILD_S = 3600.0
GRACE_S = 60
# The least grace: a limit of a millisecond stops Python mid-import, and unwinding from there takes
# longer than the limit; a grace as short would blame native code for it.
MIN_GRACE_S = 2.0
EXIT_STUCK = STUCK  # the process's exit code when a run stuck in native code ends it
# The terminal's stderr, kept before pytest's capture swaps fd 2 during a test: the stacks of a
# process that ends here must not go into a capture file that nobody reads.
_STDERR = os.dup(2)
_on_stuck: Optional[Callable[[str], Optional[str]]] = None


class RunTimeout(Exception):
    def __init__(self, seconds: float):
        super().__init__(f"timeout after {seconds:g} s")


def on_stuck(handler: Optional[Callable[[str], Optional[str]]]) -> None:
    """`handler(message)` is called before a run stuck past its limit ends the process (None: none);
    what it returns is said on stderr."""
    global _on_stuck
    _on_stuck = handler


def _end_stuck(seconds: float, grace: float) -> None:
    message = (f"timeout after {seconds:g} s, then {grace:g} s more stuck in native code (it never returned to "
               f"Python): the process ends, every thread's stack on stderr")
    with open(os.dup(_STDERR), "w") as err:
        err.write(f"\n{message}\n")
        err.flush()
        faulthandler.dump_traceback(file=err, all_threads=True)
        try:
            said = _on_stuck(message) if _on_stuck is not None else None
            if said:
                err.write(f"{said}\n")
        finally:
            err.flush()
            os._exit(EXIT_STUCK)


@contextlib.contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    if not seconds or seconds <= 0:
        yield
        return
    use_signal = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()

    def expire(signum, frame):
        raise RunTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expire) if use_signal else None
    grace = min(GRACE_S, max(seconds, MIN_GRACE_S))
    watchdog = threading.Timer(seconds + grace, _end_stuck, args=(seconds, grace))
    watchdog.daemon = True
    try:
        watchdog.start()
        faulthandler.dump_traceback_later(seconds + 2 * grace, exit=True, file=_STDERR)
        # Armed last, inside the try: a limit shorter than this set-up stops the run here, as a
        # RunTimeout in Python, and the watchdog is called off (it blamed native code for it).
        if use_signal:
            signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()
        if use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
