"""SGLang's own backend of a hybrid GDN model (Qwen3-Next: linear layers with a full-attention layer
every few), unmodified, as its model runner builds it (attention_registry.py): HybridLinearAttnBackend
over TritonAttnBackend for the full-attention layers and GDNAttnBackend for the linear ones,
`full_attn_layers` the model's full layer ids, every layer's call routed by its model layer id.

What is mapped, besides what backends/sglang/linear.py and adapter.py map:
- the kit's KV pool -> SGLang's HybridLinearKVPool: its own code (`HYBRID_KV_POOL_CODE`, which maps a
  model layer id to the KV pool's layer, full_attention_layer_id_mapping) over the kit's pool as its
  full_kv_pool, which holds the full layers alone;
- the request rows -> one HybridReqToTokenPool: the kit's req_to_token table (the KV pool's rows) and
  each row's state slot (req_index_to_mamba_index_mapping), so one ForwardBatch's req_pool_indices
  index both, as the scheduler's one ForwardBatch does.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Optional

import torch

from backends.sglang.adapter import SGLangTritonBackend, _KVPool
from backends.sglang.linear import MEMORY_POOL, SGLangGDNBackend, _code
from kit.engine.hybrid import attention_case
from kit.engine.numerics import composed
from kit.engine.kinds.recurrent import HYBRID

# What SGLang's HybridLinearKVPool does itself (KVCache's quant-method reader with it), taken from its
# class and run over the kit's pool.
HYBRID_KV_POOL_CODE = ("_transfer_full_attention_id", "_wait_for_layer", "get_key_buffer", "get_value_buffer",
                       "get_kv_buffer", "set_kv_buffer", "get_v_head_dim", "get_kv_cache_quant_method")


class _FullKVPool(_KVPool):
    """The kit's KV pool as HybridLinearKVPool's full_kv_pool (an MHATokenToKVPool of the full layers
    alone): addressed by the layer HybridLinearKVPool names (`layer_id_override`)."""

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, k_scale=None, v_scale=None,
                      layer_id_override=None, dcp_kv_mask=None):
        # HybridLinearKVPool hands its default scales (1.0) for an unquantized cache, which
        # MHATokenToKVPool ignores for a cache in the model's dtype (memory_pool.py:2926).
        if (k_scale, v_scale) != (1.0, 1.0) or dcp_kv_mask is not None:
            raise ValueError("KV scales or a DCP mask given, but the kit's hybrid KV cache is unquantized, one rank")
        loc, _, _ = self.unwrap_write_loc(loc_info)
        self.pool.set_kv_buffer(types.SimpleNamespace(layer_id=layer_id_override), loc, cache_k, cache_v)


class _HybridKVPoolState:
    """The HybridLinearKVPool fields its code reads, over the kit's pool of the full layers."""

    start_layer = 0
    layer_transfer_counter = None  # no layer-wise host-to-device transfer in flight
    use_mla = False
    quant_method = None  # its own; the full pool's is the one read

    def __init__(self, full_kv_pool, full_attn_layers):
        self.full_kv_pool = full_kv_pool
        self.size, self.page_size, self.dtype = full_kv_pool.size, full_kv_pool.page_size, full_kv_pool.dtype
        self.head_num, self.head_dim = full_kv_pool.head_num, full_kv_pool.head_dim
        self.full_attention_layer_id_mapping = {layer_id: i for i, layer_id in enumerate(full_attn_layers)}


def hybrid_kv_pool(full_kv_pool, full_attn_layers, sg_pool_cls):
    code = _code(sg_pool_cls, HYBRID_KV_POOL_CODE)
    return type("HybridLinearKVPool", (_HybridKVPoolState,), code)(full_kv_pool, full_attn_layers)


class _FullAttention(SGLangTritonBackend):
    """TritonAttnBackend as a hybrid model's runner builds it: over the HybridLinearKVPool and the
    HybridReqToTokenPool the linear side shares, its model config the hybrid model's (TritonAttnBackend
    then takes v_head_dim from the pool, triton_backend.py:298), its layers' RadixAttentions by model
    layer id, called under the HybridLinearAttnBackend (`wrapper`) with the step's ForwardBatch."""

    def __init__(self, ctx, runner, full_attn_layers):
        self.linear_runner, self.full_attn_layers = runner, full_attn_layers
        self.wrapper = self.step_batch = None
        super().__init__(ctx)

    def _make_impl(self):
        from importlib import import_module

        runner, memory_pool = self.runner, import_module(MEMORY_POOL)
        runner.req_to_token_pool = self.linear_runner.req_to_token_pool
        runner.token_to_kv_pool = hybrid_kv_pool(_FullKVPool(self.ctx.token_to_kv_pool, self.sg),
                                                 self.full_attn_layers, memory_pool.HybridLinearKVPool)
        hf_config = self.linear_runner.model_config.hf_config
        runner.model_config.hf_config = runner.model_config.hf_text_config = hf_config
        return super()._make_impl()

    def _attention_backend(self, batch):
        return self.wrapper

    def _layer_batch(self, batch):
        return self.step_batch


