"""Many backends on one host: the matrix over 33 backends in one session, as a mutation campaign or
an engine's whole set runs it.

    python -m benchmarks.many_backends [--backends 32] [--workers auto] [--case-set full]
                                       [--limit-s 1800] [--cold] [--out PATH]
                                       [--steps warmup,matrix,alone,warm] [--verdicts PATH]
                                       [--backend NAME ...] [--keep DIR] [PYTEST ARGS]

The backends: `triton`, and `--backends` small subclasses of the in-box Triton backend, given as
module:attr (this module's attributes): the public mutants of tests/mutants/triton.py first
(each a real bug, so its runs fail as they should), then plain copies. In order, each step a
row appended to `results/bench/many-backends-<device>.json` (or --out) as soon as it ends:

1. `python -m kit warmup` over the selection (`--cold` labels it a first run on a fresh machine);
2. the README's matrix command over all of them (`-n <workers> --dist loadgroup`): seconds, the
   GPU memory peak (nvidia-smi, polled), records by outcome and class, the results file's
   status, records of out-of-memory (an `environment` error, or an OutOfMemoryError in a
   crash's message), whether the output holds an INTERNALERROR;
3. the same command over `triton` alone: whether its verdicts equal those of the many-backend run;
4. the warmup and the many-backend matrix once more (warm: `warm` is the two steps `warm-warmup`
   and `warm-matrix`).

`--backend NAME` (repeatable) names the backends instead: every registered one gives the README's
matrix command as a user runs it on a fresh machine (`--cold`: warmup, then the matrix, then both
warm). Each command runs under what is left of `--limit-s`; a step past it is recorded as such.
`--steps` runs some of them (a machine that cannot give one process the whole time runs them in
several invocations): the many-backend run's verdicts of `triton` are written to `--verdicts`
(default results/bench/many-backends-verdicts.json, next to the rows), which step 3 compares with
when step 2 is not in its invocation.
`--keep DIR` keeps each step's whole output (`<step>.log`) and each matrix step's results file
(`<step>-results.json`). Each row has `cpu_busy`: the share of the host's cores busy over the step
(/proc/stat; a warmup at 1.0 is bound by its compilers).
Other arguments go to pytest as they are (e.g. `--mode decode`).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from backends.triton import TritonBackend
from benchmarks.kit_throughput import append_row, device, kit_commit
from kit.report.record import ENVIRONMENT, read_results_file
from tests.mutants import triton as mutants

REPO = Path(__file__).resolve().parent.parent
IN_BOX = "triton"
MODULE = "benchmarks.many_backends"  # this module as the backends' module:attr names it (not __main__)
STEPS = ("warmup", "matrix", "alone", "warm-warmup", "warm-matrix")
ALIASES = {"warm": ("warm-warmup", "warm-matrix")}

_MUTANTS = [name for name, cls in vars(mutants).items()
            if isinstance(cls, type) and issubclass(cls, TritonBackend) and cls is not TritonBackend
            and not name.startswith("_") and cls.__module__ == mutants.__name__]
for _name in _MUTANTS:  # each under a name of its own (a mutant's is triton's): labels must differ
    globals()[_name] = type(_name, (getattr(mutants, _name),), {"name": f"mutant_{_name}", "__module__": MODULE})
# Plain copies: the in-box Triton backend under other names (its runs pass).
for _i in range(64):
    globals()[f"TritonCopy{_i:02d}"] = type(f"TritonCopy{_i:02d}", (TritonBackend,),
                                            {"name": f"triton_copy_{_i:02d}", "__module__": MODULE})


def backends(count: int) -> List[str]:
    names = (_MUTANTS + [f"TritonCopy{i:02d}" for i in range(64)])[:count]
    return [IN_BOX] + [f"{MODULE}:{name}" for name in names]


GPU_QUERY = "index,memory.used,utilization.gpu"


def gpu_sample(csv: str) -> Dict[str, Tuple[int, int]]:
    """nvidia-smi's `--query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits`
    lines: each GPU's (MiB in use, % utilization) by index."""
    rows = [[field.strip() for field in line.split(",")] for line in csv.strip().splitlines()]
    return {index: (int(memory), int(utilization)) for index, memory, utilization in rows}


