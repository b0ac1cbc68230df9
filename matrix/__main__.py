"""python -m matrix write | check — the README tables from results, and the gate."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kit.known_failures import KnownFailuresError, load
from matrix import gate, readme

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix")
    parser.add_argument("command", choices=("write", "check"))
    parser.add_argument("--readme", default=str(REPO / "README.md"))
    parser.add_argument("--known-failures", default=str(REPO / "KNOWN_FAILURES.md"))
    parser.add_argument("--results-dir", default=str(REPO / "results"),
                        help="committed results files (*.json) the tables are made from")
    parser.add_argument("--fresh", action="append", default=[],
                        help="check: results of a run just made (repeatable)")
    args = parser.parse_args(argv)

    if args.command == "write":
        try:
            entries = load(args.known_failures)
        except KnownFailuresError as exc:
            print(exc, file=sys.stderr)
            return 1
        problems = []
        committed = gate.committed_results(args.results_dir, problems)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1
        path = Path(args.readme)
        text = path.read_text()
        for _, begin, end, block in gate.readme_blocks(committed, entries, args.results_dir):
            text = readme.replace(text, block, str(path), begin, end)
        path.write_text(text)
        print(f"wrote {len(committed)} results file(s) and the mutation scores into {path}")
        return 0

    problems = gate.check(args.readme, args.known_failures, args.results_dir, args.fresh)
    for p in problems:
        print(f"matrix check: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"matrix check: ok ({len(args.fresh)} fresh results file(s) checked against {args.results_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
