"""Out of device memory: in the kit's own allocations it is no verdict on the backend (the kit
releases what it keeps and retries once, else records an environment error); inside the
backend's code it is the backend's crash."""
import json
import subprocess
import sys

import pytest
import torch

import kit.harness.memory_retry as memory_retry
from cases import CATALOG as catalog
from kit.engine.fixture import Fixture
from kit.harness import guard
from tests.helpers import count_calls
from kit.modes import Exec, ForwardMode
from kit.report.record import CRASH, ENVIRONMENT, ERROR, FAIL, PASS
from kit.harness.runner import run_case
from tests.test_matrix import REPO
from tests.toys.kit_out_of_memory import raising_in_torch

CASE = catalog.find_case(ForwardMode.DECODE, "mqa_p1_shuf")
TOYS = "tests.toys.crashing"


@pytest.fixture
def releases(monkeypatch):
    return count_calls(monkeypatch, memory_retry, "release")


@pytest.mark.parametrize("exec_", [Exec.EAGER, Exec.GRAPH])
def test_kit_out_of_memory_once_is_released_and_retried(monkeypatch, releases, exec_):
    """Installing a batch in the pool (the kit's, before every program) runs out of memory once: the
    run is run again from the start after the kit released what it keeps, and judged as usual."""
    install, calls = raising_in_torch(Fixture.install, times=1)
    monkeypatch.setattr(Fixture, "install", install)
    r = run_case("tests.toys.dense:DenseGraphBackend", CASE, exec_)
    assert (r.outcome, r.failure_class, r.message) == (PASS, None, ""), r.message
    assert len(calls) > 1 and releases == [1]


def test_kit_out_of_memory_twice_is_an_environment_error(monkeypatch, releases):
    install, _ = raising_in_torch(Fixture.install, times=2)
    monkeypatch.setattr(Fixture, "install", install)
    r = run_case("torch_native", CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (ERROR, ENVIRONMENT), r
    assert "out of device memory in the kit's own allocations" in r.message and "not a verdict" in r.message
    assert "kit/harness/runner.py" in r.message, r.message  # where the kit asked for it
    assert releases == [1]


def test_kit_out_of_memory_inside_a_backend_call_is_still_the_kits(monkeypatch, releases):
    """The graph harness's own buffers, allocated while it calls the backend's hooks."""
    from kit.harness import static
    full, _ = raising_in_torch(torch.full, times=10 ** 6)

    class TorchOfTheHarness:  # torch as kit.harness.static (the graph's static buffers) sees it, its full planted
        def __getattr__(self, name):
            return full if name == "full" else getattr(torch, name)
    monkeypatch.setattr(static, "torch", TorchOfTheHarness())
    r = run_case("tests.toys.dense:DenseGraphBackend", CASE, Exec.GRAPH)
    assert (r.outcome, r.failure_class) == (ERROR, ENVIRONMENT), r.message
    assert "kit/harness/static.py" in r.message and releases == [1]


def test_out_of_memory_in_the_backends_forward_is_its_crash(releases):
    r = run_case(f"{TOYS}:OutOfMemoryBackend", CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH), r
    assert r.message.startswith("forward (layer 0): OutOfMemoryError: CUDA out of memory") and not releases


def test_out_of_memory_in_the_backends_forward_on_a_shared_gpu_is_retried_once_released(monkeypatch, releases):
    """On a GPU shared with other workers each process's allocator is capped at its share, which
    what the kit keeps counts against: the backend's run is tried again once that is released,
    and stays the backend's crash if it runs out again."""
    from kit.process import budget
    monkeypatch.setattr(budget, "gpu_shared", lambda device: True)
    r = run_case(f"{TOYS}:OutOfMemoryBackend", CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH), r
    assert r.message.startswith("forward (layer 0): OutOfMemoryError: CUDA out of memory") and releases == [1]


def test_out_of_memory_again_on_a_shared_gpu_within_the_processs_share_is_no_verdict(monkeypatch, releases):
    """Other processes filled the GPU (SGLang's Mamba2 EXTEND asked for 46 MiB with 7 MiB of 140 GiB
    free, beside 15 workers): where the process held no more than its share, the memory was theirs,
    and the run is an environment error to run again, not the backend's crash."""
    from kit.process import budget
    monkeypatch.setattr(budget, "gpu_shared", lambda device: True)
    monkeypatch.setattr(budget, "crowded_out", lambda device: "this process held 1.0 GiB, within its share")
    r = run_case(f"{TOYS}:OutOfMemoryBackend", CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (ERROR, ENVIRONMENT), r
    assert r.message.startswith("forward (layer 0): OutOfMemoryError: CUDA out of memory"), r.message
    assert "within its share: the others held the rest" in r.message and "not a verdict" in r.message
    assert releases == [1]


@pytest.mark.parametrize("held_gib, crowded", [(1, True), (3, False)])
def test_a_process_is_crowded_out_only_within_its_share(monkeypatch, held_gib, crowded):
    from kit.process import budget
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: held_gib << 30)
    monkeypatch.setattr(budget, "share", lambda device: 2 << 30)
    monkeypatch.setattr(budget, "free_now", lambda device: 7 << 20)
    said = budget.crowded_out(torch.device("cuda", 0))
    assert bool(said) is crowded
    assert not crowded or said == "this process held 1.0 GiB, within its share of 2.0 GiB, and the device had 7 MiB free"


def test_tritons_out_of_memory_on_a_shared_gpu_is_out_of_memory_too(monkeypatch, releases):
    """Triton's launcher says `Triton Error [CUDA]: out of memory` in a RuntimeError: on a GPU its
    workers share, that is memory the others hold, retried once released as torch's own error is."""
    from kit.process import budget
    monkeypatch.setattr(budget, "gpu_shared", lambda device: True)
    r = run_case(f"{TOYS}:TritonOutOfMemoryBackend", CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH), r
    assert "Triton Error [CUDA]: out of memory" in r.message and releases == [1]


def test_out_of_memory_in_an_allocation_the_guard_makes_for_the_backend_is_its_crash(monkeypatch, releases):
    """The guard allocates each tensor a backend asks for (plus its canary): out of memory there is
    the backend's allocation failing."""
    fill, _ = raising_in_torch(guard._fill, times=10 ** 6)
    monkeypatch.setattr(guard, "_fill", fill)
    r = run_case("torch_native", CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH), r
    assert "OutOfMemoryError" in r.message and not releases


def test_an_environment_error_fails_the_session_and_is_recorded(tmp_path):
    """Under pytest the run is no pass: its test fails, naming the class; the record keeps it."""
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-p", "no:cacheprovider",
                           "-q", "-p", "tests.toys.kit_out_of_memory", "--backend", "torch_native", "--mode",
                           "decode", "--exec", "eager", "--case-set", "smoke", "-k", CASE.name,
                           "--results-json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "1 failed" in proc.stdout and "[environment]" in proc.stdout, proc.stdout[-2000:]
    doc = json.loads(out.read_text())
    assert [(r["outcome"], r["failure_class"]) for r in doc["records"]] == [(ERROR, ENVIRONMENT)]
    assert doc["run"]["status"] == "complete"
