"""`python -m kit fuzz --mutants`: how fast the fuzzer finds each mutant of the catalog
(tests/mutants, kit.mutation.Mutant) within a stated budget, searching the mutant's modes and
execs from scratch (no example database). Each mutant is fuzzed in its own process (`python -m
kit fuzz --json`), as kit.mutate scores them: a mutant that kills its process is a crash of the
case it was running (kit.fuzz.in_flight), and the next starts clean. Writes results/fuzz/mutants-<device>.json, the README's table
(matrix.fuzz renders it)."""
from __future__ import annotations

import concurrent.futures
import json
import re
import tempfile
from pathlib import Path
from typing import Dict

from kit.cli import FAILED, fail
from kit.fuzz import in_flight, ledger
from kit.report.record import CRASH
from kit.harness import child


def _command(m, args, running: Path) -> list:
    cmd = child.command("kit", "fuzz", "--backend", m.backend, "--mode", ",".join(x.value for x in m.modes),
                        "--exec", ",".join(x.value for x in m.execs), "--budget", str(args.budget), "--size",
                        args.size, "--max-examples", str(args.max_examples), "--database", "none", "--json",
                        "--in-flight", str(running), "--seed", str(args.seed), "--ledger",
                        str(Path(args.ledger or ledger.DEFAULT).resolve()))
    for flag, value in (("--shrink-budget", args.shrink_budget), ("--device", args.device),
                        ("--timeout", args.timeout), ("--known-failures", args.known_failures)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def row(m, args) -> Dict:
    """One mutant fuzzed: found (a new failure of an expected class), after how many examples and
    seconds, the shrunk case."""
    with tempfile.TemporaryDirectory() as tmp:
        running = Path(tmp) / "in-flight.json"
        ended = child.run(_command(m, args, running))
        died = in_flight.take(running)
    base = dict(number=m.number, mutant=m.name, expect=list(m.expect), modes=[x.value for x in m.modes],
                execs=[x.value for x in m.execs])
    record = ended.answer()
    if record is None:
        error = ended.death()
        if died is None:
            return dict(base, found=False, error=error, examples=0, seconds=None, classes=[], case_line="", repro="")
        # The case it was running took the process down: a crash, found but not shrunk.
        return dict(base, found=CRASH in m.expect, error=f"the process died running it ({error}): not shrunk",
                    examples=died["example"], seconds=died["seconds"], shrink_seconds=0.0, classes=[CRASH],
                    case_line=died["case_line"], repro=died["repro"], seed=args.seed)
    hits = [f for f in record["new"] if f["failure_class"] in m.expect]
    hit = hits[0] if hits else None
    return dict(base, found=hit is not None, error="", examples=record["first_example"] if hit else record["examples"],
                seconds=record["search_seconds"] if hit else None, shrink_seconds=record["shrink_seconds"],
                classes=sorted({f["failure_class"] for f in record["new"]}),
                case_line=hit["case_line"] if hit else "", repro=hit["repro"] if hit else "", seed=record["seed"])


def _drawn_for(m) -> bool:
    """Whether the fuzzer draws cases of an attention kind the mutant's backend runs (softmax or recurrent)."""
    from kit.engine.kinds import KINDS
    from kit.engine.kinds.recurrent import KINDS as RECURRENT_KINDS
    from kit.harness.capabilities import Capabilities
    from kit.harness.registry import load_backend

    return bool(Capabilities.of(load_backend(m.backend)).attention_kinds & (set(KINDS) | set(RECURRENT_KINDS)))


def table_run(args, prog: str) -> int:
    import torch

    from kit.targets import import_target
    from kit.harness.environment import environment

    try:
        mutants = list(import_target(args.catalog))
    except (ImportError, AttributeError) as exc:
        return fail(prog, f"fuzz: --catalog {args.catalog}: {exc}")
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.name for m in mutants}
        if unknown:
            return fail(prog, f"fuzz: unknown mutant(s) {sorted(unknown)}; known: {', '.join(m.name for m in mutants)}")
        mutants = [m for m in mutants if m.name in wanted]
    on_gpu = torch.cuda.is_available() and args.device != "cpu"
    mutants = [m for m in mutants if not m.harmless and (m.cpu or on_gpu) and _drawn_for(m)]
    if args.seed is None:
        args.seed = 0  # one seed for the whole table: it can be made again
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda m: row(m, args), mutants))
    env = environment()
    slug = "cpu" if not on_gpu else re.sub(r"[^a-z0-9]+", "-", env["device"].lower()).strip("-")
    out = Path(args.table_json) if args.table_json else Path("results") / "fuzz" / f"mutants-{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = dict(environment=env, budget=args.budget, shrink_budget=args.shrink_budget or args.budget, size=args.size,
               seed=args.seed, catalog=args.catalog, rows=rows)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    from matrix.fuzz import table
    print(table(doc, str(out)))
    print(f"wrote {out}")
    return FAILED if not all(r["found"] for r in rows) else 0

