"""A hybrid model's step (a recurrent case with a `layer_pattern`, run by kit.harness.recurrent): its
full-attention half. The full layers are the softmax fixture of the same requests
(kit.engine.hybrid.attention_case: its KV pool, req_to_token table, float64 reference), installed,
handed and judged as the softmax runner's eager step is (kit.harness.verdict.eager_verdict: every
full layer's output, the KV pool byte for byte, the inputs left as handed, the backend's buffers'
canaries); the linear half is the recurrent harness's. One init_forward_metadata for the step, then
every layer's forward in the model's order, each handed its model layer id, as an engine's model
runner calls a hybrid backend."""
from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import torch

from kit.engine.fixture import fixtures_for
from kit.engine.hybrid import HybridBatch, attention_case
from kit.engine.kinds.recurrent import FULL, RecurrentCase
from kit.harness.capabilities import Capabilities
from kit.harness.guard import Guard, canary_figures
from kit.harness.program import returned
from kit.harness.protocol import BackendContext
from kit.harness.verdict import Verdict, eager_verdict
from kit.process.memory import STORE


@dataclasses.dataclass
class HybridContext:
    """What a backend of a hybrid model is built with: its full-attention layers' context (the KV pool
    holds them alone, by their position among them), its linear layers' (kit.harness.recurrent's
    RecurrentContext; the state pools hold them alone, by position), and which model layer ids are which."""

    attention: BackendContext
    recurrent: object
    full_attn_layers: Tuple[int, ...]
    linear_layers: Tuple[int, ...]


class FullLayers:
    """The full-attention layers of a hybrid case's step on one backend."""

    def __init__(self, backend_cls, case: RecurrentCase, device):
        self.case, self.caps = case, Capabilities.of(backend_cls)
        self.fx = fixtures_for([attention_case(case)], device, STORE, self.caps.profile, self.caps.numerics)[0]
        rows = [(r.n_old, r.n_new) for r in self.fx.plan.requests]
        if rows != list(zip(case.prefix, case.new_lens)):
            raise ValueError(f"{case.name}: the full layers' requests {rows} are not the linear layers' "
                             f"{list(zip(case.prefix, case.new_lens))} under {self.caps.profile.name}'s row order")
        # The fixture's layers by their KV pool layer; forward() gets each its model layer id.
        self.layers = tuple(dataclasses.replace(layer, layer_id=model_id)
                            for layer, model_id in zip(self.fx.layers, case.full_layers))

    def context(self, device, recurrent) -> HybridContext:
        case = self.case
        return HybridContext(BackendContext.for_case(self.fx.case, self.fx.pools, device, [self.fx.plan]), recurrent,
                             case.full_layers, case.linear_layers)

    def step(self, backend, batch, inputs: Sequence, layers: Sequence) -> Tuple[List[torch.Tensor], Verdict]:
        """The step on `backend`: the KV pool installed, one init_forward_metadata, every layer's
        forward in the model's order (the linear layers': `layers`, handed `inputs`, their
        kit.engine.recurrent_step.LayerInputs), the full layers judged; the linear layers' outputs, in
        their order, and that verdict."""
        self.fx.install()
        given = [x.handed(self.fx.case.inputs) for x in self.fx.inputs]
        hybrid = HybridBatch(self.fx.batch, batch, self.case.full_layers)
        full, linear = iter(zip(self.layers, given)), iter(zip(inputs, layers))
        guard = Guard()
        full_outs, full_lses, linear_outs = [], [], []
        with guard.watching():
            backend.init_forward_metadata(hybrid)
            for kind in self.case.layer_pattern:
                if kind == FULL:
                    layer, (q, k, v) = next(full)
                    out, lse = returned(backend.forward(q, k, v, layer, hybrid))
                    full_outs.append(out)
                    full_lses.append(lse)
                else:
                    x, layer = next(linear)
                    linear_outs.append(backend.forward(*x.handed(), layer, hybrid))
        return linear_outs, eager_verdict(self.fx, ([full_outs], [full_lses]), canary_figures(guard), [given],
                                          self.caps.profile.scratch, numerics=self.caps.numerics)

    def describe(self) -> str:
        """How a message names the full layers (the verdict's 'layer i' is its KV pool layer)."""
        ids = ", ".join(map(str, self.case.full_layers))
        return f"full-attention layers {ids} (KV pool layers 0-{len(self.case.full_layers) - 1})"
