"""Mutants of a backend of hybrid models (full-attention layers among linear ones): each one bug of the
routing between a model layer id and its pool's layer, made by overriding the in-box
`torch_native_hybrid`'s maps or the map `sglang_gdn_hybrid` hands SGLang's HybridLinearKVPool code
(neither source touched), with the failure class the kit must
report (kit.harness.hybrid, kit.harness.recurrent): rows of the mutant catalog, scored on the hybrid cases."""
from __future__ import annotations

from backends.sglang.hybrid import SGLangGDNHybridBackend
from backends.torch_native_hybrid import TorchNativeHybridBackend
from kit.engine.kinds.recurrent import HYBRID_MODES
from kit.engine.depth import NUM_LAYERS
from kit.modes import Exec
from kit.mutation import Mutant
from kit.report.record import KERNEL, KV_WRITE


class KVLayerByModelId(TorchNativeHybridBackend):
    """A full layer's KV addressed by its model layer id wrapped to the KV pool's layers, not by its
    position among the full layers: in [linear, full, linear, full] both full layers read and write
    KV layer 1, and layer 0's new tokens are never written."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.full_index = {layer_id: layer_id % NUM_LAYERS for layer_id in self.full_index}


class LinearLayersShareState(TorchNativeHybridBackend):
    """Every linear layer addresses the state pools' first layer (a layer map that falls back to it):
    the second linear layer starts from the first's saved state and overwrites it."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.linear_index = {layer_id: 0 for layer_id in self.linear_index}


class SGLangKVLayerByModelId(SGLangGDNHybridBackend):
    """SGLang's HybridLinearKVPool handed a map from a full layer's model layer id wrapped to the KV
    pool's layers, not its position among the full layers: in [linear, full, linear, full] both full
    layers write and read KV layer 1, and layer 0's new tokens are never written."""

    def _full_attention(self, runner):
        full, full_attn_layers = super()._full_attention(runner)
        pool = self.full.runner.token_to_kv_pool
        pool.full_attention_layer_id_mapping = {layer_id: layer_id % NUM_LAYERS for layer_id in full_attn_layers}
        return full, full_attn_layers


HY = "tests.mutants.hybrid:"
EAGER = (Exec.EAGER,)


def _hybrid(case) -> bool:
    """The cases the bugs show in (Mutant.reaches): a hybrid model's."""
    return bool(getattr(case, "layer_pattern", ()))


# Rows of the mutant catalog (tests/mutants/__init__.py), numbered from 150.
MUTANTS = [
    Mutant(150, "hybrid_kv_layer_by_model_id", HY + "KVLayerByModelId", (KV_WRITE,), HYBRID_MODES, EAGER, cpu=True,
           reaches=_hybrid),
    Mutant(151, "hybrid_linear_layers_share_state", HY + "LinearLayersShareState", (KV_WRITE, KERNEL), HYBRID_MODES,
           EAGER, cpu=True, reaches=_hybrid),
    Mutant(152, "sglang_hybrid_kv_layer_by_model_id", HY + "SGLangKVLayerByModelId", (KV_WRITE,), HYBRID_MODES, EAGER,
           cpu=True, reaches=_hybrid),
]
