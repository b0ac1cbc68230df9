"""The conformance options of the pytest command line (parsed in kit.plugin.selection): the
selection (kit.options), then what only a session has."""
from __future__ import annotations

from kit.options import add_selection, add_shard
from kit.plugin import progress


def addoption(parser) -> None:
    g = parser.getgroup("conformance")
    add_selection(g.addoption)
    add_shard(g.addoption)
    g.addoption("--results-json", default=None, help="write one record per run to this file")
    g.addoption("--progress-every", type=float, default=progress.EVERY_S, metavar="SECONDS",
                help=f"show runs done and time left per backend this often (default {progress.EVERY_S:g}; 0: never)")
    g.addoption("--known-failures", default=None,
                help="expected-failures file (default: the kit's KNOWN_FAILURES.md, if present)")
