"""One run: backend x mode x exec x case -> RunResult (outcome, failure class, errors, repro)."""
from __future__ import annotations

import dataclasses
import shlex
import time
import traceback
from typing import List, Optional

import torch

from kit.case import Case
from kit.fixture import Fixture, fixtures_for
from kit.graph import BS_BUCKETS, BatchGraphs, ExtendGraphs, bucket_for, replay_schedule
from kit.guard import Guard
from kit.layer import Layer
from kit.modes import Exec, ForwardMode
from kit.nan_fill import nan_filled_allocations
from kit.pools import CASE_LAYER_ID, Pools
from kit.protocol import NO_CAPTURE_HOOKS, BackendContext, has_graph_hooks
from kit.reference import attention
from kit.registry import load_backend
from kit.verdicts import CRASH, GRAPH, KERNEL, KV_WRITE, check_kv, check_output, check_padding

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"


@dataclasses.dataclass
class RunResult:
    backend: str
    mode: str
    exec: str
    case: str
    dtype: str
    outcome: str
    failure_class: Optional[str] = None
    message: str = ""
    max_err: Optional[float] = None
    tol: Optional[float] = None
    exec_detail: str = ""  # eager | cuda-graph | emulated | piecewise-eager
    seconds: float = 0.0
    repro: str = ""
    isolated: bool = False  # ran in a subprocess (a quarantined known failure)
    device_lost: bool = False  # a sticky device fault: this process can run nothing more on the device

    @property
    def test_id(self) -> str:
        return run_id(self.backend, self.mode, self.exec, self.case)


def run_id(backend: str, mode: str, exec_: str, case: str) -> str:
    """The id of one run in test ids, messages and tables (case names hold no '-')."""
    return f"{backend}-{mode}-{exec_}-{case}"


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def repro_command(backend: str, mode: ForwardMode, exec_: Exec, case: Case) -> str:
    return "python -m kit run " + " ".join(shlex.quote(a) for a in (
        "--backend", backend, "--mode", mode.value, "--exec", exec_.value, "--case", case.name))


# CUDA errors after which the context is unusable: every later call in the process fails too.
STICKY_DEVICE_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                        "misaligned address", "illegal instruction", "an illegal address")


class _Crash(Exception):
    """A backend raised (or the device faulted); carries where it happened."""

    def __init__(self, stage: str, exc: BaseException):
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        self.device_lost = any(e in str(exc) for e in STICKY_DEVICE_ERRORS)
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}{where}")


