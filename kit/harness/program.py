"""A batch's step program run on a backend: every step's forward for every layer of the model, in
order, on the metadata the hooks built. The one place eager runs and graph captures (and emulated
replays) call forward()."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from kit.harness.nan_fill import nan_filled_allocations

Inputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# forward_program's: per step, per layer, the outputs, and the log-sum-exps returned beside them (None: none)
Program = Tuple[List[List[torch.Tensor]], List[List[Optional[torch.Tensor]]]]


def returned(result) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(output, log-sum-exp or None) of what one forward() returned."""
    return result if isinstance(result, tuple) and len(result) == 2 else (result, None)


def forward_program(backend, layers: Sequence, views: Sequence, inputs: Sequence[Sequence[Inputs]],
                    call=None) -> Program:
    """(per step, per layer, forward's output; the same of the log-sum-exp it returned beside it, None
    where it returned none): step i's forward gets views[i] and inputs[i][layer].
    `call(stage, fn, *args)` wraps each call (the runner's, to name the stage of a crash)."""
    outs, lses = [], []
    with nan_filled_allocations():
        for i, (view, step_inputs) in enumerate(zip(views, inputs)):
            step = f"step {i + 1}, " if len(views) > 1 else ""
            row, row_lses = [], []
            for layer, (q, k, v) in zip(layers, step_inputs):
                stage = f"forward ({step}layer {layer.layer_id})"
                result = (call(stage, backend.forward, q, k, v, layer, view) if call
                          else backend.forward(q, k, v, layer, view))
                out, lse = returned(result)
                row.append(out)
                row_lses.append(lse)
            outs.append(row)
            lses.append(row_lses)
    return outs, lses
