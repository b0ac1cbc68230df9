"""How the matrix is laid out: case by case (every backend's runs of a case in a row, so they share
its batches and references), grouped by mode and kernel variant, one worker per GPU under `-n auto`."""
import os
import subprocess
import sys
import types

import torch

from kit import pytest_plugin
from kit.record import parse_run_id
from kit.results import REPO


def _collected(*args):
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--co", "-q",
                           "-p", "no:cacheprovider", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [parse_run_id(line.split("[", 1)[1].rsplit("]", 1)[0]) for line in proc.stdout.splitlines()
            if "::test_conformance[" in line]


def test_every_backends_runs_of_a_case_follow_each_other():
    runs = _collected("--backend", "torch_native", "--backend", "triton", "--case-set", "smoke", "--mode", "decode")
    cases = [(mode, case) for _, mode, _, case in runs]
    blocks = [c for i, c in enumerate(cases) if i == 0 or cases[i - 1] != c]
    assert len(blocks) == len(set(cases)) > 1, "a case's runs are split"
    first = [(backend, exec_) for backend, mode, exec_, case in runs if (mode, case) == cases[0]]
    assert first == [("torch_native", "eager"), ("torch_native", "graph"), ("triton", "eager"), ("triton", "graph")]


def _config(*args, worker=None):
    return types.SimpleNamespace(args=list(args), **({"workerinput": {"workerid": worker}} if worker else {}))


def test_auto_workers_are_one_per_gpu_for_the_matrix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pytest_plugin.pytest_xdist_auto_num_workers(_config("tests/test_conformance.py")) == 2
    assert pytest_plugin.pytest_xdist_auto_num_workers(_config("tests/test_conformance.py::test_conformance")) == 2
    # the kit's own tests (host work mostly), or no CUDA: xdist's choice (None: the next hook's)
    assert pytest_plugin.pytest_xdist_auto_num_workers(_config("tests")) is None
    assert pytest_plugin.pytest_xdist_auto_num_workers(_config("tests/test_conformance.py", "tests/x.py")) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pytest_plugin.pytest_xdist_auto_num_workers(_config("tests/test_conformance.py")) is None


FAKE_ONE_GPU = ("import sys, torch, pytest\n"
                "torch.cuda.is_available = lambda: True\n"
                "torch.cuda.device_count = lambda: 1\n"
                "torch.cuda.get_device_name = lambda *a: 'fake GPU'\n"
                "sys.exit(pytest.main(sys.argv[1:]))\n")


def test_auto_workers_hook_wins_over_xdists_own():
    """End to end, in the controller: xdist's own hook would say 3 (its environment variable),
    the kit's says one per GPU, and the kit's is asked first."""
    proc = subprocess.run([sys.executable, "-c", FAKE_ONE_GPU, "-n", "auto", "tests/test_conformance.py",
                           "-p", "no:cacheprovider", "--backend", "torch_native", "--case-set", "smoke",
                           "--mode", "decode", "--exec", "eager"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTEST_XDIST_AUTO_NUM_WORKERS": "3"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "created: 1/1 worker" in proc.stdout, proc.stdout[:2000]


def test_each_worker_runs_on_its_own_gpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for worker in ("gw0", "gw1", "gw3"):
        pytest_plugin._worker_gpu(_config(worker=worker))
    pytest_plugin._worker_gpu(_config())  # not a worker: the default device
    assert chosen == [0, 1, 1]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    pytest_plugin._worker_gpu(_config(worker="gw2"))
    assert chosen == [0, 1, 1]  # one GPU: nothing to choose
