"""python -m kit fuzz — search a backend's case space for a failure the catalog has no case for.

    python -m kit fuzz --backend NAME [--mode ...] [--exec ...] [--budget SECONDS] [--seed N]
    python -m kit fuzz --mutants [--budget SECONDS] [--seed N] [--json PATH]

Prints each new failure shrunk to a minimal case: its one `Case(...)` line to paste into
`cases/<mode>.py`, the repro command, the failure message; failures KNOWN_FAILURES.md
expects are counted by their KF id. Every run is appended to the ledger. Exit code 1 when a
new failure is found (or, with --mutants, a mutant is missed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kit.cli import FAILED, INTERRUPTED as CLI_INTERRUPTED, count, device_option, fail, seconds
from kit.fuzz import in_flight, ledger, report
from kit.modes import MODES, Exec, parse_exec, parse_mode
from kit.report import known_failures
from kit.report.known_failures import KnownFailuresError

DATABASE = Path("~/.cache/attention-conformance-kit/hypothesis")


def add_parser(sub, prog: str) -> argparse.ArgumentParser:
    p = sub.add_parser("fuzz", prog=f"{prog} fuzz", help="draw cases with Hypothesis, run them eager and graph, "
                                                         "shrink a failure to a minimal case (exit 1 if one is new)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", help="a registered backend name, or module:attr of a backend class")
    p.add_argument("--mode", default="", help="comma-separated modes (default: every mode the backend runs)")
    p.add_argument("--exec", default="eager,graph", dest="exec_", help="eager, graph or both (default both)")
    p.add_argument("--budget", type=seconds, default=60.0, help="seconds of search (default 60)")
    p.add_argument("--shrink-budget", type=seconds, default=None,
                   help="seconds of shrinking, from the first failure (default: --budget)")
    p.add_argument("--max-examples", type=count, default=100_000, help="stop the search after this many cases")
    p.add_argument("--seed", type=int, default=None, help="Hypothesis's seed (default: a random one, printed)")
    p.add_argument("--size", default="small", help="small (CPU, default), medium or large: how large cases get")
    p.add_argument("--device", type=device_option, default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--timeout", type=seconds, default=None, help="seconds after which one run stops as a crash")
    p.add_argument("--ledger", default=None, help=f"the ledger to append to (default: {ledger.DEFAULT} under the "
                                                  f"working directory for the kit's own backends, {ledger.OTHERS} "
                                                  f"for any other)")
    p.add_argument("--in-flight", default=None,
                   help="where the case being run is kept while it runs, so that a backend that takes the process "
                        f"down leaves the case behind (default: {in_flight.NAME} beside the ledger)")
    p.add_argument("--database", default=str(DATABASE), help=f"Hypothesis's example database, or `none` "
                                                             f"(default {DATABASE})")
    p.add_argument("--known-failures", default=None, help="default: the kit's KNOWN_FAILURES.md")
    p.add_argument("--json", action="store_true", help="print the ledger record as JSON on the last line")
    p.add_argument("--mutants", action="store_true", help="fuzz each mutant of --catalog (CPU-catchable ones "
                                                          "without CUDA) and write the table of how fast each "
                                                          "is found to --table-json")
    p.add_argument("--catalog", default="tests.mutants:MUTANTS", help="the mutant catalog (module:attr)")
    p.add_argument("--only", default="", help="with --mutants: comma-separated mutant names")
    p.add_argument("-j", "--jobs", type=count, default=1, help="with --mutants: mutants fuzzed at once (default 1: "
                                                               "the times are each mutant's own)")
    p.add_argument("--table-json", default=None,
                   help="with --mutants: where the table goes (default results/fuzz/mutants-<device>.json)")
    return p


def main(args, prog: str) -> int:
    if args.mutants:
        from kit.fuzz.mutants import table_run
        return table_run(args, prog)
    if not args.backend:
        return fail(prog, "fuzz: --backend is required (or --mutants)")
    try:
        target, known, database = resolve(args)
    except (ValueError, KnownFailuresError) as exc:
        return fail(prog, f"fuzz: {exc}")
    from kit.fuzz.search import INTERRUPTED, fuzz
    from kit.harness.registry import is_in_box
    ledger_path = Path(args.ledger or ledger.default(is_in_box(target.backend)))
    running = Path(args.in_flight or ledger_path.with_name(in_flight.NAME))
    died = in_flight.take(running)
    if died is not None:
        print(f"fuzz: {in_flight.said(died)}", file=sys.stderr)
    outcome = fuzz(target, args.budget, args.seed, args.shrink_budget, args.max_examples, database, known, running)
    record = ledger_record(args, target, outcome)
    path = ledger.append(ledger_path, record)
    print(report.text(record))
    print(f"ledger: {path}")
    if args.json:
        print(json.dumps(record, sort_keys=True))
    if outcome.stopped.startswith(INTERRUPTED):
        print(f"{prog} fuzz: {outcome.stopped}: its record, with what it found unshrunk, is in {path}", file=sys.stderr)
        return CLI_INTERRUPTED
    return FAILED if record["new"] else 0


def resolve(args):
    """The Target, the known-failure entries and the example database the options name."""
    import torch

    from kit.harness.capabilities import Capabilities
    from kit.harness.registry import load_backend
    from kit.fuzz.search import Target
    from kit.engine.draws import SIZES

    try:
        cls = load_backend(args.backend)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot load is a usage error here
        raise ValueError(f"--backend {args.backend}: {type(exc).__name__}: {exc}") from None
    try:
        caps = Capabilities.of(cls)
    except TypeError as exc:
        raise ValueError(f"--backend {args.backend}: {exc}") from None
    modes = tuple(parse_mode(m) for m in args.mode.split(",") if m) or tuple(m for m in MODES
                                                                            if caps.mode_reason(m) is None)
    execs = tuple(parse_exec(e) for e in args.exec_.split(",") if e)
    if Exec.GRAPH in execs and not caps.has_graph_hooks and len(execs) > 1:
        execs = tuple(e for e in execs if e is not Exec.GRAPH)  # as the suite: unsupported, never run
    if not modes or not execs:
        raise ValueError(f"--backend {args.backend} runs none of the modes or execs asked for")
    if args.size not in SIZES:
        raise ValueError(f"--size {args.size!r}: one of {', '.join(SIZES)}")
    if args.device and torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available here; use --device cpu")
    known = known_failures.load_or_default(args.known_failures)
    database = None
    if args.database.lower() != "none":
        from hypothesis.database import DirectoryBasedExampleDatabase
        database = DirectoryBasedExampleDatabase(str(Path(args.database).expanduser()))
    target = Target(args.backend, modes, execs, args.size, args.device, args.timeout)
    return target, known, database


def ledger_record(args, target, outcome) -> dict:
    from kit.harness.environment import environment, versions
    from kit.harness.registry import load_backend

    return dict(**environment(), versions=versions(load_backend(target.backend)), backend=target.backend,
                modes=[m.value for m in target.modes], execs=[e.value for e in target.execs], size=target.size,
                budget=args.budget, shrink_budget=args.budget if args.shrink_budget is None else args.shrink_budget,
                max_examples=args.max_examples, database=args.database, **outcome.to_record())


if __name__ == "__main__":
    sys.exit("use: python -m kit fuzz")
