"""Mutants of a backend of hybrid models (full-attention layers among linear ones): bugs of the
routing between a model layer id and its pool's layer, made by overriding the in-box
`torch_native_hybrid`'s maps or the map `sglang_gdn_hybrid` hands SGLang's HybridLinearKVPool code,
and bugs of a graph's padded rows, made by handing the in-box backend a mutated half (no source
touched), with the failure class the kit must report (kit.harness.hybrid, kit.harness.recurrent):
rows of the mutant catalog, scored on the hybrid cases."""
from __future__ import annotations

import torch

from backends.sglang.hybrid import SGLangGDNHybridBackend
from backends.torch_native import TorchNativeBackend
from backends.torch_native_hybrid import TorchNativeHybridBackend
from kit.engine.kinds.recurrent import GRAPH_MODES, MODES
from kit.engine.depth import NUM_LAYERS
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant
from kit.report.record import GRAPH as GRAPH_CLASS, KERNEL, KV_WRITE
from tests.mutants.linear import PaddedRowWrites, RollbackOffByOne


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


class LinearPaddedRowWrites(TorchNativeHybridBackend):
    """The linear layers of a graph's padded rows (slot -1) written like real ones: -1 indexes the
    state pools' last slot. No eager step has a padded row."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.linear = PaddedRowWrites(ctx.recurrent)


class _PaddedRowsUnwritten(TorchNativeBackend):
    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        out[sum(r.n_new for r in batch.step.requests):] = float("nan")
        return out, lse


class FullPaddedRowsUnwritten(TorchNativeHybridBackend):
    """The full layers' output rows of a graph's padded requests never written (what an empty
    allocation holds: NaN under the kit's filled allocations), which the rest of the model reads.
    No eager step has a padded row."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.full = _PaddedRowsUnwritten(ctx.attention)


class _VerifyMaskIgnored(TorchNativeBackend):
    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        self.verify = batch.forward_mode == ForwardMode.TARGET_VERIFY
        return super().forward(q, k, v, layer, batch, save_kv_cache)

    def _on_device(self, request, device):
        keys, visible, q_pos, k_pos = super()._on_device(request, device)
        return keys, torch.ones_like(visible) if self.verify else visible, q_pos, k_pos


class FullVerifyMaskIgnored(TorchNativeHybridBackend):
    """A verify's full layers attend every draft from every draft (the verify's mask ignored, each
    draft sees the drafts after it). Every other step's masks are kept."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.full = _VerifyMaskIgnored(ctx.attention)


class LinearRollbackOffByOne(TorchNativeHybridBackend):
    """A verify's linear layers store the state after draft j + 1 where draft j's belongs: a request
    that keeps n drafts continues from one more. The full layers are right, and no other step keeps
    per-draft states."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.linear = RollbackOffByOne(ctx.recurrent)


class SGLangKVLayerByModelId(SGLangGDNHybridBackend):
    """SGLang's HybridLinearKVPool handed a map from a full layer's model layer id wrapped to the KV
    pool's layers, not its position among the full layers: in [linear, full, linear, full] both full
    layers write and read KV layer 1, and layer 0's new tokens are never written."""

    def _full_attention(self, runner):
        full, full_attn_layers = super()._full_attention(runner)
        pool = self.full.runner.token_to_kv_pool
        pool.full_attention_layer_id_mapping = {layer_id: layer_id % NUM_LAYERS for layer_id in full_attn_layers}
        return full, full_attn_layers


class SGLangFullMetadataNotReplayed(SGLangGDNHybridBackend):
    """Before a replay, the linear side's graph metadata alone: the full layers' (TritonAttnBackend's
    graph buffers) stay as the capture left them, of a batch of padded requests. An eager step
    builds both sides'."""

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        if in_capture:
            super().init_forward_metadata_out_graph(batch, in_capture)
        else:
            self.impl.linear_attn_backend.init_forward_metadata_out_graph(self._step_batch(batch))


HY = "tests.mutants.hybrid:"
EAGER, GRAPH = (Exec.EAGER,), (Exec.GRAPH,)
VERIFY = (ForwardMode.TARGET_VERIFY,)


def _hybrid(case) -> bool:
    """The cases the bugs show in (Mutant.reaches): a hybrid model's."""
    return bool(getattr(case, "layer_pattern", ()))


# Rows of the mutant catalog (tests/mutants/__init__.py), numbered from 150.
MUTANTS = [
    Mutant(150, "hybrid_kv_layer_by_model_id", HY + "KVLayerByModelId", (KV_WRITE,), MODES, EAGER, cpu=True,
           reaches=_hybrid),
    Mutant(151, "hybrid_linear_layers_share_state", HY + "LinearLayersShareState", (KV_WRITE, KERNEL), MODES,
           EAGER, cpu=True, reaches=_hybrid),
    Mutant(152, "sglang_hybrid_kv_layer_by_model_id", HY + "SGLangKVLayerByModelId", (KV_WRITE,), MODES, EAGER,
           cpu=True, reaches=_hybrid),
    Mutant(153, "hybrid_linear_padded_row_writes_slot", HY + "LinearPaddedRowWrites", (KV_WRITE,), GRAPH_MODES,
           GRAPH, cpu=True, reaches=_hybrid),
    Mutant(154, "hybrid_full_padded_rows_unwritten", HY + "FullPaddedRowsUnwritten", (GRAPH_CLASS,), GRAPH_MODES,
           GRAPH, cpu=True, reaches=_hybrid),
    Mutant(155, "sglang_hybrid_full_metadata_not_replayed", HY + "SGLangFullMetadataNotReplayed", (KERNEL,),
           GRAPH_MODES, GRAPH, cpu=True, reaches=_hybrid),
    Mutant(156, "hybrid_full_verify_mask_ignored", HY + "FullVerifyMaskIgnored", (KERNEL,), VERIFY, EAGER + GRAPH,
           cpu=True, reaches=_hybrid),
    Mutant(157, "hybrid_linear_rollback_off_by_one", HY + "LinearRollbackOffByOne", (KV_WRITE,), VERIFY,
           EAGER + GRAPH, cpu=True, reaches=_hybrid),
]
