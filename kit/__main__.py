"""python -m kit run | list | warmup | fuzz | repro — re-run one case (the repro line every failure prints),
show the catalog and the backends, build every kernel variant a matrix selection will load, or
search a backend's case space, or write a run's standalone repro file. Exit codes: docs/running.md, 'Exit codes'."""
from __future__ import annotations

import dataclasses
import json
import sys

from kit import options
from kit.cli import FAILED, INTERRUPTED, Parser, count, device_option, fail, seconds
from kit.fuzz import cli as fuzz_cli
from kit.harness.timeout import BUILD_S, DEFAULT_S
from kit.modes import EXECS, MODES

PROG = "python -m kit"
# Torch, the engine and the backends are imported by the commands that need them: `--help` and a
# usage error answer at once.


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,list,warmup,fuzz,repro}")
    run = sub.add_parser("run", prog=f"{PROG} run", help="run one backend x mode x exec x case and print the verdict "
                                                         "(exit 1 if it fails)")
    run.add_argument("--backend", required=True, help="a registered backend name, or module:attr of a backend class")
    run.add_argument("--mode", help=", ".join(m.value for m in MODES) + " (with --case)")
    run.add_argument("--exec", required=True, dest="exec_", help=", ".join(e.value for e in EXECS))
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", help="case name (see `python -m kit list`)")
    which.add_argument("--case-line", help="a case in no catalog, whole: its Case(...) line, as `python -m kit "
                                           "fuzz` prints it (the mode is the line's)")
    run.add_argument("--cases", default=None, help="case catalog as module:attr (default: the in-box one)")
    run.add_argument("--device", type=device_option, default=None, help="cpu or cuda (default: cuda when present)")
    run.add_argument("--timeout", type=seconds, default=DEFAULT_S,
                     help=f"seconds after which the run stops as a crash (default {DEFAULT_S:g}; 0: none)")
    run.add_argument("--json", action="store_true", help="print the result record as JSON on the last line")
    run.add_argument("--known-failures", default=None,
                     help="expected-failures file whose entry for this run is named (default: the kit's "
                          "KNOWN_FAILURES.md, if present)")
    lst = sub.add_parser("list", prog=f"{PROG} list", help="list the cases of the selection (mode, name, batch, page, "
                                                           "dtype, heads, head_dim, layout), or its backends")
    options.add_selection(lst.add_argument)
    lst.add_argument("--backends", action="store_true",
                     help="list the selection's backends instead: what each runs here, and why not the rest")
    lst.add_argument("--check", action="store_true",
                     help="with --backends: import each engine adapter's engine (SGLang, vLLM: seconds to minutes) "
                          "and say what it runs here; without it such a backend reads `not checked` or `unavailable`")
    warm = sub.add_parser("warmup", prog=f"{PROG} warmup",
                          help="build every kernel variant the matrix selection will load (FlashInfer's JIT, Triton's "
                               "compile), in parallel, before any run: each backend x mode x kernel variant once, on "
                               "its smallest case the backend runs")
    options.add_selection(warm.add_argument)
    options.add_shard(warm.add_argument)
    warm.add_argument("--jobs", type=count, default=None, help="builds at once (default: one per core)")
    warm.add_argument("--timeout", type=seconds, default=BUILD_S,
                      help=f"seconds per build (default {BUILD_S:g}: longer than a run's, since a compile "
                           f"stopped is lost; 0: none)")
    warm.add_argument("--save", metavar="ARCHIVE", default=None,
                      help="after the builds, write the compilers' caches (Triton, inductor, FlashInfer JIT) to "
                           "this archive (a tar; .tar.gz compresses) for another machine's --restore")
    warm.add_argument("--restore", metavar="ARCHIVE", default=None,
                      help="before the builds, unpack an archive --save wrote into this machine's caches: the "
                           "builds it holds (written on this device with these versions) are not run again, the "
                           "others load what it holds, and the last line counts what they still compiled")
    fuzz_cli.add_parser(sub, PROG)
    rep = sub.add_parser("repro", prog=f"{PROG} repro",
                         help="write a Python file that reproduces one run with only its engine and torch imported")
    rep.add_argument("--standalone", required=True, metavar="RUN_ID",
                     help="the run, by its id in results and tables: backend-mode-exec-case")
    rep.add_argument("--cases", default=None, help="case catalog as module:attr (default: the in-box one)")
    rep.add_argument("--out", default=None, help="the file to write (default: repro_RUN_ID.py here)")
    rep.add_argument("--no-shrink", action="store_true",
                     help="write the run as recorded; by default a failing run is first shrunk by runs of its "
                          "backend here to the fewest requests, shortest lengths and fewest features that still "
                          "fail the same way (the fuzzer's shrinker)")
    return parser


