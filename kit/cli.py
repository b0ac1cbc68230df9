"""What the command lines share: errors are one line, `prog: error: problem; fix`, and one scheme
of exit codes for `python -m pytest` (pytest's own), `python -m kit`, `python -m kit.mutate` and
`python -m matrix` (docs/running.md, 'Exit codes'). Torch-free."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List

OK = 0
FAILED = 1  # a run failed, a mutant was missed, the gate found a problem, an input file is malformed
INTERRUPTED = 2  # the user stopped it (Ctrl-C): pytest's code
USAGE = 4  # a bad option, value or path: pytest's code for a usage error, so one scheme for all
DEVICE_LOST = 70  # a process that ran nothing more after a sticky device fault (kit.plugin.device_lost)
STUCK = 75  # a process ended by a run stuck in native code past its limit (kit.harness.timeout)
EXIT_CODES = {OK: "every run passed (known failures as expected), or the command did what it was asked",
              FAILED: "a run failed, a mutant was missed, the gate found a problem, or an input file is malformed",
              INTERRUPTED: "stopped by the user (Ctrl-C)",
              USAGE: "a bad option, value or path; nothing ran",
              DEVICE_LOST: "a process ended itself after a sticky device fault (one process, `-p no:xdist`)",
              STUCK: "a run stuck in native code past its limit ended the process (one process, `-p no:xdist`)"}


class Once(argparse.Action):
    """A single-valued option: given twice with two values it is a usage error (argparse keeps the last
    silently: `--mode decode --mode extend` ran extend alone); twice with one value, once. The error
    is argparse's; pytest's options name it later, in one line (twice())."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest, None)
        if self.dest in getattr(namespace, "_given_once", ()) and given != values:
            problem = f"{option_string} given twice ({given}, {values}); it takes one value: give it once"
            if isinstance(parser, Parser):
                raise argparse.ArgumentError(None, problem)
            namespace.__dict__.setdefault("_given_twice", []).append(problem)
        namespace.__dict__.setdefault("_given_once", set()).add(self.dest)
        setattr(namespace, self.dest, values)


def twice(namespace) -> list:
    """The single-valued options given twice with two values (Once), a problem each."""
    return getattr(namespace, "_given_twice", [])


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (the usage itself is under --help), and a
    single-valued option given twice with two values refused (Once)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in (None, "store"):  # the default action, of its groups too (they share the registry)
            self.register("action", name, Once)

    def error(self, message):
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def fail(prog: str, message: str, code: int = USAGE) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


MAX_SECONDS = 1e6  # 11 days; the system's timers (setitimer, faulthandler) overflow past about 1e9 s


def seconds(text: str) -> float:
    """An option's seconds: 0 or more (a negative limit or budget would mean none, silently), and at
    most MAX_SECONDS (the timers overflow)."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text}: give seconds >= 0")
    if not value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text}: give at most {MAX_SECONDS:g} seconds")
    return value


def device_option(text: str) -> str:
    """An option's device: cpu or cuda (cuda:N), the kinds the kit runs on (torch names others it
    cannot run, or answers a misspelt one with its whole list)."""
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise argparse.ArgumentTypeError(f"{text}: give cpu or cuda (cuda:N for one GPU)")
    return text


def writable(option: str, path) -> List[str]:
    """A problem naming `option` where the file `path` cannot be written (its folder made if missing,
    as the writer makes it), else none; None is no file."""
    if path is None:
        return []
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"{option} {path}: cannot make its folder ({exc.strerror}); name a file in a folder you can write"]
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        what = "a directory" if path.is_dir() else "its folder is not writable"
        return [f"{option} {path}: {what}; name a file in a folder you can write"]
    return []


def count(text: str) -> int:
    """An option's count of things: 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give 1 or more")
    return value
