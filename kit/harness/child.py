"""Kit commands in a process of their own, so that a run that takes its process down (a segfault,
an abort, a device fault) costs only that process: a quarantined run (kit.harness.isolate), a
warmup build (kit.warmup), a mutant's runs (kit.mutation), a fuzzed mutant (kit.fuzz.mutants).
One way to start them, to read the JSON line that is their answer, and to say how one ended
without it. Torch-free."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from typing import Dict, List, Optional

from kit.report.results import REPO


def command(module: str, *args: str) -> List[str]:
    """`python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def environment() -> Dict[str, str]:
    """This process's environment, the repository importable from any directory (the in-box
    mutants and toys live in its tests/, which is not installed)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), path)))}


def ending(returncode: int) -> str:
    """`exit code 3`, or `killed by SIGKILL (exit code -9)`: a signal named."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name} (exit code {returncode})"
        except ValueError:
            pass
    return f"exit code {returncode}"


@dataclasses.dataclass
class Ended:
    """A child that ended: its exit code and what it wrote."""

    returncode: int
    stdout: str
    stderr: str

    def answer(self, prefix: str = "") -> Optional[dict]:
        """The last stdout line that starts with `prefix` and is JSON after it, or None."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith(prefix):
                try:
                    return json.loads(line[len(prefix):])
                except json.JSONDecodeError:
                    continue
        return None

    def death(self, lines: int = 2) -> str:
        """How it ended without an answer: `exit code N` (or the signal) and its last lines of stderr."""
        tail = [line.strip() for line in (self.stderr or self.stdout).splitlines() if line.strip()][-lines:]
        return ending(self.returncode) + (f": {' | '.join(tail)}" if tail else "")


def run(cmd: List[str], timeout: Optional[float] = None) -> Ended:
    """`cmd` to its end (subprocess.TimeoutExpired past `timeout` seconds, the child killed)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environment())
    return Ended(proc.returncode, proc.stdout, proc.stderr)
