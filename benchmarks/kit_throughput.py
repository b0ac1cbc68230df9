"""Times the conformance matrix as a user runs it: runs per second of the whole kit.

    python -m benchmarks.kit_throughput [--case-set full] [--workers auto] [--cold] [--out PATH]
                                        [--results-json PATH] [PYTEST ARGS]

Runs the README's matrix command in a subprocess,

    python -m pytest -n <workers> --dist loadgroup tests/test_conformance.py --case-set <set> --results-json <tmp>

(`--workers 0`: one process, no xdist), times it from start to exit (startup,
collection and worker spawn included), and appends a row to
`results/bench/kit-throughput-<device>.json` (or --out): device, workers, runs
(executed runs: records not `unsupported`), seconds, runs_per_s, cold,
kit_commit, whether torch's bytecode was cached (bytecode_cached), where the seconds went
(phases, from benchmarks.timeline), and the ten slowest runs (run id, seconds). Other arguments go to
pytest as they are (e.g. `--backend triton --mode decode`). `--cold` only labels
the row: run it first on a fresh machine (JIT caches restored, nothing loaded);
the script clears nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from benchmarks.timeline import ENV as TIMELINE_ENV, phases
from kit.harness.environment import kit_commit
from kit.harness.registry import IN_BOX  # the matrix timed unless --backend names others
from kit.report.record import COMPLETE, UNSUPPORTED, read_results_file

REPO = Path(__file__).resolve().parent.parent
SLOWEST = 10


def device() -> Tuple[str, str]:
    """(name, its slug for the file name): `NVIDIA H100 80GB HBM3`, `nvidia-h100-80gb-hbm3`; `cpu`."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return name, re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def bytecode_cached() -> bool:
    """Whether torch's compiled bytecode is there for the run to load. pip writes it at install;
    a host that runs with PYTHONDONTWRITEBYTECODE and sources alone compiles torch, Triton and
    FlashInfer in every process, seconds of each worker's start: the timings say which."""
    return os.path.exists(importlib.util.cache_from_source(torch.__file__))


def matrix_command(workers: str, case_set: str, results: str, extra: List[str]) -> List[str]:
    xdist = [] if workers == "0" else ["-n", workers, "--dist", "loadgroup"]
    named = any(a == "--backend" or a.startswith("--backend=") for a in extra)
    backends = [] if named else [f"--backend={b}" for b in IN_BOX]
    return [sys.executable, "-m", "pytest", *xdist, "tests/test_conformance.py", "--case-set", case_set,
            "--results-json", results, "-q", "-p", "no:cacheprovider", "-p", "benchmarks.timeline",
            *backends, *extra]


def measure(name: str, workers: str, case_set: str, cold: bool, extra: List[str], keep=None,
            timeline=None, env: Optional[Dict[str, str]] = None) -> dict:
    """One timed run of the matrix command: the row (exits if it did not complete). `keep`: where
    the run's results file stays, `timeline`: the folder its processes' timelines stay in
    (benchmarks.timeline; else temporary ones); `env`: its environment (default: this one's)."""
    cached = bytecode_cached()
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.abspath(keep) if keep else os.path.join(tmp, "results.json")
        cmd = matrix_command(workers, case_set, results, extra)
        timeline = os.path.abspath(timeline) if timeline else os.path.join(tmp, "timeline")
        os.makedirs(timeline, exist_ok=True)
        t0, start = time.time(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**(os.environ if env is None else env), TIMELINE_ENV: timeline})
        seconds = time.perf_counter() - start
        written = read_results_file(results) if os.path.exists(results) else None
        where = phases(timeline, t0, seconds)
    # 0: all passed, 1: some run failed (still a timing); anything else stopped the session
    if proc.returncode not in (0, 1) or written is None or written.status != COMPLETE:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise SystemExit(f"the matrix run did not complete (exit code {proc.returncode}): {' '.join(cmd)}\n{tail}")
    executed = [r for r in written.records if r.outcome != UNSUPPORTED]
    slowest = sorted(executed, key=lambda r: -r.seconds)[:SLOWEST]
    seconds = round(seconds, 2)  # runs_per_s from the figure the row shows: the row agrees with itself
    return dict(device=name, workers=workers, runs=len(executed), seconds=seconds,
                runs_per_s=round(len(executed) / seconds, 2), cold=cold, kit_commit=kit_commit(),
                case_set=case_set, args=extra, bytecode_cached=cached, phases=where,
                slowest=[dict(run=r.test_id, seconds=r.seconds) for r in slowest])


def append_row(path: Path, row: dict) -> None:
    rows = json.loads(path.read_text()) if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows + [row], indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case-set", default="full", help="smoke, full or auto (default: full)")
    parser.add_argument("--workers", default="auto", help="xdist workers: a number or auto (default); 0: no xdist")
    parser.add_argument("--cold", action="store_true", help="label the row as a cold run (fresh machine)")
    parser.add_argument("--out", help="the rows file (default: results/bench/kit-throughput-<device>.json)")
    parser.add_argument("--results-json", help="keep the timed run's results file here (the matrix's results)")
    parser.add_argument("--timeline", help="keep the processes' timelines (benchmarks.timeline) in this folder")
    args, extra = parser.parse_known_args()
    name, slug = device()
    row = measure(name, args.workers, args.case_set, args.cold, extra, args.results_json, args.timeline)
    out = Path(args.out) if args.out else REPO / "results" / "bench" / f"kit-throughput-{slug}.json"
    append_row(out, row)
    print(f"{row['device']}: {row['runs']} runs in {row['seconds']} s with {row['workers']} workers: "
          f"{row['runs_per_s']} runs/s ({'cold' if row['cold'] else 'warm'}); slowest: "
          + ", ".join(f"{s['run']} {s['seconds']:.2f} s" for s in row["slowest"][:3]) + f"\n-> {out}")


if __name__ == "__main__":
    main()
