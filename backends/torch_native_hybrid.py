"""The in-box backend of a hybrid model (Qwen3-Next: linear layers with a full-attention layer every
few): torch_native for its full-attention layers and torch_native_linear for its linear ones, one
metadata call for the step, each layer's forward routed by its model layer id, as SGLang's
HybridLinearAttnBackend routes them. Each half addresses its own pool by the layer's position among
the layers of its sort (the KV pool holds the full layers alone, the state pools the linear ones),
as SGLang's hybrid pools map a model layer id to theirs."""
from __future__ import annotations

import dataclasses

from backends.torch_native import TorchNativeBackend
from backends.torch_native_linear import TorchNativeLinearBackend
from kit.engine.kinds.recurrent import HYBRID, KINDS, MODES
from kit.engine.profile import NATIVE


class TorchNativeHybridBackend:
    name = "torch_native_hybrid"
    profile = NATIVE  # the full layers read the step description (torch_native's); SGLang's pools and verify rule
    modes = MODES  # its verify a chain of drafts, as the linear kinds' is
    attention_kinds = tuple(KINDS)
    attention_features = (HYBRID,)

    @classmethod
    def supports(cls, case):
        return None if case.layer_pattern else "a model of linear layers alone (torch_native_linear runs it)"

    def __init__(self, ctx):
        self.full = TorchNativeBackend(ctx.attention)
        self.linear = TorchNativeLinearBackend(ctx.recurrent)
        self.full_index = {layer_id: i for i, layer_id in enumerate(ctx.full_attn_layers)}
        self.linear_index = {layer_id: i for i, layer_id in enumerate(ctx.linear_layers)}

    def init_forward_metadata(self, batch) -> None:
        self.full.init_forward_metadata(batch.attention)
        self.linear.init_forward_metadata(batch.recurrent)

    def forward(self, *args):
        """A full layer: forward(q, k, v, layer, batch); a linear one: the linear kind's arguments
        (torch_native_linear's), then layer and batch."""
        *inputs, layer, batch = args
        if layer.layer_id in self.full_index:
            return self.full.forward(*inputs, self._pool_layer(layer, self.full_index), batch.attention)
        return self.linear.forward(*inputs, self._pool_layer(layer, self.linear_index), batch.recurrent)

    @staticmethod
    def _pool_layer(layer, index):
        """The layer as its half's pool addresses it: its position among the layers of its sort."""
        return dataclasses.replace(layer, layer_id=index[layer.layer_id])
