"""Backends that take their own process down (SIGKILL, abort, segfault: as a killed worker,
a native crash or a lost device do), or report a sticky device fault, at one stage, on the victim case of the tiny catalog
of tests.toys.tiny only (the only case of its head_dim); every other run passes.
`python -m pytest ... --cases tests.toys.tiny:CATALOG --backend tests.toys.dying:<Class>`."""
from __future__ import annotations

import ctypes
import os
import signal

from tests.toys.dense import DenseGraphBackend
from tests.toys.tiny import VICTIM_HEAD_DIM


def _sigkill():
    os.kill(os.getpid(), signal.SIGKILL)


def _segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def _fault():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")  # a sticky device fault, as reported


KILLS = {"sigkill": _sigkill, "abort": os.abort, "segfault": _segfault, "fault": _fault}


class _Dies(DenseGraphBackend):
    """toy_dense, except that `stage` kills the process with `kill` on the victim case."""

    stage = ""
    kill = "sigkill"

    def _maybe_die(self, stage: str, head_dim: int) -> None:
        if stage == self.stage and head_dim == VICTIM_HEAD_DIM:
            KILLS[self.kill]()

    def __init__(self, ctx):
        self._maybe_die("construction", ctx.layers[-1].head_dim)
        super().__init__(ctx)
        self._head_dim = ctx.layers[-1].head_dim

    def init_forward_metadata(self, batch) -> None:
        self._maybe_die("metadata", self._head_dim)
        super().init_forward_metadata(batch)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        self._maybe_die("forward", layer.head_dim)
        return super().forward(q, k, v, layer, batch, save_kv_cache)

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs) -> None:
        self._maybe_die("capture", self._head_dim)
        super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs) -> None:
        self._maybe_die("replay", self._head_dim)
        super().init_forward_metadata_replay_cuda_graph(*args, **kwargs)


def _dies(stage: str, kill: str) -> type:
    return type(f"Dies{stage.title()}{kill.title()}", (_Dies,),
                {"name": f"toy_dies_{stage}_{kill}", "stage": stage, "kill": kill, "__module__": __name__})


DiesConstructionSigkill = _dies("construction", "sigkill")
DiesMetadataAbort = _dies("metadata", "abort")
DiesForwardSegfault = _dies("forward", "segfault")
DiesCaptureSigkill = _dies("capture", "sigkill")
DiesReplayAbort = _dies("replay", "abort")
DiesForwardFault = _dies("forward", "fault")  # the process lives on, its device lost
