"""python -m kit run | list | warmup — re-run one case (the repro line every failure prints),
show the catalog and the backends, or build every kernel variant a matrix selection will load."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys

import torch

from kit.engine.case_line import format_case, parse_case
from kit.engine.catalog import CASE_SETS, load_catalog, resolve_set
from kit.cli import FAILED, Parser, fail
from kit.fuzz import cli as fuzz_cli
from kit.modes import EXECS, MODES, parse_exec, parse_mode
from kit.harness.capabilities import Capabilities
from kit.harness.protocol import backend_problem
from kit.report import known_failures
from kit.report.known_failures import KnownFailuresError
from kit.report.record import ERROR, FAIL, PASS, repro_command
from kit.shard import Shard
from kit.harness.environment import device_name
from kit.harness.registry import UnknownBackend, backend_label, kernels_of, known_backends, load_backend
from kit.harness.runner import run_case
from kit.harness.timeout import BUILD_S, DEFAULT_S

PROG = "python -m kit"


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,list,warmup,fuzz}")
    run = sub.add_parser("run", prog=f"{PROG} run", help="run one backend x mode x exec x case and print the verdict "
                                                         "(exit 1 if it fails)")
    run.add_argument("--backend", required=True, help="a registered backend name, or module:attr of a backend class")
    run.add_argument("--mode", help=", ".join(m.value for m in MODES) + " (with --case)")
    run.add_argument("--exec", required=True, dest="exec_", help=", ".join(e.value for e in EXECS))
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", help="case name (see `python -m kit list`)")
    which.add_argument("--case-line", help="a case in no catalog, whole: its Case(...) line, as `python -m kit "
                                           "fuzz` prints it (the mode is the line's)")
    run.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    run.add_argument("--timeout", type=_seconds, default=DEFAULT_S,
                     help=f"seconds after which the run stops as a crash (default {DEFAULT_S:g}; 0: none)")
    run.add_argument("--json", action="store_true", help="print the result record as JSON on the last line")
    run.add_argument("--known-failures", default=None,
                     help="expected-failures file whose entry for this run is named (default: the kit's "
                          "KNOWN_FAILURES.md, if present)")
    lst = sub.add_parser("list", prog=f"{PROG} list", help="list the cases of a set (mode, name, batch, page, dtype, "
                                                           "heads, head_dim, layout), or the backends")
    lst.add_argument("--case-set", default="auto", help=f"{', '.join(CASE_SETS)}, or auto (full with CUDA, smoke "
                                                        f"without; default)")
    lst.add_argument("--backends", action="store_true",
                     help="list the registered backends instead: available here or not, and why")
    warm = sub.add_parser("warmup", prog=f"{PROG} warmup",
                          help="build every kernel variant the matrix selection will load (FlashInfer's JIT, Triton's "
                               "compile), in parallel, before any run: each backend x mode x kernel variant once, on "
                               "its smallest case")
    warm.add_argument("--backend", action="append", default=[],
                      help="as the matrix's (repeat or comma-separate); default: every registered backend")
    warm.add_argument("--mode", action="append", default=[], help=", ".join(m.value for m in MODES))
    warm.add_argument("--exec", action="append", default=[], dest="exec_", help="eager, graph")
    warm.add_argument("--case-set", default="auto", help=f"{', '.join(CASE_SETS)}, or auto (default)")
    warm.add_argument("--jobs", type=int, default=None, help="builds at once (default: one per core)")
    warm.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                      help="only the builds of the matrix's --shard K/N (the same selection options)")
    warm.add_argument("--timeout", type=_seconds, default=BUILD_S,
                      help=f"seconds per build (default {BUILD_S:g}: longer than a run's, since a compile "
                           f"stopped is lost; 0: none)")
    for p in (run, lst, warm):
        p.add_argument("--cases", default=None, help="case catalog as module:attr (default: the in-box one)")
    fuzz_cli.add_parser(sub, PROG)
    return parser


def _seconds(text: str) -> float:
    """A time limit: seconds, 0 for none; a negative one is refused (it would mean none, silently)."""
    seconds = float(text)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text}: give seconds >= 0 (0: no limit)")
    return seconds


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _list_cases(catalog, case_set: str) -> None:
    for mode in MODES:
        for case in catalog.cases(case_set, mode):
            print(f"{mode.value:16} {case.name:36} bs={case.bs:<3} page={case.page:<3} {case.dtype} "
                  f"heads={case.heads} d={case.head_dim} layout={case.layout}"
                  + (f" mla={case.kv_lora_rank}+{case.rope_dim}" if case.is_mla else "")
                  + (f" inputs={case.inputs}" if case.inputs != "contiguous" else "")
                  + (f" kv={case.kv_dtype}" if case.kv_dtype else ""))


def availability(spec: str, catalog, case_set: str) -> str:
    """`available: ...` or `unavailable: <reason>`, from the backend's own `supports()` over the set."""
    try:
        cls = load_backend(spec)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot load is what this reports
        return f"unavailable: cannot be loaded ({type(exc).__name__}: {exc})"
    problem = backend_problem(cls)
    if problem:
        return f"unavailable: {problem}"
    try:
        caps = Capabilities.of(cls)
    except TypeError as exc:
        return f"unavailable: {exc}"
    reasons = collections.Counter()
    runs = 0
    for mode in MODES:
        for case in catalog.cases(case_set, mode):
            try:
                reason = cls.supports(case) or caps.mode_reason(mode)
            except Exception as exc:  # noqa: BLE001
                reason = f"supports() raised {type(exc).__name__}: {exc}"
            runs += 1
            if reason:
                reasons[str(reason)] += 1
    ok = runs - sum(reasons.values())
    why = " | ".join(reason for reason, _ in reasons.most_common())
    if not ok:
        return f"unavailable: {why or f'no {case_set} cases'}"
    graph = "graph hooks" if caps.has_graph_hooks else "eager only (no capture hooks)"
    return f"available: {ok}/{runs} {case_set} cases, {graph}" + (f"; the others: {why}" if why else "")


