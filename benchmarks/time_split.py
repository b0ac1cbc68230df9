"""Where the matrix's time goes, per backend and mode: compiles (Triton, inductor, FlashInfer JIT),
references, kernels, backend loading and the kit's own work, with the GPU's busy share.

    python -m benchmarks.time_split [--case-set full] [--workers auto] [--full] [--out PATH] [PYTEST ARGS]

Runs the README's matrix command as benchmarks.kit_throughput times it (the in-box backends unless
--backend names others, or --full: every registered one; other arguments go to pytest, e.g.
`--mode decode`), every process writing
its timeline (benchmarks.timeline), in which each run says where its seconds went (kit.spend: a
compile's seconds are the compile's, not the kernel's it ran inside). Appends one row to
`results/bench/time-split-<device>.json` (or --out): the device, the host's cores, the libraries'
versions, whether references came from a disk cache (KIT_REFERENCE_CACHE), the command's seconds and runs, the session's compiles by library (0: every kernel
came from the caches), the GPUs' mean utilization (nvidia-smi, polled every 0.5 s) and its mean
over them as `gpu_busy_share`, and per backend and mode (`split`): runs executed, seconds in
runs, and of them compile (by library, with counts), reference, kernel (the backend's calls and
the wait for the device work they queued), load (loading and asking the backend) and kit (the
rest: inputs, pools, checks, graph buffers); `phases` says where the session's seconds outside
the runs went (benchmarks.timeline).
"""
from __future__ import annotations

import argparse
import collections
import importlib.metadata
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

from benchmarks.gpus import backends
from benchmarks.kit_throughput import REPO, append_row, device, measure
from benchmarks.many_backends import GpuPoll
from benchmarks.timeline import test_events
from kit import spend
from kit.engine import reference_cache
from kit.report.record import UNSUPPORTED, parse_run_id, read_results_file

PARTS = (spend.REFERENCE, spend.KERNEL, spend.LOAD)
LIBRARIES = ("torch", "triton", "flashinfer-python", "sglang", "vllm")


def _versions() -> Dict[str, str]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def split(timeline: str, executed: Dict[Tuple[str, str], int]) -> Dict[str, dict]:
    """Per `backend mode`, from the processes' timelines: seconds in its runs and where they went;
    `executed`: its runs not unsupported, by (backend, mode)."""
    seconds: Dict[Tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    counts: Dict[Tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for e in test_events(timeline):
        try:
            backend, mode, _, _ = parse_run_id(e["id"])
        except ValueError:  # one of the kit's own tests
            continue
        seconds[backend, mode]["run"] += e["end"] - e["t"]
        seconds[backend, mode].update(e["spent"]["seconds"])
        counts[backend, mode].update(e["spent"]["counts"])
    rows = {}
    for key in sorted(seconds):
        s, c = seconds[key], counts[key]
        compile_s = {lib.split(".", 1)[1]: round(s[lib], 2) for lib in spend.COMPILERS if s[lib]}
        parts = {part: round(s[part], 2) for part in PARTS}
        rows[" ".join(key)] = dict(runs=executed.get(key, 0), run_s=round(s["run"], 2),
                                   compile_s=round(sum(s[lib] for lib in spend.COMPILERS), 2),
                                   compile_by_library_s=compile_s,
                                   compiles={lib.split(".", 1)[1]: c[lib] for lib in spend.COMPILERS if c[lib]},
                                   **{f"{part}_s": v for part, v in parts.items()},
                                   kit_s=round(s["run"] - sum(s[p] for p in PARTS)
                                               - sum(s[lib] for lib in spend.COMPILERS), 2))
    return rows


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case-set", default="full", help="smoke, full or auto (default: full)")
    parser.add_argument("--workers", default="auto", help="xdist workers: a number or auto (default); 0: no xdist")
    parser.add_argument("--full", action="store_true", help="every registered backend, not the in-box ones")
    parser.add_argument("--out", help="the rows file (default: results/bench/time-split-<device>.json)")
    args, extra = parser.parse_known_args(argv)
    specs, extra = backends(args.full, extra)
    extra = [f"--backend={spec}" for spec in specs] + extra
    name, slug = device()
    with tempfile.TemporaryDirectory() as tmp, GpuPoll() as poll:
        results, timeline = os.path.join(tmp, "results.json"), os.path.join(tmp, "timeline")
        row = measure(name, args.workers, args.case_set, False, extra, keep=results, timeline=timeline)
        executed = collections.Counter((r.backend, r.mode) for r in read_results_file(results).records
                                       if r.outcome != UNSUPPORTED)
        by_backend_mode = split(timeline, executed)
    utilization = poll.utilization()
    compiles = collections.Counter()
    for part in by_backend_mode.values():
        compiles.update(part["compiles"])
    row = dict(row, cores=os.cpu_count(), versions=_versions(), reference_cache=bool(os.environ.get(reference_cache.ENV)),
               compiles=dict(compiles),
               compiles_total=sum(compiles.values()), gpu_utilization=utilization,
               gpu_busy_share=(round(sum(utilization.values()) / len(utilization) / 100, 3) if utilization else None),
               split=by_backend_mode)
    out = Path(args.out) if args.out else REPO / "results" / "bench" / f"time-split-{slug}.json"
    append_row(out, row)
    print(f"{name}: {row['runs']} runs in {row['seconds']} s, {row['compiles_total']} compiles, GPU busy "
          f"{row['gpu_busy_share']}")
    for key, part in by_backend_mode.items():
        print(f"  {key}: {part['runs']} runs, {part['run_s']} s: compile {part['compile_s']}, reference "
              f"{part['reference_s']}, kernel {part['kernel_s']}, load {part['load_s']}, kit {part['kit_s']}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
