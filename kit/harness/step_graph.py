"""One step of a recurrent or hybrid model run as a graph runner runs it: the metadata outside the
graph, the step's program (every layer's forward) captured, the pools refilled as before the step,
the graph replayed; the replay's outputs are judged. On CUDA a torch.cuda.CUDAGraph after a warm-up
run on a side stream; without CUDA the same calls run eagerly (metadata, program, refill, metadata,
program) on the same instance, so CPU runs take the same path."""
from __future__ import annotations

from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def graphed(on_cuda: bool, metadata: Callable[[], None], program: Callable[[], T], refill: Callable[[], None]) -> T:
    """The replay's result of `program` (what its capture returned, filled by the replay)."""
    if not on_cuda:
        metadata()
        program()
        refill()
        metadata()
        return program()
    metadata()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        program()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = program()
    refill()
    graph.replay()
    torch.cuda.synchronize()
    return outs
