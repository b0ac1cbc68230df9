"""python -m kit warmup: builds every kernel variant a selection will load, before any run.

A backend's first run of a kernel variant builds it (FlashInfer's JIT, Triton's compile: minutes
for FlashInfer on a fresh machine), and in a matrix session those builds land in the workers'
first runs, against their time limits. Warmup runs each distinct
(backend, mode, kernel variant) of the selection once (a backend derived from a registered one,
as a mutant is, counts as that one: it builds the same kernels), on its smallest case it runs, in as
many processes at once as there are cores (`--jobs`). A process runs build after build
(`next_build`), so that it imports and loads each backend once, not once a build (16 processes
importing SGLang at once took longer than most builds). A build that takes its process down
costs only itself: the build is recorded lost with the process's exit code and last line of
stderr, and a new process takes the rest, as it does after a sticky device fault. The builds
land in the libraries' own on-disk caches, which the matrix's workers then load. Progress is
one plain line per finished build (with the compiles it did: kit.harness.compiles), the last
line their count (0: every kernel came from the caches), and a line naming the longest-running builds after a minute
with none finished (a FlashInfer module can compile for ten)."""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from kit import spend
from kit.process import placement
from kit.harness import child
from kit.engine.case import Case
from kit.engine.catalog import load_catalog
from kit.modes import Exec, ForwardMode, parse_exec, parse_mode
from kit.shard import Shard, kernel_group, split

BAR = 24
QUIET_S = 60.0  # with no build finished for this long, a line names the longest-running ones


@dataclass(frozen=True)
class Build:
    backend: str  # as given: a registered name or module:attr
    case: Case  # the smallest case of its (mode, kernel variant)
    exec_: Exec

    @property
    def what(self) -> str:
        return f"{self.backend} {self.case.mode.value} {self.case.kernel_variant} ({self.case.name})"

    @property
    def key(self) -> str:
        """What the build compiles, as an archive's manifest names it (kit.caches): the same on every machine."""
        return f"{self.backend} {self.case.mode.value} {self.case.kernel_variant} {self.exec_.value}"


def _size(case: Case):
    return case.size, case.bs, case.name


def builds(backends: Sequence[str], modes: Sequence[ForwardMode], execs: Sequence[Exec], catalog,
           case_set: str, kernels_of: Callable[[str], str] = lambda spec: spec,
           runs: Callable[[str, Case, Exec], bool] = lambda backend, case, exec_: True, shard: Optional[Shard] = None,
           label_of: Callable[[str], str] = lambda spec: spec) -> List[Build]:
    """One build per backend whose kernels the selection runs (`kernels_of`), mode and kernel
    variant: its smallest case the backend `runs`, eager where the selection runs eager (graph
    runs load the same kernels); a variant whose every case the backend declines builds nothing.
    With `shard`, those of the kernel groups the matrix's `--shard` runs (groups of the backends'
    labels, `label_of`, split as kit.plugin.selection.Selection.runs splits them)."""
    exec_ = Exec.EAGER if Exec.EAGER in execs else execs[0]
    backend_cases = [(spec, case) for spec in backends for mode in modes for case in catalog.matrix_cases(case_set, mode)]

    def group(spec: str, case: Case) -> str:
        return kernel_group(label_of(spec), case.mode.value, case.kernel_variant)

    shard_of = split((group(spec, case) for spec, case in backend_cases for _ in execs), shard.count) if shard else {}
    smallest: Dict[tuple, Case] = {}
    for spec, case in backend_cases:
        if shard and shard_of[group(spec, case)] != shard.index:
            continue
        backend = kernels_of(spec)
        if not runs(backend, case, exec_):
            continue
        key = (backend, case.mode, case.kernel_variant)
        if key not in smallest or _size(case) < _size(smallest[key]):
            smallest[key] = case
    return [Build(backend, case, exec_) for (backend, _, _), case in smallest.items()]