def _run(args, catalog) -> int:
    import torch

    from kit.engine.case_line import format_case, parse_case
    from kit.harness.environment import device_name
    from kit.harness.registry import UnknownBackend, backend_label, import_root
    from kit.harness.runner import run_case
    from kit.modes import parse_exec, parse_mode
    from kit.report import known_failures
    from kit.report.known_failures import KnownFailuresError
    from kit.report.record import ERROR, FAIL, repro_command

    try:
        exec_ = parse_exec(args.exec_)
        if args.case_line:
            case = parse_case(args.case_line)
        elif not args.mode:
            return fail(PROG, "--case needs --mode (or give the whole case with --case-line)")
        else:
            case = catalog.find_case(parse_mode(args.mode), args.case)
        device = torch.device(args.device) if args.device else None
    except KeyError:
        return fail(PROG, _no_case(catalog, args.mode, args.case))
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
                                     case_line=format_case(case), pythonpath=import_root(args.backend))
    entry = known_failures.match(entries, result.backend, result.mode, result.exec, result.case, device_name(),
                                 result.dtype)
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
        return FAILED if result.outcome in (FAIL, ERROR) else 0
    status = result.outcome + (f" [{result.failure_class}]" if result.failure_class else "")
    print(f"{result.test_id}: {status} ({result.exec_detail or '-'}, {result.seconds:.2f}s)")
    if result.message:
        print(result.message)
    if entry is not None:
        print(known_failures.against(entry, result))
    return FAILED if result.outcome in (FAIL, ERROR) else 0


def _repro(args, catalog) -> int:
    from kit.harness.registry import UnknownBackend, load_backend
    from kit.modes import Exec, parse_mode
    from kit.report.record import parse_run_id
    from kit.repro.scenario import NotReproducible
    from kit.repro.standalone import standalone

    try:
        backend, mode, exec_, name = parse_run_id(args.standalone)
        case = catalog.find_case(parse_mode(mode), name)
    except KeyError:
        return fail(PROG, _no_case(catalog, mode, name))
    except ValueError as exc:
        return fail(PROG, f"--standalone: {exc}")
    try:
        backend_cls = load_backend(backend)
    except (UnknownBackend, ImportError, AttributeError, ValueError, TypeError) as exc:
        return fail(PROG, f"--standalone: backend {backend}: {exc}")
    try:
        standalone(backend_cls, case, Exec(exec_), "")  # a run no file reproduces is refused before any run
        case, origin = _shrunk(backend, case, Exec(exec_), args) if not args.no_shrink else (
            case, f"The run {args.standalone} as recorded (--no-shrink).")
        text = standalone(backend_cls, case, Exec(exec_), origin)
    except NotReproducible as exc:
        return fail(PROG, f"--standalone {args.standalone}: {exc}")
    out = args.out or f"repro_{args.standalone}.py"
    with open(out, "w") as f:
        f.write(text)
    print(origin)
    print(f"wrote {out}: run it with `python {out}` (imports torch and the engine only)")
    return 0


def _shrunk(backend: str, case, exec_, args):
    """The case a standalone file reproduces, and what it says of where the case comes from: a failing
    run shrunk (kit.fuzz.search.shrink), a passing one as recorded."""
    from kit.engine.features import features_of
    from kit.fuzz.search import Target, first_failure, shrink

    def described(c) -> str:
        on = [f.name for f in features_of(c) if f.dropped and f.on(c)]
        return (f"{c.name} ({c.bs} requests, {sum(c.prefix)} cached and {sum(c.new_lens)} new tokens"
                f"{', ' + ', '.join(on) if on else ''})")

    target = Target(backend, (case.mode,), (exec_,))
    found = first_failure(target, case, exec_)
    if found is None:
        return case, f"The run {args.standalone} as recorded: it passes here, so nothing was shrunk."
    small = shrink(target, found).case
    return small, (f"Shrunk from {described(case)} to {described(small)}; both fail [{found.failure_class}] in the "
                   f"kit.")


def _no_case(catalog, mode: str, name: str) -> str:
    """Why `--mode mode --case name` names no case: a case of another mode, or a near miss."""
    import difflib

    from kit.modes import parse_mode

    elsewhere = [m.value for m in MODES if name in catalog.all_cases(m)]
    if elsewhere:
        return f"{name!r} is a {elsewhere[0]} case, not a {mode} one: give --mode {elsewhere[0]}"
    close = difflib.get_close_matches(name, catalog.all_cases(parse_mode(mode)), n=3)
    return f"no {mode} case named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else "") + \
        f" (`python -m kit list --mode {mode}` lists them)"


