"""The conformance options of the pytest command line (parsed in kit.plugin.selection): the
selection (kit.options), then what only a session has."""
from __future__ import annotations

import argparse

import pytest

from kit.cli import Once, seconds, twice, writable
from kit.options import add_selection, add_shard
from kit.plugin import progress


def addoption(parser) -> None:
    g = parser.getgroup("conformance")
    add_selection(g.addoption)
    add_shard(g.addoption)
    g.addoption("--results-json", action=Once, default=None, help="write one record per run to this file")
    g.addoption("--progress-every", action=Once, type=float, default=progress.EVERY_S, metavar="SECONDS",
                help=f"show runs done and time left per backend this often (default {progress.EVERY_S:g}; 0: never)")
    g.addoption("--known-failures", action=Once, default=None,
                help="expected-failures file (default: the kit's KNOWN_FAILURES.md, if present)")


def check(config) -> None:
    """A usage error, in one line, for what argparse let through: a single-valued option given twice
    with two values, a negative --progress-every (it printed nothing), a --results-json that cannot
    be written (an INTERNALERROR before any run)."""
    problems = twice(config.option)
    try:
        seconds(f"{config.getoption('--progress-every'):g}")
    except argparse.ArgumentTypeError as exc:
        problems.append(f"--progress-every: {exc} (0: never)")
    problems += writable("--results-json", config.getoption("--results-json"))
    if problems:
        raise pytest.UsageError("; ".join(problems))