def _call(stage: str, fn, *args, **kwargs):
    try:
        result = fn(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # surface device faults here, not in the next case
        return result
    except Exception as exc:  # noqa: BLE001 - every backend error is a verdict
        raise _Crash(stage, exc) from exc


@dataclasses.dataclass
class _Judgement:
    output_ok: bool
    kv_ok: bool
    text: str
    max_err: float
    tol: float
    memory_ok: bool = True  # no write past the end of a tensor the backend allocated (eager only)

    @property
    def ok(self) -> bool:
        return self.output_ok and self.kv_ok and self.memory_ok


def _judge(fx: Fixture, out, before) -> _Judgement:
    if not isinstance(out, torch.Tensor):
        raise _Crash("forward", TypeError(f"forward returned {type(out).__name__}, not a tensor"))
    golden = attention(fx, torch.float64)
    same_dtype = attention(fx, fx.case.torch_dtype)
    o = check_output(out, golden, same_dtype, fx.case.torch_dtype)
    kv = check_kv(fx.pools.token_to_kv_pool, before[0], before[1], CASE_LAYER_ID,
                  fx.batch.out_cache_loc, fx.k_new, fx.v_new)
    return _Judgement(o.ok, kv.ok, f"{o.describe()}; {kv.describe()}", o.max_err, o.tol)


def _eager(backend, fx: Fixture, layer: Layer) -> _Judgement:
    fx.install()
    before = fx.pools.token_to_kv_pool.snapshot()
    guard = Guard()
    with guard.watching():
        _call("init_forward_metadata", backend.init_forward_metadata, fx.batch)
        with nan_filled_allocations():
            out = _call("forward", backend.forward, fx.q, fx.k_new, fx.v_new, layer, fx.batch)
    j = _judge(fx, out, before)
    memory = guard.check()
    if not memory.ok:
        j = dataclasses.replace(j, memory_ok=False, text=f"{j.text}; {memory.describe()}")
    return j


def _describe_replay(i: int, fixtures: List[Fixture]) -> str:
    bs = fixtures[i].batch.batch_size
    text = f"replay {i + 1}/{len(fixtures)} (bs={bs}"
    if fixtures[i].case.mode.has_fixed_tokens_per_request():
        text += f" in bucket {bucket_for(bs, BS_BUCKETS)}"
    else:
        text += f", {fixtures[i].plan.num_tokens} tokens"
    if i:
        text += f", after bs={fixtures[i - 1].batch.batch_size}"
    return text + ")"


def run_case(backend_spec: str, case: Case, exec_: Exec, device: Optional[torch.device] = None,
             label: Optional[str] = None) -> RunResult:
    device = device or default_device()
    label = label or backend_spec
    result = RunResult(backend=label, mode=case.mode.value, exec=exec_.value, case=case.name,
                       dtype=case.dtype, outcome=PASS,
                       repro=repro_command(backend_spec, case.mode, exec_, case))
    start = time.perf_counter()
    try:
        _run(backend_spec, case, exec_, device, result)
    except _Crash as crash:
        result.outcome, result.failure_class, result.message = FAIL, CRASH, str(crash)
        result.device_lost = crash.device_lost
    result.seconds = round(time.perf_counter() - start, 4)
    return result


def _run(backend_spec: str, case: Case, exec_: Exec, device, result: RunResult) -> None:
    cls = _call("loading backend", load_backend, backend_spec)
    reason = _call("supports()", cls.supports, case)
    if reason is None and exec_ is Exec.GRAPH and not has_graph_hooks(cls):
        reason = NO_CAPTURE_HOOKS
    if reason is not None:
        result.outcome, result.message = UNSUPPORTED, str(reason)
        return
    fixtures = fixtures_for([case] if exec_ is Exec.EAGER else replay_schedule(case), device)
    pools = fixtures[0].pools
    layer = Layer.for_case(case)

    def new_backend():
        return _call("constructing backend", cls, BackendContext.for_case(case, pools, device))

    backend = new_backend()
    if exec_ is Exec.EAGER:
        result.exec_detail = "eager"
        j = _eager(backend, fixtures[0], layer)
        result.max_err, result.tol = j.max_err, j.tol
        if not j.ok:
            result.outcome, result.message = FAIL, j.text
            result.failure_class = KV_WRITE if not j.kv_ok else KERNEL
        return
    _graph(backend, new_backend, fixtures, pools, layer, result)


def _graph(backend, new_backend, fixtures: List[Fixture], pools: Pools, layer: Layer, result: RunResult) -> None:
    case = fixtures[0].case
    max_bs = max(bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures)
    if case.mode.has_fixed_tokens_per_request():
        harness = _call("init_cuda_graph_state", BatchGraphs, backend, layer, pools, case.mode, case, max_bs)
        _call("capture", harness.capture_buckets, fixtures)
    else:
        max_tokens = max(fx.plan.num_tokens for fx in fixtures)
        harness = _call("init_cuda_graph_state", ExtendGraphs, backend, layer, pools, max_tokens, max_bs)
    result.exec_detail = harness.detail
    worst = 0.0
    for i, fx in enumerate(fixtures):
        _call("capture", harness.prepare, fx)
        fx.install()
        before = pools.token_to_kv_pool.snapshot()
        out, padded = _call(f"replay {i + 1}", harness.replay, fx)
        j = _judge(fx, out, before)
        worst = max(worst, j.max_err)
        result.tol = j.tol if result.tol is None else min(result.tol, j.tol)
        if j.ok:
            pad = check_padding(padded)
            if pad.ok:
                continue
            result.outcome, result.failure_class = FAIL, GRAPH  # eager runs have no padded rows
            result.message = f"{_describe_replay(i, fixtures)}: {j.text}; {pad.describe()} -> {GRAPH}"
            break
        # Diagnostic: the same batch run eagerly on a fresh backend says where to look.
        eager = _eager(new_backend(), fx, layer)
        if eager.ok:
            cls = KV_WRITE if not j.kv_ok else GRAPH
            verdict = f"eager on the same batch is right -> {cls}"
        else:
            cls = KV_WRITE if not eager.kv_ok else KERNEL
            verdict = f"eager on the same batch is wrong too ({eager.text}) -> {cls}"
        result.outcome, result.failure_class = FAIL, cls
        result.message = f"{_describe_replay(i, fixtures)}: {j.text}; {verdict}"
        break
    result.max_err = worst
