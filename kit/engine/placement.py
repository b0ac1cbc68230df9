"""Which device a pytest-xdist worker (or a warmup process) runs on, and its share of the
cores: with several GPUs, workers are spread over them round robin by worker number (gw0 on
GPU 0, gw1 on GPU 1, ...), so that the matrix scales with the GPUs and each GPU's memory is
shared by its own workers alone. Pure functions of the worker's number, the worker count and
the device count."""
from __future__ import annotations

import os
from typing import Optional

PLACED = "KIT_WORKER_GPU"  # "<index>/<count>": the GPU this worker was placed on, of how many


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


def this_worker() -> Optional[int]:
    return worker_number(os.environ.get("PYTEST_XDIST_WORKER"))


def threads_per_worker(threads: int, workers: int) -> int:
    """A worker's share of torch's threads (its default: one per core)."""
    return max(1, threads // workers)


def worker_count() -> int:
    return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def gpus_here() -> list:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (its list where set, else
    one per GPU the NVIDIA driver lists), without making a CUDA context."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def visible_for(worker: int, gpus: list) -> Optional[str]:
    """The CUDA_VISIBLE_DEVICES of worker number `worker`: one GPU of `gpus`, round robin; None
    where there is at most one (nothing to spread)."""
    return gpus[device_of(worker, len(gpus))] if len(gpus) > 1 else None


def place_this_worker() -> None:
    """Before any CUDA call of an xdist worker: it sees one GPU, its own (every library then uses
    that one as device 0), and kit.engine.budget splits that GPU between its workers alone."""
    worker, gpus = this_worker(), gpus_here()
    visible = None if worker is None else visible_for(worker, gpus)
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
        os.environ[PLACED] = f"{device_of(worker, len(gpus))}/{len(gpus)}"


def my_gpu() -> tuple:
    """(index, count) of the GPU this process was placed on; (0, 1) where it was not."""
    placed = os.environ.get(PLACED, "0/1").split("/")
    return int(placed[0]), int(placed[1])
