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
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from kit.engine.batch import ForwardBatch
from kit.engine.fixture import fixtures_for
from kit.engine.hybrid import HybridBatch, attention_case
from kit.engine.kinds.recurrent import FULL, RecurrentCase
from kit.engine.modes import rules_for
from kit.engine.render import graph_batch
from kit.harness.capabilities import Capabilities
from kit.harness.guard import Guard, canary_figures
from kit.harness.program import returned
from kit.harness.protocol import BackendContext, seq_len_fill_value
from kit.harness.static import StaticBatch
from kit.harness.step_graph import graphed
from kit.harness.verdict import Verdict, eager_verdict
from kit.modes import ForwardMode
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

    def __init__(self, caps: Capabilities, case: RecurrentCase, fx):
        self.case, self.caps, self.fx = case, caps, fx
        rows = [(r.n_old, r.n_new) for r in fx.plan.requests]
        if rows != list(zip(case.prefix, case.new_lens)):
            raise ValueError(f"{case.name}: the full layers' requests {rows} are not the linear layers' "
                             f"{list(zip(case.prefix, case.new_lens))} under {caps.profile.name}'s row order")
        # The fixture's layers by their KV pool layer; forward() gets each its model layer id.
        self.layers = tuple(dataclasses.replace(layer, layer_id=model_id)
                            for layer, model_id in zip(fx.layers, case.full_layers))

    @classmethod
    def of_run(cls, backend_cls, case: RecurrentCase, device) -> Tuple["FullLayers", Optional["FullLayers"]]:
        """The full layers of `case`'s step and of the decode step after a TARGET_VERIFY
        (RecurrentCase.after_verify; None after any other), over one KV pool: the backend built for
        the first serves both."""
        caps = Capabilities.of(backend_cls)
        steps = [case, case.after_verify()] if case.mode == ForwardMode.TARGET_VERIFY else [case]
        fixtures = fixtures_for([attention_case(c) for c in steps], device, STORE, caps.profile, caps.numerics)
        found = [cls(caps, c, fx) for c, fx in zip(steps, fixtures)]
        return found[0], (found[1] if len(found) > 1 else None)

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
        guard = Guard()
        with guard.watching():
            backend.init_forward_metadata(hybrid)
            full_outs, full_lses, linear_outs = self._program(backend, hybrid, given, inputs, layers)
        return linear_outs, eager_verdict(self.fx, ([full_outs], [full_lses]), canary_figures(guard), [given],
                                          self.caps.profile.scratch, numerics=self.caps.numerics)

    def graph_step(self, backend, batch, inputs: Sequence, layers: Sequence, refill: Callable[[], None]
                   ) -> Tuple[List[torch.Tensor], Verdict]:
        """The step as a graph runner runs it (kit.harness.step_graph): `batch`, the linear layers'
        batch, padded to the graph's rows; the full layers' batch padded to as many, as the engine's
        profile pads a graph's request (kit.harness.static); every layer's forward on static inputs
        of that many rows (padded ones zeros) captured in one graph. The metadata through the
        backend's two-phase graph hooks where it has them (init_forward_metadata_out_graph before the
        capture, in_capture, and before the replay; init_forward_metadata_in_graph in the graph), else
        its init_forward_metadata before the capture. `refill` puts the state pools back as before the
        step (the KV pool is put back here).
        Judged as `step`, on the real requests' token rows, the padded rows' outputs finite where the
        profile gives a padded request tokens."""
        rows = batch.batch_size
        per_request = self.case.new_lens[0]  # a graph's requests are alike: one token, or a verify's drafts
        real = sum(self.case.new_lens)
        self.fx.install()
        held = _GraphBatch(self.fx, self.caps.profile, seq_len_fill_value(backend), rows)
        static = [x.buffers(rows * per_request, self.fx.case.inputs) for x in self.fx.inputs]
        for x, buffers in zip(self.fx.inputs, static):
            for buffer, src in zip(buffers, (x.q, x.k_new, x.v_new)):
                buffer[:real].copy_(src)
        hybrid = HybridBatch(held.loaded(), batch, self.case.full_layers)
        out_graph = getattr(backend, "init_forward_metadata_out_graph", None)
        in_graph = getattr(backend, "init_forward_metadata_in_graph", None)

        def handed(view, hook):
            """`hook` handed the step's hybrid batch over `view` (what forward() then gets)."""
            nonlocal hybrid
            hybrid = HybridBatch(view, batch, self.case.full_layers)
            hook(hybrid)

        if out_graph is not None:  # SGLang's two-phase hooks, as its graph runner drives them
            capture_metadata = lambda: handed(held.captured(), lambda h: out_graph(h, in_capture=True))  # noqa: E731
            replay_metadata = lambda: handed(held.loaded(), out_graph)  # noqa: E731
        else:
            capture_metadata, replay_metadata = lambda: backend.init_forward_metadata(hybrid), None

        def program():
            if in_graph is not None:
                in_graph(hybrid)
            return self._program(backend, hybrid, static, inputs, layers)

        def refill_both():
            refill()
            self.fx.install()

        guard = Guard()
        with guard.watching():
            full_outs, full_lses, linear_outs = graphed(static[0][0].device.type == "cuda", capture_metadata,
                                                        replay_metadata, program, refill_both)
        padded = [o[real:] for o in full_outs] if self.caps.profile.padded_rows_attend else []
        given = [tuple(t[:real] for t in buffers) for buffers in static]
        return linear_outs, eager_verdict(self.fx, ([[o[:real] for o in full_outs]],
                                                    [[lse if lse is None else lse[:real] for lse in full_lses]]),
                                          canary_figures(guard), [given], self.caps.profile.scratch,
                                          numerics=self.caps.numerics, padded=padded)

    def _program(self, backend, hybrid: HybridBatch, full_inputs: Sequence, inputs: Sequence, layers: Sequence):
        """Every layer's forward in the model's order: the full layers' outputs and log-sum-exps, the
        linear layers' outputs."""
        full, linear = iter(zip(self.layers, full_inputs)), iter(zip(inputs, layers))
        full_outs, full_lses, linear_outs = [], [], []
        for kind in self.case.layer_pattern:
            if kind == FULL:
                layer, (q, k, v) = next(full)
                out, lse = returned(backend.forward(q, k, v, layer, hybrid))
                full_outs.append(out)
                full_lses.append(lse)
            else:
                x, layer = next(linear)
                linear_outs.append(backend.forward(*x.handed(), layer, hybrid))
        return full_outs, full_lses, linear_outs

    def describe(self) -> str:
        """How a message names the full layers (the verdict's 'layer i' is its KV pool layer)."""
        ids = ", ".join(map(str, self.case.full_layers))
        return f"full-attention layers {ids} (KV pool layers 0-{len(self.case.full_layers) - 1})"


