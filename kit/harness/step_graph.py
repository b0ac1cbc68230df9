"""One step of a recurrent or hybrid model run as a graph runner runs it: the metadata outside the
graph (`capture_metadata` before the capture; `replay_metadata` before the replay, where the
backend's hooks have one: else the capture's holds, the batch being the same), the step's program
(every layer's forward) captured, the pools refilled as before the step, the graph replayed; the
replay's outputs are judged. On CUDA a torch.cuda.CUDAGraph after a warm-up run on a side stream,
its capture compiling nothing (kit.harness.compiles.none_inside, as the batch graphs' captures);
without CUDA the same calls run eagerly (metadata, program, refill, metadata, program) on the same
instance, so CPU runs take the same path."""
from __future__ import annotations

from typing import Callable, Optional, TypeVar

import torch

from kit.harness import compiles

T = TypeVar("T")


def graphed(on_cuda: bool, capture_metadata: Callable[[], None], replay_metadata: Optional[Callable[[], None]],
            program: Callable[[], T], refill: Callable[[], None]) -> T:
    """The replay's result of `program` (what its capture returned, filled by the replay)."""
    capture_metadata()
    if not on_cuda:
        program()
        refill()
        (replay_metadata or capture_metadata)()
        return program()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        program()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with compiles.none_inside("the capture of the step's graph"), torch.cuda.graph(graph):
        outs = program()
    refill()
    if replay_metadata is not None:
        replay_metadata()
    graph.replay()
    torch.cuda.synchronize()
    return outs
