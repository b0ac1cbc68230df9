"""A batch's step program run on a backend: every step's forward for every layer of the model, in
order, on the metadata the hooks built. The one place eager runs and graph captures (and emulated
replays) call forward()."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from kit.harness.nan_fill import nan_filled_allocations

Inputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def forward_program(backend, layers: Sequence, views: Sequence, inputs: Sequence[Sequence[Inputs]],
                    call=None) -> List[List[torch.Tensor]]:
    """Per step, per layer, forward's output: step i's forward gets views[i] and inputs[i][layer].
    `call(stage, fn, *args)` wraps each call (the runner's, to name the stage of a crash)."""
    outs = []
    with nan_filled_allocations():
        for i, (view, step_inputs) in enumerate(zip(views, inputs)):
            step = f"step {i + 1}, " if len(views) > 1 else ""
            row = []
            for layer, (q, k, v) in zip(layers, step_inputs):
                stage = f"forward ({step}layer {layer.layer_id})"
                row.append(call(stage, backend.forward, q, k, v, layer, view) if call
                           else backend.forward(q, k, v, layer, view))
            outs.append(row)
    return outs
