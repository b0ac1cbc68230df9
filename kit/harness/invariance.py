"""Batch invariance: a request that recurs in a run's batches (kit.engine.variants: the case's
request again, at another position, beside other requests or alone, in another graph bucket) must
get the same output rows in each. A backend that declares itself batch invariant
(`batch_invariant = True`, as engines' deterministic modes promise) must give them bit for bit; any
other, within the output tolerance of the batch. The request's KV bytes need no comparison of their
own: the KV check holds them to the bytes of the known state in every batch.

A run keeps a `Recurrence`: each batch's verdict compares the rows of its requests seen in an
earlier batch of the run, and remembers those of the others."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Dict, List, Optional, Sequence

import torch

from kit.engine.plan import RequestData
from kit.harness.checks import Check, OutputCheck, Pending, bits
from kit.report.record import KERNEL


@dataclasses.dataclass
class InvarianceCheck(Check):
    """The rows of each recurring request against its first batch's. Its class is kernel, eager or
    replayed: the same batch alone shows nothing (no fresh instance or eager diagnosis tells more)."""

    graph_class: ClassVar[str] = KERNEL
    quiet: ClassVar[bool] = True
    alone: ClassVar[bool] = False
    exact: bool = True  # compared bit for bit (the backend declares batch_invariant), else within tolerance
    differences: List[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        if self.ok:
            return "recurring requests' rows the same as in their first batch"
        how = ("bit for bit (the backend declares batch_invariant)" if self.exact else
               "within the output tolerance (the backend does not declare batch_invariant)")
        return f"not batch invariant, its rows must match {how}: " + "; ".join(self.differences[:3])


@dataclasses.dataclass
class _Seen:
    where: str  # which batch of the run, as messages name it
    row: int  # its request index there
    rows: List[List[torch.Tensor]]  # per step, per layer: its output rows (copies)


@dataclasses.dataclass
class _Difference:
    request: int
    seen: _Seen
    step: int
    layer: int
    differing: int  # values not bit for bit the same
    total: int
    max_diff: float


def request_rows(fx, outs: Sequence[Sequence[torch.Tensor]], request: int) -> List[List[torch.Tensor]]:
    """Per step, per layer: the output rows of the fixture's request `request` (an index into its data;
    a draft decode's rows of it, one a lane, lie together)."""
    rows = []
    for step, step_outs in zip(fx.steps, outs):
        start, end = 0, None
        for r in step.plan.requests:
            if r.request == request:
                end = (start if end is None else end) + r.n_new
            elif end is None:
                start += r.n_new
        rows.append([out[start:end] for out in step_outs])
    return rows


class Recurrence:
    """The first rows of each request a run has seen, for the batches after it."""

    def __init__(self, exact: bool):
        self.exact = exact
        self.seen: Dict[RequestData, _Seen] = {}

    def figures(self, fx, outs: Sequence[Sequence[torch.Tensor]], where: str) -> Optional[Pending]:
        """The rows of fx's requests seen before against theirs (finishes to a list of _Difference, per
        step and layer); the others remembered. None where no request of fx was seen before."""
        pairs = []
        for i, data in enumerate(fx.plan.data):
            rows = request_rows(fx, outs, i)
            if data in self.seen:
                seen = self.seen[data]
                pairs += [(i, seen, s, l, a, b) for s, (first, now) in enumerate(zip(seen.rows, rows))
                          for l, (a, b) in enumerate(zip(first, now))]
            else:
                self.seen[data] = _Seen(where, i, [[r.clone() for r in step] for step in rows])
        if not pairs:
            return None
        figures = torch.stack([torch.stack([(bits(a) != bits(b)).sum().double(),
                                            (a.double() - b.double()).abs().nan_to_num(nan=float("inf")).amax()
                                            if a.numel() else a.new_zeros((), dtype=torch.float64)])
                               for _, _, _, _, a, b in pairs])

        def finish(values: List[float]) -> List[_Difference]:
            return [_Difference(i, seen, s, l, int(values[2 * k]), a.numel(), values[2 * k + 1])
                    for k, (i, seen, s, l, a, _) in enumerate(pairs)]
        return Pending(figures.flatten(), finish)

    def check(self, differences: List[_Difference], outputs: Sequence[OutputCheck], layers: int,
              many_steps: bool) -> InvarianceCheck:
        """The verdict on `differences`; outside bit-for-bit, each against its layer's output tolerance
        in this batch (`outputs`: per step, per layer, flat)."""
        by_request: Dict[int, List[str]] = {}
        for d in differences:
            tol = outputs[d.step * layers + d.layer].tol
            if d.differing if self.exact else d.max_diff > tol:
                step = f"step {d.step + 1}, " if many_steps else ""
                bound = "" if self.exact else f" > tol {tol:.3g}"
                head = f"request {d.request} of this batch is request {d.seen.row} of {d.seen.where}"
                by_request.setdefault(d.request, [head]).append(
                    f"{step}layer {d.layer}: {d.differing} of {d.total} values differ, max |diff| "
                    f"{d.max_diff:.3g}{bound}")
        lines = [f"{head}: {', '.join(parts)}" for head, *parts in by_request.values()]
        return InvarianceCheck(not lines, exact=self.exact, differences=lines)
