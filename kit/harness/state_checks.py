"""The state pools' check (kit.engine.state_pool), as the KV pool's: every entry a step must write
holds the reference's (a conv window bit for bit: it is the input rows themselves; a recurrent state
within the output's tolerance, kit.harness.checks.output_figures, per head over K x V, widened as the
output's by the backend's declared envelope), and every other entry, free slots' poison, the tail past
the last slot and the slots of padded rows included, holds what it held before the step, bit for bit."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from kit.harness.checks import Check, bits, output_figures, read_back
from kit.report.record import KV_WRITE

EXAMPLES = 4


@dataclasses.dataclass(frozen=True)
class Expected:
    """One pool entry the step writes: pool `name` of layer `layer_id` at `index` (slot, or an intermediate pool's row and draft)."""

    name: str
    layer_id: int
    index: Tuple[int, ...]
    golden: torch.Tensor  # float64
    same_dtype: torch.Tensor  # the float32 reference's (states), or the golden (windows: exact)
    exact: bool
    # a state: the golden taking the declared envelope's casts too (a chunked kernel's state carries its
    # outputs' in-tile rounding), None where none is declared
    envelope: Optional[torch.Tensor] = None


@dataclasses.dataclass
class StatePoolCheck(Check):
    failure_class = KV_WRITE
    graph_class = KV_WRITE
    wrong: List[str]  # entries the step should have written as the reference's (first few)
    stray: List[str]  # entries changed that the step owns not (first few)
    num_wrong: int
    num_stray: int

    def describe(self) -> str:
        if self.ok:
            return "state pools ok"
        parts = []
        if self.num_wrong:
            parts.append(f"{self.num_wrong} states not the reference's, e.g. {', '.join(self.wrong)}")
        if self.num_stray:
            parts.append(f"{self.num_stray} stray writes, e.g. {', '.join(self.stray)}")
        return "state pools wrong: " + "; ".join(parts)


def _where(name: str, layer_id: int, index: Sequence[int], size: int) -> str:
    slot = index[0]
    entry = "row" if name.startswith("intermediate") else "slot"  # an intermediate pool's: a batch position
    at = "the tail past the last slot" if slot >= size else f"{entry} {slot}"
    draft = f" draft {index[1]}" if len(index) > 1 else ""
    return f"{name} layer {layer_id} {at}{draft}"


def check_states(pool, before: Dict[str, torch.Tensor], expected: Sequence[Expected], dtype: torch.dtype) -> StatePoolCheck:
    """`before`: each pool's buffer (tail included) as it was before the step; `dtype`: the case's,
    which sets the states' tolerance."""
    wrong: List[str] = []
    owned = set()
    states = [e for e in expected if not e.exact]
    for e in expected:
        owned.add((e.name, e.layer_id, e.index))
        if e.exact:
            got = pool.buffers[e.name][(e.layer_id,) + e.index]
            if not torch.equal(bits(got), bits(e.golden.to(got.dtype))):
                wrong.append(_where(e.name, e.layer_id, e.index, pool.size))
    if states:
        got = [pool.buffers[e.name][(e.layer_id,) + e.index].flatten(1)[None] for e in states]
        goldens = [e.golden.flatten(1)[None] for e in states]
        declared = [None if e.envelope is None else (g, e.envelope.flatten(1)[None]) for e, g in zip(states, goldens)]
        checks = read_back([output_figures(got, goldens, [e.same_dtype.flatten(1)[None] for e in states], dtype,
                                           [""] * len(states), declared)])[0]
        wrong += [_where(e.name, e.layer_id, e.index, pool.size) for e, c in zip(states, checks) if not c.ok]
    stray = []
    for name, buffer in pool.buffers.items():
        entry_dims = 3 if name.startswith("intermediate") else 2  # [layer, slot(, draft)] before the entry
        changed = (bits(buffer) != bits(before[name])).flatten(entry_dims).any(dim=-1)
        for where in changed.nonzero().tolist():
            if (name, where[0], tuple(where[1:])) not in owned:
                stray.append(_where(name, where[0], where[1:], pool.size))
    return StatePoolCheck(not wrong and not stray, wrong[:EXAMPLES], stray[:EXAMPLES], len(wrong), len(stray))
