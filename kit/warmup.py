"""python -m kit warmup: builds every kernel variant a selection will load, before any run.

A backend's first run of a kernel variant builds it (FlashInfer's JIT, Triton's compile: minutes
for FlashInfer on a fresh machine), and in a matrix session those builds land in the workers'
first runs, against their time limits. Warmup runs each distinct
(backend, mode, kernel variant) of the selection once (a backend derived from a registered one,
as a mutant is, counts as that one: it builds the same kernels), on its smallest case, each in a process of
its own (`python -m kit run`: a backend that takes its process down costs only that run), as
many at once as there are cores (`--jobs`); the builds land in the libraries' own on-disk caches,
which the matrix's workers then load. Progress is one plain line per finished build."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from kit.engine.case import Case
from kit.modes import Exec, ForwardMode

BAR = 24


@dataclass(frozen=True)
class Build:
    backend: str  # as given: a registered name or module:attr
    case: Case  # the smallest case of its (mode, kernel variant)
    exec_: Exec

    @property
    def what(self) -> str:
        return f"{self.backend} {self.case.mode.value} {self.case.kernel_variant} ({self.case.name})"


def _size(case: Case):
    return case.size, case.bs, case.name


def builds(backends: Sequence[str], modes: Sequence[ForwardMode], execs: Sequence[Exec], catalog,
           case_set: str, kernels_of: Callable[[str], str] = lambda spec: spec) -> List[Build]:
    """One build per backend whose kernels the selection runs (`kernels_of`), mode and kernel
    variant: its smallest case, eager where the selection runs eager (graph runs load the same
    kernels)."""
    exec_ = Exec.EAGER if Exec.EAGER in execs else execs[0]
    smallest: Dict[tuple, Case] = {}
    for backend in dict.fromkeys(kernels_of(spec) for spec in backends):
        for mode in modes:
            for case in catalog.cases(case_set, mode):
                key = (backend, mode, case.kernel_variant)
                if key not in smallest or _size(case) < _size(smallest[key]):
                    smallest[key] = case
    return [Build(backend, case, exec_) for (backend, _, _), case in smallest.items()]


def _command(build: Build, catalog_target: Optional[str], timeout: float) -> List[str]:
    cmd = [sys.executable, "-m", "kit", "run", "--backend", build.backend, "--mode", build.case.mode.value,
           "--exec", build.exec_.value, "--case", build.case.name, "--timeout", str(timeout), "--json"]
    return cmd + (["--cases", catalog_target] if catalog_target else [])


def _verdict(proc: subprocess.Popen, output) -> str:
    output.seek(0)
    out = output.read()
    output.close()
    try:
        record = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return f"its process ended with exit code {proc.returncode} and no verdict"
    return record["outcome"] + (f" [{record['failure_class']}]" if record.get("failure_class") else "")


def bar(done: int, total: int) -> str:
    filled = BAR * done // max(total, 1)
    return "[" + "#" * filled + "." * (BAR - filled) + f"] {done}/{total}"


def warmup(todo: Sequence[Build], jobs: int, catalog_target: Optional[str], timeout: float, out=sys.stdout) -> int:
    """Runs `todo`, `jobs` processes at once; prints a line per finished build; the number of
    builds whose process ended without a verdict."""
    start = time.monotonic()
    print(f"warmup: {len(todo)} kernel variants, {min(jobs, len(todo))} at once", file=out, flush=True)
    pending, running, done, lost = list(todo), {}, 0, 0
    while pending or running:
        while pending and len(running) < jobs:
            build = pending.pop(0)
            output = tempfile.TemporaryFile("w+")  # not a pipe: a chatty backend would fill it and wait
            proc = subprocess.Popen(_command(build, catalog_target, timeout), stdout=output,
                                    stderr=subprocess.DEVNULL, text=True)
            running[proc] = (build, output, time.monotonic())
        finished = [p for p in running if p.poll() is not None]
        if not finished:
            time.sleep(0.05)
            continue
        for proc in finished:
            build, output, began = running.pop(proc)
            verdict = _verdict(proc, output)
            lost += verdict.startswith("its process")
            done += 1
            print(f"{bar(done, len(todo))} {build.what}: {verdict}, {time.monotonic() - began:.1f} s",
                  file=out, flush=True)
    print(f"warmup: done in {time.monotonic() - start:.1f} s", file=out, flush=True)
    return lost


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