class _GraphBatch:
    """The full layers' batch of a graph of `rows` requests, over static buffers (kit.harness.static)
    padded as a graph runner of the backend's engine pads it (a padded request's seq_lens entry its
    `fill` value): a capture's, no real request in it, or the step's, its requests first. Both carry
    the step description."""

    def __init__(self, fx, profile, fill: int, rows: int):
        self.fx, self.rows = fx, rows
        self.padded_seq_len = profile.seq_len_pad(fill)
        self.static = StaticBatch(fx.batch, profile, self.padded_seq_len, rows, None, ragged=False)
        self.rules = rules_for(fx.case.mode)

    def captured(self) -> ForwardBatch:
        self.static.fill(self.rows)
        return self._view(0, None)

    def loaded(self) -> ForwardBatch:
        batch = self.fx.batch
        self.static.load(batch, self.rows)
        # A verify's real requests keep their mask (the padded ones' is the rules')
        return self._view(batch.batch_size, batch.spec_info.custom_mask if batch.spec_info is not None else None)

    def _view(self, real: int, real_mask) -> ForwardBatch:
        fx = self.fx
        spec_info = self.rules.spec_info(fx.case, self.rows, real, real_mask, self.padded_seq_len,
                                         fx.batch.seq_lens.device)
        view = graph_batch(self.rules.graph_mode(), self.rows, self.static.held(self.rows), fx.pools, spec_info)
        return dataclasses.replace(view, step=fx.batch.step)
