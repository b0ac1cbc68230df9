"""kit.harness.step_graph on its CUDA path, torch.cuda's graph calls stood in for on the CPU: the
step's capture compiles nothing, as the batch graphs' captures (kit.harness.graph)."""
import contextlib

import pytest
import torch

from kit.harness import compiles, step_graph
from kit.harness.compiles import CompiledInCapture


@pytest.fixture
def cuda_calls(monkeypatch):
    """torch.cuda's stream and graph calls as no-ops: the program runs where the capture would."""
    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        def replay(self):
            pass
    for name, value in (("Stream", Stream), ("stream", lambda s: contextlib.nullcontext()),
                        ("current_stream", Stream), ("CUDAGraph", Graph),
                        ("graph", lambda g: contextlib.nullcontext()), ("synchronize", lambda: None)):
        monkeypatch.setattr(torch.cuda, name, value)


def _program_compiling_at(call: int, monkeypatch):
    """A program whose `call`-th run begins a torch.compile (as the compile counter sees it)."""
    begun, runs = [0], [0]
    monkeypatch.setattr(compiles, "_compiles_begun", lambda: begun[0])

    def program():
        runs[0] += 1
        if runs[0] == call:
            begun[0] += 1
        return torch.zeros(1)
    return program


def test_a_compile_at_the_warm_up_is_the_warm_ups(cuda_calls, monkeypatch):
    out = step_graph.graphed(True, lambda: None, None, _program_compiling_at(1, monkeypatch), lambda: None)
    assert torch.equal(out, torch.zeros(1))


def test_a_compile_inside_the_steps_capture_is_reported(cuda_calls, monkeypatch):
    """Planted: the captured run compiles (its warm-up did not call the backend as the capture does)."""
    with pytest.raises(CompiledInCapture, match=r"compiled 1 function\(s\) inside the capture of the step's graph"):
        step_graph.graphed(True, lambda: None, None, _program_compiling_at(2, monkeypatch), lambda: None)
