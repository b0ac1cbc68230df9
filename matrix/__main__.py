"""python -m matrix write | check | html | merge | compare — the README tables from results, the gate, an
HTML report, one results file from a run's shards, and two runs' verdicts side by side."""
from __future__ import annotations

import sys
from pathlib import Path

from kit.cli import FAILED, Parser, fail, writable
from kit.report.known_failures import KnownFailuresError, load
from kit.report.record import ResultsError, read_results_file
from kit.report.results import page_path, write_results, write_text
from matrix import compare, gate, html, readme
from matrix.committed import committed_text, write_if_changed
from matrix.merge import ShardsError, merge

REPO = Path(__file__).resolve().parent.parent
PROG = "python -m matrix"


def build_parser() -> Parser:
    sources = Parser(add_help=False)
    sources.add_argument("--known-failures", default=str(REPO / "KNOWN_FAILURES.md"),
                        help="the known-failures table (default: the kit's KNOWN_FAILURES.md)")
    sources.add_argument("--results-dir", default=str(REPO / "results"),
                        help="committed results files (*.json, and mutation/*.json) the tables are made from "
                             "(default: the kit's results/)")
    common = Parser(add_help=False, parents=[sources])
    common.add_argument("--readme", default=str(REPO / "README.md"),
                        help="the README whose generated blocks are written or checked (default: the kit's)")
    common.add_argument("--page", default=str(REPO / "docs" / "matrix.md"),
                        help="the generated page holding the per-case matrices, mutation and fuzz tables, where "
                             "present (default: the kit's docs/matrix.md); a block goes where its markers are")
    parser = Parser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{write,check,html,merge,compare}")
    sub.add_parser("write", parents=[common], prog=f"{PROG} write",
                   help="write the committed results files in their committed form (no timings, dates or commits; "
                        "errors to 3 digits) and the README's matrix and mutation tables from them; a file "
                        "whose contents would not change is not touched; refuses an unreadable or partial "
                        "results file")
    check = sub.add_parser("check", parents=[common], prog=f"{PROG} check",
                           help="the gate: fails, one line per problem, on stale tables, committed results not in "
                                "their committed form, uncovered failures, stale known failures, and fresh "
                                "results that are interrupted or disagree with the committed ones")
    check.add_argument("--fresh", action="append", default=[], metavar="FILE",
                       help="results of a run just made (repeatable): each must be a whole run, every failure "
                            "known, verdicts equal to the committed results of its device; the shards of a "
                            "--shard K/N run among them are taken as that run (as `merge` makes it)")
    html = sub.add_parser("html", parents=[sources], prog=f"{PROG} html",
                          help="write one static HTML page: the matrix per device, cells coloured by outcome, each "
                               "failing cell opening its runs (message, class, max err / tol, known failure, repro)")
    html.add_argument("--out", default=None, help="the page to write (default: the first --results file's name with "
                                                  ".html for .json, e.g. results-local.html; matrix.html for the "
                                                  "committed results)")
    html.add_argument("--results", action="append", default=[], metavar="FILE",
                      help="results files to show (repeatable; default: the committed results in --results-dir)")
    merging = sub.add_parser("merge", prog=f"{PROG} merge",
                           help="write one results file from the N results files of a --shard K/N run: refused, "
                                "in one line, where a shard is missing or twice, or they disagree on the "
                                "selection, catalog, device, kit commit or library versions")
    merging.add_argument("out", help="the results file to write")
    merging.add_argument("shards", nargs="+", metavar="SHARD", help="the shards' results files")
    merging.add_argument("--rerun", action="append", default=[], metavar="FILE",
                         help="a complete, unsharded run of whole backends of the shards' selection, on their device "
                              "with their libraries, at any commit (repeatable, one per backend): its records "
                              "replace the shards' records of its backends, each keeping its kit commit")
    comparing = sub.add_parser("compare", prog=f"{PROG} compare",
                               help="two results files side by side: each backend's failed/executed runs in both, "
                                    "and every run both hold whose verdict changed (a refresh on another device "
                                    "or commit read against the last)")
    comparing.add_argument("before", help="the earlier results file (e.g. the committed one)")
    comparing.add_argument("after", help="the later results file")
    comparing.add_argument("--shown", type=int, default=40, help="changed runs listed one by one (default 40)")
    return parser


def _entries(path, problems: list) -> list:
    """The known failures, or none and their file's problems."""
    try:
        return load(path)
    except KnownFailuresError as exc:
        problems += str(exc).splitlines()
        return []


def _html(args) -> int:
    problems = []
    entries = _entries(args.known_failures, problems)
    files = {}
    if args.results:
        for path in args.results:
            try:
                files[path] = read_results_file(path)
            except ResultsError as exc:
                problems.append(str(exc))
    else:
        files = gate.committed_files(args.results_dir, [])
    if problems:
        print("\n".join(f"matrix html: {p}" for p in problems), file=sys.stderr)
        return FAILED
    out = args.out or page_path(args.results)
    if writable("--out", out):
        return fail(PROG, writable("--out", out)[0])
    write_text(out, html.page(files, entries))
    print(f"matrix html: wrote {out} ({sum(len(f.records) for f in files.values())} runs from "
          f"{len(files)} file(s){'' if args.results else ': the committed results; --results FILE for a run'})")
    for path, f in files.items():
        if f.incomplete():
            print(f"matrix html: {path}: {f.incomplete()} (said at the top of the page)", file=sys.stderr)
    return 0


