"""The selection options (which backends, modes, execs, case set and catalog a command covers),
declared once for the pytest plugin and for `python -m kit list|warmup`, and parsed once.
Torch-free: `--help` must not wait for torch."""
from __future__ import annotations

from typing import Callable, Iterable, List

from kit.cli import Once
from kit.modes import EXECS, MODES, Exec, ForwardMode, parse_exec, parse_mode

SELECTION = (
    (("--backend",), dict(action="append", default=[], help="backend name or module:attr (repeat or comma-separate); "
                                                            "default: every registered backend")),
    (("--mode",), dict(action="append", default=[], help=", ".join(m.value for m in MODES)
                                                        + " (repeat or comma-separate); default: every mode")),
    (("--exec",), dict(action="append", default=[], dest="exec_", help="eager, graph (repeat or comma-separate); "
                                                                       "default: both")),
    (("--case-set",), dict(action=Once, default="auto", help="smoke, full, or auto (full with CUDA, smoke without; default)")),
    (("--cases",), dict(action=Once, default=None, help="case catalog as module:attr (default: the in-box catalog)")),
)


SHARD = (("--shard",), dict(action=Once, default=None, metavar="K/N",
                            help="run shard K of N of the selection (whole kernel groups; every machine splits "
                                 "alike); `python -m matrix merge` makes one results file of the N"))


def add_shard(add: Callable) -> None:
    """Declares --shard with `add` (the matrix's and warmup's: a part of the selection)."""
    add(*SHARD[0], **SHARD[1])


def add_selection(add: Callable) -> None:
    """Declares the selection options with `add` (argparse's add_argument, pytest's addoption)."""
    for flags, kwargs in SELECTION:
        add(*flags, **kwargs)


def _once_each(values: Iterable) -> list:
    """`values`, each once, in the order first given: a value named twice must not run twice."""
    return list(dict.fromkeys(values))


def csv(values) -> List[str]:
    """The values of a repeatable, comma-separable option, each once."""
    return _once_each(v for item in values for v in item.split(",") if v)


def modes(values) -> List[ForwardMode]:
    """--mode's modes, each once (every mode where none is given); ValueError naming an unknown one."""
    return _once_each(parse_mode(m) for m in csv(values)) or list(MODES)


def execs(values) -> List[Exec]:
    """--exec's execs, each once (both where none is given); ValueError naming an unknown one."""
    return _once_each(parse_exec(e) for e in csv(values)) or list(EXECS)
