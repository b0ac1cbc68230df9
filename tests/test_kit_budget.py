"""The kit's memory on a shared device: each process's share of its GPU (what was free at start,
split between the session's workers on that GPU), workers spread over a host's GPUs, what is kept
released when a worker moves to another backend, and a new pool made only where it fits."""
import pytest
import torch

import kit.process.memory as memory
from cases import CATALOG as catalog
from kit.process import budget, placement
from kit.engine.fixture import fixtures_for
from kit.harness.runner import run_case
from tests.helpers import count_calls
from kit.modes import Exec, ForwardMode
from kit.engine.profile import SGLANG

CASE = catalog.find_case(ForwardMode.DECODE, "mqa_p1_shuf")
GiB = 1 << 30


@pytest.mark.parametrize("workers, gpus", [(1, 1), (16, 1), (16, 2), (16, 3), (5, 8), (7, 2)])
def test_workers_are_spread_round_robin_and_counted_per_gpu(workers, gpus):
    on = [placement.device_of(w, gpus) for w in range(workers)]
    assert on == [w % gpus for w in range(workers)]
    assert [placement.workers_on(g, workers, gpus) for g in range(min(gpus, workers))] == \
        [on.count(g) for g in range(min(gpus, workers))]


def test_a_worker_sees_one_gpu_its_own(monkeypatch):
    monkeypatch.delenv(placement.PLACED, raising=False)
    for name in placement.COMPILE_JOBS:  # placing sets them; the test's process gets them back unset
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # the user's choice is kept: spread over those
    placement.place_this_worker()
    assert (placement.os.environ["CUDA_VISIBLE_DEVICES"], placement.my_gpu()) == ("5", (1, 2))
    monkeypatch.delenv(placement.PLACED)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # one GPU: nothing to spread
    placement.place_this_worker()
    assert (placement.os.environ["CUDA_VISIBLE_DEVICES"], placement.my_gpu()) == ("2", (0, 1))
    assert placement.worker_number("gw12") == 12 and placement.worker_number("master") is None


def test_a_workers_compilers_run_its_share_of_the_cores(monkeypatch):
    """32 cores, 8 workers: each worker's FlashInfer builds and inductor compiles run 4 jobs, not 32
    each (the warmup's processes are placed as workers are); a value the user named is kept, and a
    process that is no worker of the kit's is left alone."""
    monkeypatch.setattr(placement, "cores", lambda: 32)
    monkeypatch.setattr(placement, "gpus_here", lambda: [])
    for name in placement.COMPILE_JOBS:
        monkeypatch.delenv(name, raising=False)
    placement.Placement(None, 1).place()
    assert not any(name in placement.os.environ for name in placement.COMPILE_JOBS)
    monkeypatch.setenv("MAX_JOBS", "12")
    placement.Placement(3, 8).place()
    assert [placement.os.environ[name] for name in placement.COMPILE_JOBS] == ["12", "4"]


@pytest.mark.parametrize("workers, placed, share, kept", [
    (1, "0/1", 64 * GiB, 16 * GiB),  # alone: a quarter of its share kept for every backend
    (16, "0/1", 4 * GiB, 0),  # 16 workers on one GPU: a sixteenth each, nothing kept past the last few
    (16, "1/2", 8 * GiB, 0),  # two GPUs: eight workers on each
    (3, "0/2", 32 * GiB, 0),  # three workers on two GPUs: two share GPU 0
])
def test_the_share_is_what_was_free_split_between_the_workers_on_the_gpu(monkeypatch, workers, placed, share, kept):
    monkeypatch.setattr(budget, "_free_at_start", lambda device: 64 * GiB)  # other sessions' memory is not free
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.setenv(placement.PLACED, placed)
    cuda = torch.device("cuda", 0)
    assert (budget.share(cuda), budget.kept(cuda)) == (share, kept)


@pytest.fixture
def releases(monkeypatch):
    return count_calls(monkeypatch, memory, "release")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_sharing_its_gpu_releases_what_it_kept_when_it_moves_to_another_backend(monkeypatch, releases,
                                                                                       workers):
    monkeypatch.setattr(budget, "sharing", lambda device: workers)
    monkeypatch.setattr(memory, "_last_backend", [None])  # a fresh process
    for backend in ("torch_native", "torch_native", "tests.toys.dense:DenseGraphBackend"):
        run_case(backend, CASE, Exec.EAGER)
    assert len(releases) == (workers > 1)
    if workers > 1:
        assert not memory.STORE.batches._recent or len(memory.STORE.batches._recent) == 1


def test_a_new_pool_larger_than_what_is_free_is_made_after_a_release(monkeypatch, releases):
    memory.STORE.pools.clear()
    fixtures_for([CASE], "cpu", memory.STORE, SGLANG)
    queried = []
    monkeypatch.setattr(budget, "free_now", lambda device: queried.append(device) or 0)
    fixtures_for([CASE], "cpu", memory.STORE, SGLANG)  # the cached pool fits: nothing allocated, nothing released, nothing asked
    assert releases == [] and queried == []
    big = CASE.with_(name="big", prefix=(5000, 30, 1))
    fixtures_for([big], "cpu", memory.STORE, SGLANG)
    assert releases == [1]



@pytest.mark.parametrize("workers, cached, empties", [(1, 3 << 30, 0), (16, 3 << 30, 2), (16, 1 << 30, 0)])
def test_a_worker_sharing_its_gpu_hands_a_runs_peak_cached_back_after_it(monkeypatch, workers, cached, empties):
    """What a run's peak left cached in a worker's allocator, past a quarter of the worker's share,
    goes back to the device when the run ends, so that one worker's cache cannot run another out
    of memory; less stays cached for the next run; a process alone keeps it all."""
    calls = count_calls(monkeypatch, torch.cuda, "empty_cache")
    monkeypatch.setattr(budget, "sharing", lambda device: workers)  # a CPU device is never a shared GPU
    monkeypatch.setattr(budget, "share", lambda device: 8 << 30)
    monkeypatch.setattr(memory, "cached_unused", lambda device: cached)
    for _ in range(2):
        memory.after_run(torch.device("cuda", 0))
    memory.after_run(torch.device("cpu"))
    assert len(calls) == empties