def _write(args) -> int:
    problems = []
    entries = _entries(args.known_failures, problems)
    files = gate.committed_files(args.results_dir, problems)
    committed = {src: f.records for src, f in files.items()}
    blocks = gate.readme_blocks(committed, entries, args.results_dir, problems)
    if problems:
        print("\n".join(f"matrix write: {p}" for p in problems), file=sys.stderr)
        return FAILED
    # Each file is written only when its contents change: no verdict changed, no file touched.
    written = [f.path for f in files.values() if write_if_changed(f.path, committed_text(f))]
    texts = gate.generated_files(args.readme, args.page)
    for _, begin, end, block in blocks:
        path = readme.holder(texts, begin, end)
        if path is None:
            raise readme.missing(texts, begin, end)
        texts[path] = readme.replace(texts[path], block, path, begin, end)
    written += [path for path, text in texts.items() if write_if_changed(Path(path), text)]
    for p in written:
        print(f"matrix write: wrote {p}")
    if not written:
        print(f"matrix write: nothing changed ({len(files)} results file(s) and {', '.join(texts)} as they were)")
    return 0


def _check(args) -> int:
    unjudged: list = []
    near: list = []
    problems = gate.check(args.readme, args.known_failures, args.results_dir, args.fresh, unjudged, near,
                          args.page)
    for p in problems:
        print(f"matrix check: {p}", file=sys.stderr)
    if problems:
        return FAILED
    print(f"matrix check: ok ({len(args.fresh)} fresh results file(s) checked against {args.results_dir})")
    if unjudged:
        print(f"matrix check: not judged (no run they match in the results' catalogs): {', '.join(unjudged)}")
    if near:
        shown = ", ".join(f"{r.test_id} ({max(r.margins):.2g}x)" for r in near[:5])
        print(f"matrix check: near the line ({len(near)} records whose worst layer's error is within "
              f"{gate.NEAR_FACTOR:g}x of its limit, either way: a layout or seed may turn them): {shown}"
              f"{' ...' if len(near) > 5 else ''}")
    return 0


def _merge(args) -> int:
    if writable("results file", args.out):
        return fail(PROG, writable("results file", args.out)[0])
    files = []
    for path in args.shards + args.rerun:
        if not Path(path).is_file():
            return fail(PROG, f"{path}: no such file; name the results files the runs wrote with --results-json")
        try:
            files.append(read_results_file(path))
        except ResultsError as exc:
            return fail(PROG, str(exc), FAILED)
    shards, reruns = files[:len(args.shards)], files[len(args.shards):]
    try:
        run = merge(shards, args.out, reruns)
    except ShardsError as exc:
        return fail(PROG, str(exc), FAILED)
    write_results(run.path, [r.to_dict() for r in run.records], run.run_section())
    for rerun, done in zip(reruns, run.reruns):
        replaced = sum(r.backend in done.backends for f in shards for r in f.records)
        print(f"matrix merge: replaced the shards' {replaced} records of {', '.join(done.backends)} with the "
              f"{len(rerun.records)} of {rerun.path} (kit commit {done.kit_commit})")
    print(f"matrix merge: wrote {run.path} ({len(shards)} shards, {len(run.records)} of {len(run.selected)} "
          f"selected runs recorded, {run.status})")
    return 0


def _compare(args) -> int:
    files = []
    for path in (args.before, args.after):
        try:
            files.append(read_results_file(path))
        except ResultsError as exc:
            return fail(PROG, str(exc), FAILED)
    print(compare.report(*files, shown=max(args.shown, 0)))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "compare":
        return _compare(args)
    for option, path in [*(("--fresh", p) for p in getattr(args, "fresh", [])),
                         *(("--results", p) for p in getattr(args, "results", []))]:
        if not Path(path).is_file():
            what = ("a directory, not a results file" if Path(path).is_dir()
                    else "not a regular file" if Path(path).exists() else "no such file")
            return fail(PROG, f"{option} {path}: {what}; name the file the run wrote with --results-json")
    if args.command != "merge" and not getattr(args, "results", None) and gate.results_dir_problem(args.results_dir):
        return fail(PROG, gate.results_dir_problem(args.results_dir))
    if args.command == "html":
        return _html(args)
    if args.command == "merge":
        return _merge(args)
    if not Path(args.readme).is_file():
        return fail(PROG, f"--readme {args.readme}: no such file; name the README with the generated blocks")
    try:
        return _write(args) if args.command == "write" else _check(args)
    except readme.MarkersMissing as exc:
        return fail(PROG, f"{exc}; restore them around the generated block", FAILED)


if __name__ == "__main__":
    sys.exit(main())