class GpuPoll:
    """Each GPU's memory in use and utilization, polled with nvidia-smi every `every` s; nothing
    without nvidia-smi."""

    def __init__(self, every: float = 0.5):
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.samples.append(gpu_sample(out))
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self._stop.wait(self.every)

    @property
    def peak(self) -> Optional[int]:
        """The largest memory in use, summed over the GPUs (MiB)."""
        return max((sum(memory for memory, _ in sample.values()) for sample in self.samples), default=None)

    def utilization(self) -> Dict[str, float]:
        """Each GPU's mean utilization (%) over the samples."""
        by_gpu = collections.defaultdict(list)
        for sample in self.samples:
            for index, (_, utilization) in sample.items():
                by_gpu[index].append(utilization)
        return {index: round(sum(values) / len(values), 1) for index, values in sorted(by_gpu.items())}

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _cpu_ticks(stat: Path = Path("/proc/stat")) -> Optional[tuple]:
    """(busy, all) jiffies of the host's cores since boot; None off Linux."""
    try:
        ticks = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are not busy


def busy_share(before: Optional[tuple], after: Optional[tuple]) -> Optional[float]:
    """The share of the cores busy between two `_cpu_ticks`."""
    if not before or not after or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


class Clock:
    def __init__(self, limit_s: float):
        self.deadline = time.monotonic() + limit_s

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())


def _run(cmd: List[str], clock: Clock, keep: Optional[Path] = None) -> dict:
    """`cmd` under what is left of the limit; past it, its whole process group is killed (its
    workers, their compilers), which would otherwise hold its output open and run on. The output
    goes to `keep` as it comes (`tail -f` shows a step's progress)."""
    start, ticks = time.perf_counter(), _cpu_ticks()
    with (open(keep, "w+") if keep else tempfile.TemporaryFile("w+")) as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            code = proc.wait(timeout=clock.left())
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = "past the time limit"
        out.seek(0)
        output = out.read()
    return dict(seconds=round(time.perf_counter() - start, 2), exit_code=code, cpu_busy=busy_share(ticks, _cpu_ticks()),
                output=output)


def _selection(extra: List[str]) -> List[str]:
    """The options of `extra` (pytest's) that warmup takes too."""
    parser = argparse.ArgumentParser(add_help=False)
    for option in ("--mode", "--exec", "--cases"):
        parser.add_argument(option, action="append", default=[])
    known, _ = parser.parse_known_args(extra)
    return [a for option, values in (("--mode", known.mode), ("--exec", known.exec), ("--cases", known.cases))
            for value in values for a in (option, value)]


def warmup(specs: List[str], case_set: str, extra: List[str], clock: Clock, label: str,
           keep: Optional[Path] = None) -> dict:
    selection = _selection(extra)
    cmd = [sys.executable, "-m", "kit", "warmup", "--case-set", case_set, *selection,
           *[a for spec in specs for a in ("--backend", spec)]]
    ran = _run(cmd, clock, keep)
    return dict(step="warmup", label=label, seconds=ran["seconds"], exit_code=ran["exit_code"],
                cpu_busy=ran["cpu_busy"],
                builds=sum(1 for line in ran["output"].splitlines() if line.startswith("[")),
                last_lines=ran["output"].strip().splitlines()[-2:])