def _run(args, catalog) -> int:
    try:
        exec_ = parse_exec(args.exec_)
        if args.case_line:
            case = parse_case(args.case_line)
        elif not args.mode:
            return fail(PROG, "--case needs --mode (or give the whole case with --case-line)")
        else:
            case = catalog.find_case(parse_mode(args.mode), args.case)
        device = torch.device(args.device) if args.device else None
    except KeyError as exc:
        return fail(PROG, f"{exc.args[0]} (see `python -m kit list`)")
    except (ValueError, RuntimeError) as exc:
        return fail(PROG, f"{exc}")
    try:  # as pytest does: an unknown name or a target that does not import is a usage error
        label = backend_label(args.backend)
    except (UnknownBackend, ImportError, AttributeError, ValueError, TypeError) as exc:
        return fail(PROG, f"--backend {args.backend}: {exc}")
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        return fail(PROG, f"--device {args.device}: CUDA is not available here (torch {torch.__version__}); "
                          f"use --device cpu, or leave --device out")
    try:
        entries = known_failures.load_or_default(args.known_failures)
    except KnownFailuresError as exc:
        return fail(PROG, f"--known-failures: {exc}", FAILED)
    result = run_case(args.backend, case, exec_, device=device, label=label, catalog=args.cases,
                      timeout=args.timeout)
    if args.case_line:
        result.repro = repro_command(args.backend, case.mode.value, exec_.value, case.name,
                                     case_line=format_case(case))
    entry = known_failures.match(entries, result.backend, result.mode, result.exec, result.case, device_name())
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
        return FAILED if result.outcome in (FAIL, ERROR) else 0
    status = result.outcome + (f" [{result.failure_class}]" if result.failure_class else "")
    print(f"{result.test_id}: {status} ({result.exec_detail or '-'}, {result.seconds:.2f}s)")
    if result.message:
        print(result.message)
    if entry is not None:
        print(_known_line(entry, result))
    return FAILED if result.outcome in (FAIL, ERROR) else 0


def _known_line(entry, result) -> str:
    """What the run is against its KNOWN_FAILURES.md entry: that known failure, or not."""
    said = f"{entry.id} ({entry.where}) expects [{entry.failure_class}] here"
    if known_failures.is_expected(entry, result.outcome, result.failure_class):
        return f"known failure: {entry.id} ({entry.where}): {entry.reason}"
    if result.outcome == FAIL:
        return f"not the known failure: {said}, this run failed [{result.failure_class}]"
    if result.outcome == PASS:
        return f"{said}, but this run passed: the entry is stale here"
    return f"{said}; this run: {result.outcome}"


def _csv(values):
    return [v for item in values for v in item.split(",") if v]


def _warmup(args, catalog, case_set: str) -> int:
    from kit import warmup
    try:
        backends = _csv(args.backend) or known_backends()
        labels = {spec: backend_label(spec) for spec in backends}
        modes = [parse_mode(m) for m in _csv(args.mode)] or list(MODES)
        execs = [parse_exec(e) for e in _csv(args.exec_)] or list(EXECS)
    except (UnknownBackend, ImportError, AttributeError, ValueError, TypeError) as exc:
        return fail(PROG, f"{exc}")
    if args.jobs is not None and args.jobs < 1:
        return fail(PROG, f"--jobs {args.jobs}: give 1 or more")
    todo = warmup.builds(backends, modes, execs, catalog, case_set, kernels_of, args.shard, labels.get)
    lost = warmup.warmup(todo, args.jobs or warmup.default_jobs(), args.cases, args.timeout)
    return FAILED if lost else 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "fuzz":
        return fuzz_cli.main(args, PROG)
    try:
        catalog = load_catalog(args.cases)
        case_set = resolve_set(getattr(args, "case_set", "auto"))
    except (ImportError, AttributeError, TypeError) as exc:
        return fail(PROG, f"--cases {args.cases}: {exc}")
    except ValueError as exc:
        return fail(PROG, f"{exc}")
    if args.command == "run":
        return _run(args, catalog)
    if args.command == "warmup":
        return _warmup(args, catalog, case_set)
    if args.backends:
        for name in known_backends():
            print(f"{name:14} {availability(name, catalog, case_set)}")
    else:
        _list_cases(catalog, case_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
