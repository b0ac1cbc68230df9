"""One GPU against every GPU of a host: the matrix command timed on each.

    python -m benchmarks.gpus [--repeat 2] [--gpus 1,all] [--full] [--workers auto] [--case-set full]
                              [--committed PATH] [--no-warmup] [--out PATH] [--keep DIR] [PYTEST ARGS]

The in-box matrix (`torch_native`, `triton`, `flashinfer`, `flashinfer_mla`; `--full`: every
registered backend, SGLang's too) after one `python -m kit warmup` over it, then, `--repeat` times
in turn, the README's matrix command (benchmarks.kit_throughput.measure) on the first GPU alone
(`CUDA_VISIBLE_DEVICES` set to it) and on every GPU (the environment as it is). Each step appends
a row to `results/bench/gpus-<device>.json` (or --out) as it ends: the warmup's seconds; for a
matrix run, the GPUs it had, seconds, runs, runs per second and where the time went (as
kit_throughput's rows), each GPU's workers' share of their time in runs (`workers_busy_by_gpu`:
kit.process.placement puts worker N on GPU N mod the GPUs) and seconds in runs, each GPU's mean
utilization and the memory peak (nvidia-smi, polled), and whether its verdicts equal those of the
committed results (`--committed`, default `results/gpu-h200.json`; `verdicts_differ`: the first
that do not). Other arguments go to pytest as they are (e.g. `--mode decode`).
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.kit_throughput import append_row, device, kit_commit, measure
from benchmarks.many_backends import Clock, GpuPoll, warmup
from benchmarks.timeline import test_seconds
from kit.harness.registry import IN_BOX
from kit.process.placement import device_of, gpus_here, worker_number
from kit.report.record import Record, ResultsError, read_results_file

REPO = Path(__file__).resolve().parent.parent
PROG = "python -m benchmarks.gpus"
SETTINGS = ("1", "all")
DIFFER_SHOWN = 10


def settings(which: Sequence[str], gpus: Sequence[str]) -> List[Tuple[str, Optional[str], int]]:
    """(label, CUDA_VISIBLE_DEVICES or None for the environment as it is, GPUs) of each setting
    named: `1`, the first of `gpus` alone; `all`, every one."""
    if not gpus:
        raise SystemExit(f"{PROG}: no GPU here (none the NVIDIA driver lists, or CUDA_VISIBLE_DEVICES empty); "
                         f"run it on a GPU machine")
    unknown = [w for w in which if w not in SETTINGS]
    if unknown:
        raise SystemExit(f"{PROG}: --gpus {','.join(unknown)}: give 1, all or 1,all")
    return [("1 GPU", gpus[0], 1) if w == "1" else (f"{len(gpus)} GPUs", None, len(gpus)) for w in which]


def busy_by_gpu(seconds_in_tests: Dict[str, float], gpus: int, seconds: float) -> Dict[str, dict]:
    """Per GPU (its index among the run's), its workers (`gw0`, ... as kit.process.placement placed
    them), their seconds in runs and the share of their time that was (the run's `seconds` each)."""
    by_gpu = collections.defaultdict(list)
    for name, busy in seconds_in_tests.items():
        worker = worker_number(name)
        if worker is not None:
            by_gpu[str(device_of(worker, gpus))].append(busy)
    return {gpu: dict(workers=len(busy), test_s=round(sum(busy), 1),
                      busy_share=round(sum(busy) / (len(busy) * seconds), 3)) for gpu, busy in sorted(by_gpu.items())}


def compare_verdicts(records: List[Record], committed: List[Record]) -> dict:
    """Whether each run's verdict is the committed one (a run the committed results lack differs)."""
    theirs = {r.test_id: r.verdict for r in committed}
    differ = sorted(r.test_id for r in records if theirs.get(r.test_id) != r.verdict)
    return dict(verdicts_equal=bool(records) and not differ, verdicts_differ=differ[:DIFFER_SHOWN],
                verdicts_differing=len(differ))


def matrix_run(label: str, visible: Optional[str], gpus: int, args, extra: List[str], committed: List[Record]) -> dict:
    """One timed matrix run under `visible` (CUDA_VISIBLE_DEVICES; None: as it is): its row."""
    env = dict(os.environ) if visible is None else {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    with tempfile.TemporaryDirectory() as tmp, GpuPoll() as poll:
        folder = args.keep or tmp
        results = os.path.join(folder, f"results-{gpus}gpu.json")
        timeline = os.path.join(tmp, "timeline")
        row = measure(device()[0], args.workers, args.case_set, False, extra, keep=results, timeline=timeline, env=env)
        records = read_results_file(results).records
        by_gpu = busy_by_gpu(test_seconds(timeline), gpus, row["seconds"])
    return dict(step="matrix", label=label, gpus=gpus, cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                **{k: v for k, v in row.items() if k not in ("device", "kit_commit", "case_set", "args", "cold")},
                workers_busy_by_gpu=by_gpu, gpu_utilization=poll.utilization(), gpu_memory_peak_mib=poll.peak,
                compared_with=args.committed, **compare_verdicts(records, committed))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=2, help="runs of each setting, in turn (default 2)")
    p.add_argument("--gpus", default=",".join(SETTINGS),
                   help="the settings: 1 (the first GPU), all, or 1,all (default)")
    p.add_argument("--full", action="store_true", help="every registered backend, not the in-box four")
    p.add_argument("--workers", default="auto", help="xdist workers (default auto)")
    p.add_argument("--case-set", default="full")
    p.add_argument("--committed", default="results/gpu-h200.json",
                   help="the results whose verdicts each run's are compared with (default results/gpu-h200.json)")
    p.add_argument("--no-warmup", action="store_true", help="no `python -m kit warmup` first")
    p.add_argument("--limit-s", type=float, default=3600.0, help="time limit of the warmup")
    p.add_argument("--out", help="rows file (default: results/bench/gpus-<device>.json)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep each matrix run's results file there (results-<N>gpu.json; a later repeat replaces it)")
    return p


def backends(full: bool, extra: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The matrix's backends: those `extra` names with --backend, else the in-box four, or with
    `full` every registered backend; and the rest of `extra`."""
    named = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    named.add_argument("--backend", action="append", default=[])
    known, rest = named.parse_known_args(list(extra))
    given = [spec for value in known.backend for spec in value.split(",") if spec]
    if given:
        return given, rest
    if full:
        from kit.harness.registry import known_backends
        return known_backends(), rest
    return list(IN_BOX), rest


def main(argv: Optional[List[str]] = None) -> None:
    args, extra = parser().parse_known_args(argv)
    if args.repeat < 1:
        parser().error(f"--repeat {args.repeat}: give 1 or more")
    runs = settings(args.gpus.split(","), gpus_here())
    try:
        committed = read_results_file(REPO / args.committed).records
    except ResultsError as exc:
        raise SystemExit(f"{PROG}: --committed: {exc}") from None
    specs, extra = backends(args.full, extra)
    name, slug = device()
    out = Path(args.out) if args.out else REPO / "results" / "bench" / f"gpus-{slug}.json"
    common = dict(device=name, kit_commit=kit_commit(), case_set=args.case_set, backends=specs, args=extra)
    if not args.no_warmup:
        row = warmup(specs, args.case_set, extra, Clock(args.limit_s), "first")
        append_row(out, {**common, **row})
        print(f"warmup: {row['builds']} builds in {row['seconds']} s (exit code {row['exit_code']})", flush=True)
    matrix_args = [f"--backend={spec}" for spec in specs] + extra
    for _ in range(args.repeat):
        for label, visible, gpus in runs:
            row = matrix_run(label, visible, gpus, args, matrix_args, committed)
            append_row(out, {**common, **row})
            busy = {gpu: g["busy_share"] for gpu, g in row["workers_busy_by_gpu"].items()}
            print(f"{label}: {row['runs']} runs in {row['seconds']} s; workers busy by GPU {busy}, utilization "
                  f"{row['gpu_utilization']}; verdicts equal to {args.committed}: {row['verdicts_equal']}", flush=True)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
