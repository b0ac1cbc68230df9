"""The conformance options of the pytest command line (parsed in kit.plugin.selection)."""
from __future__ import annotations

from kit.modes import MODES
from kit.plugin import progress


def addoption(parser) -> None:
    g = parser.getgroup("conformance")
    g.addoption("--backend", action="append", default=[],
                help="backend name or module:attr (repeat or comma-separate); default: every registered backend")
    g.addoption("--mode", action="append", default=[], help=", ".join(m.value for m in MODES))
    g.addoption("--exec", action="append", default=[], dest="exec_", help="eager, graph")
    g.addoption("--case-set", default="auto", help="smoke, full, or auto (full with CUDA, smoke without)")
    g.addoption("--cases", default=None, help="case catalog as module:attr (default: the in-box catalog)")
    g.addoption("--shard", default=None, metavar="K/N",
                help="run shard K of N of the selection (whole kernel groups; every machine splits alike); "
                     "`python -m matrix merge` makes one results file of the N")
    g.addoption("--results-json", default=None, help="write one record per run to this file")
    g.addoption("--progress-every", type=float, default=progress.EVERY_S, metavar="SECONDS",
                help=f"show runs done and time left per backend this often (default {progress.EVERY_S:g}; 0: never)")
    g.addoption("--known-failures", default=None,
                help="expected-failures file (default: the kit's KNOWN_FAILURES.md, if present)")