class SGLangGDNHybridBackend(SGLangGDNBackend):
    name = "sglang_gdn_hybrid"
    attention_features = (HYBRID,)
    numerics = composed(SGLangGDNBackend.numerics, SGLangTritonBackend.numerics)
    # Neither side asks the scheduler for host copies (needs_cpu_seq_lens False in both,
    # hybrid_linear_attn_backend.py:1201): it hands none, as to TritonAttnBackend alone.
    host_mirrors = SGLangTritonBackend.host_mirrors
    ci_cases = {"decode": ("hybrid_gdn_decode_saved_fp32",), "target_verify": ("hybrid_gdn_verify_fp32",)}

    @classmethod
    def load_engine(cls) -> None:
        super().load_engine()
        SGLangTritonBackend.load_engine()

    @classmethod
    def supports(cls, case) -> Optional[str]:
        if not case.layer_pattern:
            return "a model of linear layers alone (sglang_gdn runs it)"
        return super().supports(case) or SGLangTritonBackend.supports(attention_case(case))

    def __init__(self, ctx):
        self.hybrid_ctx = ctx
        super().__init__(ctx.recurrent)

    def _request_rows(self, ctx) -> int:
        return self.hybrid_ctx.attention.req_to_token_pool.size

    def _full_attention(self, runner):
        ctx = self.hybrid_ctx
        # HybridReqToTokenPool is a ReqToTokenPool: its rows are the KV table's.
        runner.req_to_token_pool.req_to_token = ctx.attention.req_to_token_pool.req_to_token
        layers = tuple(dataclasses.replace(layer, layer_id=model_id)
                       for layer, model_id in zip(ctx.attention.layers, ctx.full_attn_layers))
        self.full = _FullAttention(dataclasses.replace(ctx.attention, layers=layers), runner, ctx.full_attn_layers)
        return self.full.impl, list(ctx.full_attn_layers)

    def _step_batch(self, batch):
        """The step's one ForwardBatch (the full layers' fields; each row's state slot mapped from its
        request row, as HybridReqToTokenPool maps it), each side's layers called with it."""
        fb = self.full._forward_batch(batch.attention)
        # The step's token ids, as the model runner's batch carries them: a verify's linear metadata
        # counts its tokens by them (hybrid_linear_attn_backend.py:290), no kernel reads them.
        fb.input_ids = torch.zeros(batch.recurrent.num_tokens, dtype=torch.int64, device=fb.seq_lens.device)
        real = batch.recurrent.state_indices >= 0
        self.req_pool.req_index_to_mamba_index_mapping[fb.req_pool_indices[real]] = batch.recurrent.state_indices[real]
        fb.num_padding = int((~real).sum())  # a graph's padded rows, last (SGLang's graph runner sets it)
        self._clear_new_slots(batch.recurrent)
        self.forward_batch = self.full.step_batch = fb
        self.full.wrapper = self.impl
        return fb

    def init_forward_metadata(self, batch) -> None:
        self.impl.init_forward_metadata(self._step_batch(batch))

    def init_forward_metadata_out_graph(self, batch, in_capture: bool = False) -> None:
        """SGLang's graph runner's metadata of both sides, outside the graph: at its capture, before each replay."""
        self.impl.init_forward_metadata_out_graph(self._step_batch(batch), in_capture=in_capture)

    def init_forward_metadata_in_graph(self, batch) -> None:
        """The in-graph half of SGLang's two-phase metadata, of both sides, recorded in the graph."""
        self.impl.init_forward_metadata_in_graph(self.forward_batch)

    def get_cuda_graph_seq_len_fill_value(self):
        return self.impl.get_cuda_graph_seq_len_fill_value()

    def forward(self, *args):
        """A full layer: forward(q, k, v, layer, batch); a linear one: GDN's (mixed_qkv, a, b, layer, batch)."""
        *inputs, layer, batch = args
        if layer.layer_id in self.full.full_attn_layers:
            return self.full.forward(*inputs, layer, batch.attention)
        return self._call_layer(layer, *inputs)
