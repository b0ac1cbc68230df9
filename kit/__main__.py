"""Command line: `python -m kit run ...` re-runs one case (the repro line every failure
prints); `python -m kit list` shows the catalog."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from kit.catalog import load_catalog
from kit.modes import MODES, parse_exec, parse_mode
from kit.record import FAIL
from kit.runner import run_case


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one backend x mode x exec x case and print the verdict")
    run.add_argument("--backend", required=True, help="backend name or module:attr")
    run.add_argument("--mode", required=True, type=parse_mode)
    run.add_argument("--exec", required=True, type=parse_exec, dest="exec_")
    run.add_argument("--case", required=True, help="case name (see `python -m kit list`)")
    run.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    run.add_argument("--json", action="store_true", help="print the result record as JSON on the last line")
    lst = sub.add_parser("list", help="list the cases of a set")
    lst.add_argument("--case-set", default="auto")
    for p in (run, lst):
        p.add_argument("--cases", default=None, help="case catalog as module:attr (default: the in-box one)")
    args = parser.parse_args(argv)
    catalog = load_catalog(args.cases)

    if args.command == "list":
        for mode in MODES:
            for case in catalog.cases(args.case_set, mode):
                print(f"{mode.value:16} {case.name:36} bs={case.bs:<3} page={case.page:<3} {case.dtype} "
                      f"heads={case.heads} d={case.head_dim} layout={case.layout}")
        return 0
    case = catalog.find_case(args.mode, args.case)
    device = torch.device(args.device) if args.device else None
    result = run_case(args.backend, case, args.exec_, device=device, catalog=args.cases)
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
        return 1 if result.outcome == FAIL else 0
    status = result.outcome + (f" [{result.failure_class}]" if result.failure_class else "")
    print(f"{result.test_id}: {status} ({result.exec_detail or '-'}, {result.seconds:.2f}s)")
    if result.message:
        print(result.message)
    return 1 if result.outcome == FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
