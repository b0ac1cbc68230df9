"""Times one small run on a fresh worker and again after a large case ran in the same process: a
run must cost what its own batch costs, whatever ran before it (pools of its own size class, the
KV check against the known state, the poison compared only after a run that did not pass).

    python -m benchmarks.run_cost [--backend NAME] [--big-tokens N] [--repeats N] [--out PATH]

In one process: the small run (a 2-request bf16 DECODE; fp16 on CPU, where the in-box Triton
kernels' bf16 dot is not exact) `--repeats` times, then the large case (one request of
`--big-tokens` cached tokens, DECODE), then the small run `--repeats` times again. The first run
of each series is left out (it builds its batch and pool). Appends a row to
`results/bench/run-cost-<device>.json`: both medians, their ratio, the large case's seconds, the
backend, the kit's commit.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.kit_throughput import REPO, append_row, device, kit_commit
from kit.engine.case import MHA, Case
from kit.harness.runner import default_device, run_case
from kit.modes import Exec, ForwardMode


def small_case() -> Case:
    dtype = "bf16" if torch.cuda.is_available() else "fp16"
    return Case("cost_small", ForwardMode.DECODE, prefix=(20, 33), page=16, dtype=dtype, head_dim=64)


def big_case(tokens: int) -> Case:
    return Case("cost_big", ForwardMode.DECODE, prefix=(tokens,), heads=MHA, page=16, dtype="fp32", head_dim=64)


def _timed(backend: str, case: Case) -> float:
    start = time.perf_counter()
    result = run_case(backend, case, Exec.EAGER, default_device())
    seconds = time.perf_counter() - start
    if result.outcome != "pass":
        raise SystemExit(f"{backend} {case.name}: {result.outcome} {result.message}")
    return seconds


def series(backend: str, case: Case, repeats: int) -> float:
    """The median seconds of `repeats` runs after a first one (which builds the batch and pool)."""
    _timed(backend, case)
    return statistics.median(_timed(backend, case) for _ in range(repeats))


def measure(backend: str, big_tokens: int, repeats: int) -> dict:
    fresh = series(backend, small_case(), repeats)
    big = _timed(backend, big_case(big_tokens))
    after = series(backend, small_case(), repeats)
    return dict(device=device()[0], backend=backend, big_tokens=big_tokens, repeats=repeats,
                fresh_s=round(fresh, 4), after_big_s=round(after, 4), ratio=round(after / fresh, 3),
                big_s=round(big, 2), kit_commit=kit_commit(), date=time.strftime("%Y-%m-%d"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=None, help="default: triton on a GPU, torch_native on CPU")
    parser.add_argument("--big-tokens", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="the rows file (default: results/bench/run-cost-<device>.json)")
    args = parser.parse_args()
    backend = args.backend or ("triton" if torch.cuda.is_available() else "torch_native")
    row = measure(backend, args.big_tokens, args.repeats)
    out = Path(args.out) if args.out else REPO / "results" / "bench" / f"run-cost-{device()[1]}.json"
    append_row(out, row)
    print(f"{row['device']} {backend}: small run {row['fresh_s']} s fresh, {row['after_big_s']} s after a "
          f"{args.big_tokens}-token case ({row['ratio']}x) -> {out}")


if __name__ == "__main__":
    main()
