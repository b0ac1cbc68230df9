"""Which device a worker process runs on, and its share of the cores: with several GPUs, workers
are spread over them round robin by worker number (worker 0 on GPU 0, worker 1 on GPU 1, ...), so
that the matrix scales with the GPUs and each GPU's memory is shared by its own workers alone.

A process learns its slot once (`Placement`): a pytest-xdist worker from xdist's variables, a
warmup process from the placement its parent hands it (PLACEMENT_ENV). Everything else is a pure
function of the slot, the worker count and the GPUs."""
from __future__ import annotations

import dataclasses
import os
from typing import List, Optional

PLACED = "KIT_WORKER_GPU"  # "<index>/<count>": the GPU this process was placed on, of how many
PLACEMENT_ENV = "KIT_PLACEMENT"  # "<worker>/<workers>": a slot handed to a process the kit starts


def worker_number(worker_id: Optional[str]) -> Optional[int]:
    """0 for xdist's `gw0`, ...; None outside xdist."""
    if not worker_id or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    return int(worker_id[2:])


def device_of(worker: int, devices: int) -> int:
    return worker % max(1, devices)


def workers_on(device: int, workers: int, devices: int) -> int:
    """How many of `workers` share `device` (at least 1: this process)."""
    devices = max(1, devices)
    return max(1, workers // devices + (device < workers % devices))


# Compilers that start parallel jobs of their own size them from these (FlashInfer's JIT runs ninja
# with MAX_JOBS, else two more jobs than cores; inductor's compile workers): unnamed, every process
# of the kit's would start one per core.
COMPILE_JOBS = ("MAX_JOBS", "TORCHINDUCTOR_COMPILE_THREADS")


def cores() -> int:
    """The cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def threads_per_worker(threads: int, workers: int) -> int:
    """A worker's share of torch's threads (its default: one per core)."""
    return max(1, threads // workers)


def gpus_here() -> List[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (its list where set, else
    one per GPU the NVIDIA driver lists), without making a CUDA context."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def visible_for(worker: int, gpus: List[str]) -> Optional[str]:
    """The CUDA_VISIBLE_DEVICES of worker number `worker`: one GPU of `gpus`, round robin; None
    where there is at most one (nothing to spread)."""
    return gpus[device_of(worker, len(gpus))] if len(gpus) > 1 else None


@dataclasses.dataclass(frozen=True)
class Placement:
    """This process's slot among the kit's worker processes (None: it is not one of them)."""

    worker: Optional[int]
    workers: int = 1

    @classmethod
    def of_this_process(cls) -> "Placement":
        """The slot a parent handed this process (PLACEMENT_ENV), else xdist's, else none."""
        handed = os.environ.get(PLACEMENT_ENV)
        if handed:
            worker, _, workers = handed.partition("/")
            return cls(int(worker), max(1, int(workers)))
        return cls(worker_number(os.environ.get("PYTEST_XDIST_WORKER")),
                   max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

    def env(self) -> dict:
        """The variables that hand this slot to a child process."""
        return {PLACEMENT_ENV: f"{self.worker}/{self.workers}"}

    def threads(self, threads: int) -> int:
        return threads_per_worker(threads, self.workers)

    def place(self) -> None:
        """Before any CUDA call: the process sees one GPU, its own (every library then uses that
        one as device 0), and kit.process.budget splits that GPU between its workers alone. A
        worker's compilers run its share of the cores' jobs, unless their variables say otherwise."""
        if self.worker is not None:
            for name in COMPILE_JOBS:
                os.environ.setdefault(name, str(threads_per_worker(cores(), self.workers)))
        gpus = gpus_here()
        visible = None if self.worker is None else visible_for(self.worker, gpus)
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
            os.environ[PLACED] = f"{device_of(self.worker, len(gpus))}/{len(gpus)}"


def worker_count() -> int:
    return Placement.of_this_process().workers


def place_this_worker() -> None:
    Placement.of_this_process().place()


def my_gpu() -> tuple:
    """(index, count) of the GPU this process was placed on; (0, 1) where it was not."""
    placed = os.environ.get(PLACED, "0/1").split("/")
    return int(placed[0]), int(placed[1])