def _selection(args):
    """(backend specs, modes, execs) of the selection options, or ValueError naming the bad one."""
    from kit.harness.registry import UnknownBackend, backend_label, known_backends

    backends = options.csv(args.backend) or known_backends()
    for spec in backends:
        try:
            backend_label(spec)
        except (UnknownBackend, ImportError, AttributeError, ValueError, TypeError) as exc:
            raise ValueError(f"--backend {spec}: {exc}") from None
    return backends, options.modes(args.mode), options.execs(args.exec_)


def _warmup(args, catalog, case_set: str) -> int:
    import tarfile

    from kit import caches, warmup
    from kit.harness.environment import device_name
    from kit.harness.registry import backend_label, kernels_of
    from kit.shard import Shard

    try:
        backends, modes, execs = _selection(args)
        shard = Shard.parse(args.shard) if args.shard else None
    except ValueError as exc:
        return fail(PROG, f"{exc}")
    labels = {spec: backend_label(spec) for spec in backends}
    todo = warmup.builds(backends, modes, execs, catalog, case_set, kernels_of, warmup.runs_here, shard, labels.get)
    held = set()  # builds whose kernels the restored archive holds for this machine: not run again
    if args.restore:
        try:
            restored = caches.restore(args.restore)
        except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
            return fail(PROG, f"--restore {args.restore}: not an archive `{PROG} warmup --save` wrote ({exc})")
        for line in restored.lines:
            print(f"restored {line}", flush=True)
        held = restored.held(device_name()) & {build.key for build in todo}
        print(f"restored: the archive holds {len(held)} of the {len(todo)} builds for this device and these "
              f"versions; building the other {len(todo) - len(held)}", flush=True)
    lost = warmup.warmup([b for b in todo if b.key not in held], args.jobs or warmup.default_jobs(), args.cases,
                         args.timeout)
    if args.save:
        built = held | {build.key for build in todo if build not in lost}
        saved = caches.save(args.save, builds=built, device=device_name())
        print(f"saved to {args.save}: " + (", ".join(f"{name} {files} files" for name, files in saved.items())
                                           or "no cache (nothing compiled on this machine yet)"), flush=True)
    return FAILED if lost else 0


def _list(args, catalog, case_set: str) -> int:
    from kit import listing
    from kit.harness.scope import narrows_to_ci

    try:
        backends, modes, execs = _selection(args) if args.backends else ([], options.modes(args.mode), [])
    except ValueError as exc:
        return fail(PROG, f"{exc}")
    if not args.backends:
        print("\n".join(listing.case_lines(catalog, case_set, modes)))
        return 0
    for spec in backends:
        print("\n".join(listing.backend_lines(spec, catalog, case_set, modes, execs,
                                              narrows_to_ci(args.case_set, case_set), args.check)), flush=True)
    return 0


# What a command stopped by Ctrl-C keeps (its one line says so, with pytest's exit code).
KEPT = dict(run="nothing: a run is reported once it ends", list="nothing: it only prints",
            warmup="the kernels built so far: the next warmup builds the rest",
            fuzz="nothing: its search had not started or had ended",
            repro="nothing: the file is written once it is whole")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _command(args)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted (Ctrl-C); kept: {KEPT[args.command]}", file=sys.stderr)
        return INTERRUPTED


def _command(args) -> int:
    if args.command == "list" and args.check and not args.backends:
        return fail(PROG, "--check checks backends: give it with --backends")
    if args.command == "run" and ":" not in args.backend:  # a name is looked up before torch and the catalog load
        from kit.harness.registry import UnknownBackend, backend_label
        try:
            backend_label(args.backend)
        except UnknownBackend as exc:
            return fail(PROG, f"--backend {args.backend}: {exc}")
    if args.command != "list":  # the commands that run backends, before any of them imports triton
        from kit.harness import interpreter
        interpreter.choose()
    if args.command == "fuzz":
        return fuzz_cli.main(args, PROG)
    from kit.engine.catalog import load_catalog, resolve_set

    try:
        catalog = load_catalog(args.cases)
        case_set = resolve_set(getattr(args, "case_set", "auto"))
    except (ImportError, AttributeError, TypeError) as exc:
        return fail(PROG, f"--cases {args.cases}: {exc}")
    except ValueError as exc:
        return fail(PROG, f"{exc}")
    if args.command == "run":
        return _run(args, catalog)
    if args.command == "repro":
        return _repro(args, catalog)
    if args.command == "warmup":
        return _warmup(args, catalog, case_set)
    return _list(args, catalog, case_set)


if __name__ == "__main__":
    sys.exit(main())