def matrix(specs: List[str], workers: str, case_set: str, extra: List[str], clock: Clock, label: str,
           keep: Optional[Path] = None) -> dict:
    """`keep`: a path for the output, and next to it (`-results.json`) the results file."""
    with tempfile.TemporaryDirectory() as tmp:
        results = str(keep.with_name(keep.stem + "-results.json")) if keep else os.path.join(tmp, "results.json")
        cmd = [sys.executable, "-m", "pytest", "-n", workers, "--dist", "loadgroup", "tests/test_conformance.py",
               "--case-set", case_set, "--results-json", results, "-q", "-p", "no:cacheprovider",
               *[f"--backend={spec}" for spec in specs], *extra]
        with GpuPoll() as memory:
            ran = _run(cmd, clock, keep)
        written = read_results_file(results) if os.path.exists(results) else None
    records = written.records if written else []
    oom = [r for r in records if r.failure_class == ENVIRONMENT or "OutOfMemoryError" in r.message]
    return dict(step="matrix", label=label, backends=len(specs), workers=workers, seconds=ran["seconds"],
                exit_code=ran["exit_code"], cpu_busy=ran["cpu_busy"], gpu_memory_peak_mib=memory.peak,
                status=written and written.status, selected=len(written and written.selected or []),
                records=len(records), by_verdict=dict(collections.Counter(r.verdict for r in records)),
                out_of_memory_records=len(oom), out_of_memory_first=[r.test_id for r in oom[:5]],
                internal_error="INTERNALERROR" in ran["output"],
                last_lines=ran["output"].strip().splitlines()[-3:],
                verdicts={r.test_id: r.verdict for r in records if r.backend == IN_BOX})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", type=int, default=32, help="subclasses of the Triton backend besides triton")
    parser.add_argument("--workers", default="auto", help="xdist workers (default auto)")
    parser.add_argument("--case-set", default="full")
    parser.add_argument("--limit-s", type=float, default=1800.0, help="time limit of the whole benchmark")
    parser.add_argument("--cold", action="store_true", help="label the first warmup a cold one (fresh machine)")
    parser.add_argument("--out", help="rows file (default: results/bench/many-backends-<device>.json)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"the steps to run, of {','.join(STEPS)} (warm: both warm ones)")
    parser.add_argument("--backend", action="append", default=[],
                        help="a backend to run (repeatable) instead of triton and its subclasses")
    parser.add_argument("--verdicts", help="triton's verdicts in the many-backend run: written by the matrix "
                                           "step, read by the alone step (default: next to the rows file)")
    parser.add_argument("--keep", type=Path, help="a folder for each step's output and results file")
    args, extra = parser.parse_known_args()
    steps = [step for name in args.steps.split(",") for step in ALIASES.get(name, (name,))]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"--steps: {', '.join(unknown)}: not among {', '.join(STEPS)}")
    clock, specs = Clock(args.limit_s), args.backend or backends(args.backends)
    name, slug = device()
    out = Path(args.out) if args.out else REPO / "results" / "bench" / f"many-backends-{slug}.json"
    verdicts = Path(args.verdicts) if args.verdicts else out.with_name(out.stem + "-verdicts.json")
    common = dict(device=name, kit_commit=kit_commit(), case_set=args.case_set, args=extra)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)

    def kept(step: str) -> Optional[Path]:
        return args.keep / f"{step}.log" if args.keep else None

    def row(r: dict) -> dict:
        shown = {k: v for k, v in r.items() if k != "verdicts"}
        append_row(out, {**common, **shown})
        print(json.dumps(shown), flush=True)
        return r

    if "warmup" in steps:
        row(warmup(specs, args.case_set, extra, clock, "cold" if args.cold else "first", kept("warmup")))
    if "matrix" in steps:
        many = row(matrix(specs, args.workers, args.case_set, extra, clock, "many backends", kept("matrix")))
        verdicts.write_text(json.dumps(dict(kit_commit=common["kit_commit"], verdicts=many["verdicts"]), indent=1))
    if "alone" in steps:
        many = json.loads(verdicts.read_text())
        alone = matrix([IN_BOX], args.workers, args.case_set, extra, clock, "triton alone", kept("alone"))
        alone["compared_with_kit_commit"] = many["kit_commit"]
        alone["in_box_equal"] = alone["verdicts"] == many["verdicts"] and bool(alone["verdicts"])
        alone["in_box_differ"] = sorted(k for k in set(alone["verdicts"]) | set(many["verdicts"])
                                        if alone["verdicts"].get(k) != many["verdicts"].get(k))[:10]
        row(alone)
    if "warm-warmup" in steps:
        row(warmup(specs, args.case_set, extra, clock, "warm", kept("warm-warmup")))
    if "warm-matrix" in steps:
        row(matrix(specs, args.workers, args.case_set, extra, clock, "many backends, warm", kept("warm-matrix")))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
