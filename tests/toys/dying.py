"""Backends that take their own process down (SIGKILL, abort, segfault: as a killed worker,
a native crash or a lost device do) at one stage, on the victim case of the tiny catalog
below only (its head_dim, 32, is the only one of that size); every other run passes.
`python -m pytest ... --cases tests.toys.dying:CATALOG --backend tests.toys.dying:<Class>`."""
from __future__ import annotations

import ctypes
import os
import signal

from kit.engine.case import MQA, Case
from kit.engine.catalog import Catalog
from kit.modes import ForwardMode
from tests.toys.dense import DenseGraphBackend

VICTIM_HEAD_DIM = 32


def _case(name: str, **kw) -> Case:
    return Case(name, ForwardMode.DECODE, **{"prefix": (4, 9), "heads": (4, 2), "head_dim": 16, "dtype": "fp32", **kw})


# Three kernel variants (so three groups per backend and exec under --dist loadgroup), the victim
# in the middle: runs before and after it go to the same worker.
SMOKE = [_case("first_a"), _case("first_b", prefix=(3, 5, 7)), _case("victim", head_dim=VICTIM_HEAD_DIM),
         _case("after_a", page=4), _case("after_b", page=4, heads=MQA, prefix=(6,))]
CATALOG = Catalog({ForwardMode.DECODE: {"smoke": SMOKE, "full": SMOKE}})


def _sigkill():
    os.kill(os.getpid(), signal.SIGKILL)


def _segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV


KILLS = {"sigkill": _sigkill, "abort": os.abort, "segfault": _segfault}


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