@functools.lru_cache(maxsize=None)
def _declarations(backend: str):
    from kit.harness.capabilities import Capabilities
    from kit.harness.registry import load_backend

    cls = load_backend(backend)
    return cls, Capabilities.of(cls)


def runs_here(backend: str, case: Case, exec_: Exec) -> bool:
    """Whether `backend` runs `case` (kit.harness.scope decides): a build on a case it declines
    builds nothing. A backend that does not load, or whose supports() raises, is left to its
    build, which reports it."""
    from kit.harness.scope import unsupported_reason

    try:
        return unsupported_reason(*_declarations(backend), case, exec_) is None
    except Exception:  # noqa: BLE001 - its build says what is wrong
        return True


def bar(done: int, total: int) -> str:
    filled = BAR * done // max(total, 1)
    return "[" + "#" * filled + "." * (BAR - filled) + f"] {done}/{total}"


def _interleaved(todo: Sequence[Build]) -> List[Build]:
    """One build of each backend in turn: the first processes start every backend's builds (its
    longest compiles) rather than the first backend's all."""
    by_backend: Dict[str, List[Build]] = {}
    for build in todo:
        by_backend.setdefault(build.backend, []).append(build)
    queues = list(by_backend.values())
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


class _Process:
    """One warmup process: builds go to its stdin, a verdict line each comes back on its stdout;
    what the backends print goes to its stderr file."""

    def __init__(self, slot: int, jobs: int, catalog_target: Optional[str], timeout: float):
        self.slot = slot
        self.stderr = tempfile.TemporaryFile("w+")  # not a pipe: a chatty backend would fill it and wait
        cmd = child.command("kit.warmup", "--timeout", str(timeout),
                            *(["--cases", catalog_target] if catalog_target else []))
        # Placed and budgeted as a session's worker is: slot `slot` of `jobs`.
        env = {**child.environment(), **placement.Placement(slot, jobs).env()}
        self.proc = subprocess.Popen(cmd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env)
        self.build: Optional[Build] = None
        self.backend: Optional[str] = None
        self.began = 0.0

    def send(self, build: Build) -> bool:
        """False where the process has ended already (its end is read next)."""
        self.build, self.backend, self.began = build, build.backend, time.monotonic()
        try:
            self.proc.stdin.write(json.dumps(dict(backend=build.backend, mode=build.case.mode.value,
                                                  case=build.case.name, exec=build.exec_.value)) + "\n")
            self.proc.stdin.flush()
            return True
        except BrokenPipeError:
            self.build = None
            return False

    def stop(self) -> None:
        """No more builds: it ends once its input does."""
        self.build = None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def ended(self) -> str:
        """Why its build has no verdict: how its process ended and the last line it wrote on stderr."""
        code = self.proc.wait()
        self.stderr.seek(0)
        ended = child.Ended(code, "", self.stderr.read())
        self.stderr.close()
        return f"its process ended with no verdict, {ended.death(1)[:300]}"


def next_build(backend: Optional[str], pending: List[Build], working: Dict[str, int]) -> Build:
    """The next build (taken from `pending`) of a process that last ran `backend`: one of that
    backend where one is left (its backend is loaded); else one of the backend with the most
    builds left per process on it (`working`: processes per backend, this one left out), so that
    processes done with quick backends help with the slow ones (FlashInfer's builds compile for
    minutes each) rather than leave them to the few that began there."""
    same = [i for i, b in enumerate(pending) if b.backend == backend]
    if not same:
        left = collections.Counter(b.backend for b in pending)
        busiest = max(left, key=lambda name: left[name] / (working.get(name, 0) + 1))
        same = [i for i, b in enumerate(pending) if b.backend == busiest]
    return pending.pop(same[0])


