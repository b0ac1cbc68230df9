"""python -m kit.mutate — run the mutant catalog through the conformance suite.

    python -m kit.mutate [--case-set auto|smoke|full] [--only NAME,...] [--cpu-only]
                         [-j N] [--json PATH] [--catalog module:attr] [--cases module:attr]
                         [--timeout SECONDS]

Prints the score table (mutant, caught by how many runs, failure classes seen,
first failing run) and exits 1 if any mutant is missed, i.e. the kit never
reported its expected failure class.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from kit.engine.catalog import load_catalog, resolve_set
from kit.cli import Parser, count, fail
from kit.mutation import score_all, worker
from kit.harness.registry import load_backend
from kit.harness.timeout import DEFAULT_S
from kit.targets import import_target
from kit.harness.environment import environment, versions
from matrix.mutation import table

PROG = "python -m kit.mutate"


def main(argv=None) -> int:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catalog", default="tests.mutants:MUTANTS", help="the mutant catalog (module:attr)")
    parser.add_argument("--cases", default=None, help="the case catalog (module:attr; default: the in-box one)")
    parser.add_argument("--case-set", default="auto", help="smoke, full, or auto (full with CUDA, smoke without)")
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--cpu-only", action="store_true", help="only the mutants the CPU can catch")
    parser.add_argument("-j", "--jobs", type=count, default=os.cpu_count() or 1,
                        help="mutants scored at once, each in its own process (default: one per CPU)")
    parser.add_argument("--json", help="write the scores here")
    parser.add_argument("--stop-when-caught", action="store_true", help="stop a mutant at its first catch")
    parser.add_argument("--timeout", type=float, default=DEFAULT_S,
                        help=f"each run's time limit in seconds, as the matrix's (default {DEFAULT_S:g}, 0 for none): "
                             "past it the run is a crash, and a run stuck in native code ends its mutant's process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from kit.harness import interpreter
    interpreter.choose()  # before the catalog's modules import triton (an engine's adapter among them)
    try:
        case_set = resolve_set(args.case_set)
        mutants = list(import_target(args.catalog))
        load_catalog(args.cases)
    except ValueError as exc:
        return fail(PROG, str(exc))
    except (ImportError, AttributeError, TypeError) as exc:
        return fail(PROG, f"--catalog {args.catalog} / --cases {args.cases}: {exc}")
    if args.worker:
        worker(args.catalog, args.only, case_set, args.stop_when_caught, args.cases, args.timeout or None)
        return 0

    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.name for m in mutants}
        if unknown:
            parser.error(f"unknown mutant(s) {sorted(unknown)}; known: {', '.join(m.name for m in mutants)}")
        mutants = [m for m in mutants if m.name in wanted]
    on_gpu = torch.cuda.is_available()
    if args.cpu_only or not on_gpu:
        mutants = [m for m in mutants if m.cpu]
    scores = score_all(mutants, args.catalog, case_set, args.jobs, args.stop_when_caught, args.cases,
                       args.timeout or None)
    env = dict(environment(), versions={})
    for m in mutants:
        env["versions"].update(versions(load_backend(m.backend)))
    header = f"{env['device']} · {case_set} cases · kit commit {env['kit_commit']}"
    print(table([s.to_record() for s in scores], header))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(environment=env, case_set=case_set, scores=[s.to_record() for s in scores]), f, indent=1)
    missed = [s.mutant.name for s in scores if not s.caught and not s.mutant.harmless]
    if missed:
        print(f"missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
