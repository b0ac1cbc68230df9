"""The checks a run is judged by, each with ok / describe() and its failure class:
output against the float64 golden, the KV pool after the call, padded rows of a
replay (kit/guard.py adds writes past a backend allocation). kit/judge.py
combines them into a verdict.

Each check says what a failure means: `failure_class` when it is the run's own
verdict, `graph_class` when a replay fails it but the same batch run eagerly is
right. `quiet` checks are named in messages only when they fail; `replay_only`
checks have no eager counterpart to diagnose a failure with.

Output rule (error ratio, as PyTorch's flex-attention tests): the backend's max
error against the float64 golden may not exceed RATIO x the error of a
same-dtype reference computation, plus an absolute floor per dtype.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Dict, List, Sequence, Tuple

import torch

from kit.record import GRAPH, KERNEL, KV_WRITE

RATIO = 2.0
ABS_FLOOR = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclasses.dataclass
class OutputCheck:
    failure_class: ClassVar[str] = KERNEL
    graph_class: ClassVar[str] = GRAPH
    quiet: ClassVar[bool] = False
    replay_only: ClassVar[bool] = False
    ok: bool
    max_err: float
    ref_err: float
    tol: float
    bad_rows: List[int]  # token rows past tolerance (first few)
    nonfinite_rows: int
    problem: str = ""  # output unusable as such (wrong shape)
    label: str = ""  # which output, e.g. "layer 0 "

    def describe(self) -> str:
        what = f"{self.label}output"
        if self.problem:
            return f"{what} wrong: {self.problem}"
        if self.ok:
            return f"{what} ok: max err {self.max_err:.3g} <= tol {self.tol:.3g}"
        parts = [f"{what} wrong: max err {self.max_err:.3g} > tol {self.tol:.3g}"]
        if self.nonfinite_rows:
            parts.append(f"{self.nonfinite_rows} rows NaN/inf (unwritten?)")
        parts.append(f"bad token rows {self.bad_rows}")
        return "; ".join(parts)


def check_output(out: torch.Tensor, golden: torch.Tensor, same_dtype_ref: torch.Tensor,
                 dtype: torch.dtype, label: str = "") -> OutputCheck:
    if tuple(out.shape) != tuple(golden.shape):
        return OutputCheck(False, float("inf"), 0.0, 0.0, [], 0, label=label,
                           problem=f"shape {tuple(out.shape)}, expected {tuple(golden.shape)}")
    err = (out.to(torch.float64) - golden).abs()
    ref_err = (same_dtype_ref.to(torch.float64) - golden).abs().max().item() if golden.numel() else 0.0
    tol = RATIO * ref_err + ABS_FLOOR[dtype]
    row_err = err.flatten(1).amax(dim=1).nan_to_num(nan=float("inf"))
    bad = (row_err > tol).nonzero().squeeze(1)
    nonfinite = int((~torch.isfinite(out.flatten(1))).any(dim=1).sum().item())
    max_err = row_err.max().item() if row_err.numel() else 0.0
    return OutputCheck(bad.numel() == 0, max_err, ref_err, tol, bad[:8].tolist(), nonfinite, label=label)


@dataclasses.dataclass
class PaddingCheck:
    failure_class: ClassVar[str] = GRAPH
    graph_class: ClassVar[str] = GRAPH
    quiet: ClassVar[bool] = True
    replay_only: ClassVar[bool] = True  # eager runs have no padded rows
    ok: bool
    num_rows: int
    nonfinite_rows: List[int]  # padded rows (counted from the first padded one) holding NaN/inf, first few

    def describe(self) -> str:
        if self.ok:
            return f"{self.num_rows} padded rows finite"
        return (f"padded rows not finite: {len(self.nonfinite_rows)} of {self.num_rows} hold NaN/inf, e.g. "
                f"{self.nonfinite_rows[:8]} (unwritten or divided by zero?)")


def check_padding(padded: Sequence[torch.Tensor]) -> PaddingCheck:
    """Padded rows (of each layer's output, counted across them) are compared to nothing,
    but must be finite: the rest of the model runs on them too, and a NaN there reaches
    collectives and MoE routing."""
    bad, start = [], 0
    for out in padded:
        bad += [start + i for i in (~torch.isfinite(out.flatten(1))).any(dim=1).nonzero().squeeze(1).tolist()]
        start += out.shape[0]
    return PaddingCheck(not bad, start, bad)


@dataclasses.dataclass
class StateCheck:
    failure_class: ClassVar[str] = GRAPH
    graph_class: ClassVar[str] = GRAPH
    quiet: ClassVar[bool] = True
    replay_only: ClassVar[bool] = True  # eager runs capture nothing
    ok: bool
    replaced: List[str]  # backend attributes holding another tensor than when the graph was captured

    def describe(self) -> str:
        if self.ok:
            return "captured tensors kept"
        return (f"the replay hooks replaced tensors the captured graph reads instead of refilling them in "
                f"place: {', '.join(self.replaced[:4])} (a real graph keeps reading the old ones)")


def check_state(replaced: List[str]) -> StateCheck:
    return StateCheck(not replaced, list(replaced))


@dataclasses.dataclass
class KVCheck:
    failure_class: ClassVar[str] = KV_WRITE
    graph_class: ClassVar[str] = KV_WRITE
    quiet: ClassVar[bool] = False
    replay_only: ClassVar[bool] = False
    ok: bool
    missing: List[Tuple[int, int]]  # (layer, slot) that should hold the new K/V but do not (first few)
    collateral: List[int]  # slots changed that no real row owns (first few)
    num_missing: int
    num_collateral: int

    def describe(self) -> str:
        if self.ok:
            return "kv pool ok"
        parts = []
        if self.num_missing:
            parts.append(f"{self.num_missing} new-token slots not written correctly, e.g. {self.missing} (layer, slot)")
        if self.num_collateral:
            parts.append(f"{self.num_collateral} stray writes, e.g. slots {self.collateral} (layer, slot)")
        return "kv pool wrong: " + "; ".join(parts)


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-slot bitwise difference (NaN-safe)."""
    a = a.flatten(1).view(torch.int16 if a.element_size() == 2 else torch.int32)
    b = b.flatten(1).view(torch.int16 if b.element_size() == 2 else torch.int32)
    return (a != b).any(dim=1)


def check_kv(pool, before_k: Sequence[torch.Tensor], before_v: Sequence[torch.Tensor], loc: torch.Tensor,
             writes: Dict[int, Tuple[torch.Tensor, torch.Tensor]]) -> KVCheck:
    """Each layer's new k/v (`writes`: layer_id -> (k, v)) must sit at `loc`; nothing else
    may change but scratch slot 0."""
    loc = loc.to(torch.int64)
    missing: List[Tuple[int, int]] = []
    num_missing = 0
    collateral, num_collateral = [], 0
    for lid, (exp_k, exp_v) in enumerate(zip(before_k, before_v)):
        written = torch.zeros(exp_k.shape[0], dtype=torch.bool, device=exp_k.device)
        if lid in writes:
            exp_k, exp_v = exp_k.clone(), exp_v.clone()
            exp_k[loc] = writes[lid][0].to(exp_k.dtype)
            exp_v[loc] = writes[lid][1].to(exp_v.dtype)
            written[loc] = True
        diff = _differs(pool.k_buffer[lid], exp_k) | _differs(pool.v_buffer[lid], exp_v)
        diff[0] = False
        lost = (diff & written).nonzero().squeeze(1)
        missing += [(lid, s) for s in lost[:8].tolist()]
        num_missing += lost.numel()
        stray = (diff & ~written).nonzero().squeeze(1)
        collateral += [(lid, s) for s in stray[:8].tolist()]
        num_collateral += stray.numel()
    ok = num_missing == 0 and num_collateral == 0
    return KVCheck(ok, missing[:8], collateral[:8], num_missing, num_collateral)