def warmup(todo: Sequence[Build], jobs: int, catalog_target: Optional[str], timeout: float, out=sys.stdout,
           quiet_s: float = QUIET_S) -> List[Build]:
    """Runs `todo` in up to `jobs` processes at once; prints a line per finished build, and one
    naming the longest-running builds after every `quiet_s` with none finished; the builds
    whose process ended without a verdict (lost: what they compiled may not be in the caches)."""
    start = last_line = time.monotonic()
    jobs = min(jobs, len(todo))
    print(f"warmup: {len(todo)} kernel variants, {jobs} processes", file=out, flush=True)
    pending, done, lost, started, compiled = _interleaved(todo), 0, [], 0, 0
    free_slots = list(range(jobs))
    selector = selectors.DefaultSelector()

    def report(build: Build, said: str, began: float) -> None:
        nonlocal done, last_line
        done, last_line = done + 1, time.monotonic()
        print(f"{bar(done, len(todo))} {build.what}: {said}, {last_line - began:.1f} s", file=out, flush=True)

    def give(process: _Process, build: Build) -> None:
        if not process.send(build):
            pending.insert(0, build)

    while pending or selector.get_map():
        while pending and free_slots:
            process = _Process(free_slots.pop(0), jobs, catalog_target, timeout)
            started += 1
            selector.register(process.proc.stdout, selectors.EVENT_READ, process)
            give(process, pending.pop(0))
        for key, _ in selector.select(timeout=1.0):
            process: _Process = key.data
            line = process.proc.stdout.readline()
            if line:
                reply = json.loads(line)
                compiled += reply["compiles"]
                report(process.build, reply["verdict"] + (f", {reply['compiles']} compiled" if reply["compiles"] else ""),
                       process.began)
                if pending and not reply["device_lost"]:  # a faulted device stays faulted in its process
                    working = collections.Counter(other.data.backend for other in selector.get_map().values()
                                                  if other.data is not process)
                    give(process, next_build(process.backend, pending, working))
                else:
                    process.stop()
                continue
            selector.unregister(process.proc.stdout)
            free_slots.append(process.slot)
            why = process.ended()
            if process.build is not None:
                lost.append(process.build)
                report(process.build, why, process.began)
        now = time.monotonic()
        if now - last_line >= quiet_s:
            running = sorted((key.data for key in selector.get_map().values() if key.data.build), key=lambda p: p.began)
            if running:
                print(f"warmup: {done}/{len(todo)} done, still building {len(running)}: "
                      + "; ".join(f"{p.build.what} {now - p.began:.0f} s" for p in running[:3]), file=out, flush=True)
            last_line = now
    print(f"warmup: done in {time.monotonic() - start:.1f} s, {started} processes, {compiled} compiles"
          + ("" if compiled else " (every kernel came from the caches)"), file=out, flush=True)
    return lost


def serve(catalog_target: Optional[str], timeout: float) -> None:
    """A warmup process: runs each build read from stdin, in this process, and writes its verdict
    as a line on stdout. What the backends print goes to stderr, not into those lines."""
    placed = placement.Placement.of_this_process()
    placed.place()  # before any CUDA call
    import torch

    from kit.harness.runner import run_case  # the backends' registry: in a warmup process only

    if "OMP_NUM_THREADS" not in os.environ:  # its share of the cores, as a session's worker's
        torch.set_num_threads(placed.threads(torch.get_num_threads()))

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    catalog = load_catalog(catalog_target)
    for line in sys.stdin:
        build = json.loads(line)
        case = catalog.find_case(parse_mode(build["mode"]), build["case"])
        before = spend.snapshot()
        result = run_case(build["backend"], case, parse_exec(build["exec"]), catalog=catalog_target, timeout=timeout)
        replies.write(json.dumps(dict(verdict=result.verdict, device_lost=bool(result.device_lost),
                                      compiles=spend.compiles(spend.since(before)))) + "\n")
        if result.device_lost:
            return


def default_jobs() -> int:
    return placement.cores()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m kit.warmup",
                                     description="one warmup process (`python -m kit warmup` starts them)")
    parser.add_argument("--cases", default=None)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args()
    serve(args.cases, args.timeout)
