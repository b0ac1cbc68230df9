"""vLLM's MAMBA2_ATTN (Mamba2's SSD: Nemotron-H, Mamba2, Granite 4, Falcon-H1), unmodified, behind the
kit's recurrent protocol (kit.engine.kinds.recurrent).

What is mapped, and nothing more (a bug here could hide one in vLLM):
- each kit layer -> vLLM's own MambaMixer2 (model_executor/layers/mamba/mamba_mixer2.py), built as
  Nemotron-H builds it at TP 1 (groups, heads, d_state, head_dim, conv width, no bias), on the kit's
  device; its conv1d weight, A (= -exp(A_log), as its weight loader stores it), D and dt_bias the kit
  layer's (float32, as the kit's reference reads them); its `kv_cache` the kit's pools of that layer:
  the conv window (vLLM's default `SD` layout, [blocks, state_len, dim], handed as the transposed view
  of the pool's [slots, dim, state_len], which the mixer transposes back) and the SSM state
  [slots, H, head_dim, d_state] (float32: --mamba-ssm-cache-dtype float32);
- the model config's mamba_chunk_size: Mamba2-2.7B's and Nemotron-H's (kit.engine.kinds.mamba2);
- the kit's RecurrentBatch -> vLLM's CommonAttentionMetadata as its runner renders a step
  (backends/vllm/recurrent.py); Mamba2AttentionMetadataBuilder.build() makes the metadata (prefill
  rows' has_initial_states_p, chunk metadata and conv metadata; decode rows' state blocks, and with
  speculative decoding their blocks per token and num_accepted_tokens);
- forward -> the mixer's own op, torch.ops.vllm.mamba_mixer2, called as MambaMixer2.forward calls
  it (its in_proj's output [gate | xBC | dt] and an output buffer it allocates with torch.empty),
  inside vLLM's forward context: causal_conv1d_fn and mamba_chunk_scan_combined_varlen for prefill
  rows, causal_conv1d_update and selective_state_update for decode and verify rows, on the
  slot-indexed pools. The gate is zeros: the op does not read it (the gated norm after the op
  does); the op's output, the SSD's before the norm, is what the kit judges.

Every op it runs is Triton, on CUDA only (CPU_REASON). ReplaySSM (--use-replayssm) and FlashInfer's
selective_state_update are other decode paths of the same mixer, not taken here (vLLM's defaults).
"""
from __future__ import annotations

import torch

from backends.vllm.adapter import runtime
from backends.vllm.recurrent import VllmRecurrentBackend
from kit.engine.kinds.mamba2 import CHUNK_SIZE

# Why the mixer runs on CUDA only: its ops on vLLM's CPU platform, and its Triton kernels in the interpreter.
CPU_REASON = ("vLLM's MambaMixer2 on CPU: its CPU platform's conv ops are compiled ones (_C.causal_conv1d_update_cpu_vec, "
              "ops/cpu/causal_conv1d.py; not in the CPU wheel the kit installs), and its Triton conv kernel does not "
              "run in Triton's interpreter (causal_conv1d_update: 'mask has unsupported dtype')")
HIDDEN_SIZE = 64  # the mixer's in_proj and out_proj width: built, never called (the kit hands in_proj's output)


def layer_name(layer) -> str:
    """A Mamba2 layer's name in vLLM's forward context, as Nemotron-H's and Mamba2's decoder layers name it."""
    return f"model.layers.{layer.layer_id}.mixer"


class VllmMamba2Backend(VllmRecurrentBackend):
    """MAMBA2_ATTN (v1/attention/backends/mamba2_attn.py) with vLLM's MambaMixer2."""

    name = "vllm_mamba2"
    attention_kinds = ("mamba2",)
    builder_class = ("vllm.v1.attention.backends.mamba2_attn", "Mamba2AttentionMetadataBuilder")
    layer_name = staticmethod(layer_name)
    cpu_reason = CPU_REASON

    @classmethod
    def load_engine(cls) -> None:
        """What a run imports of vLLM (the offline bundle traces it): the runtime, the builder, the mixer."""
        runtime()
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2  # noqa: F401
        from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder  # noqa: F401

    def __init__(self, ctx):
        super().__init__(ctx)
        self._select_state_update()

    def _select_state_update(self) -> None:
        """What vLLM's runner does once it has the KV cache config (gpu_model_runner.py
        initialize_kv_cache): selective_state_update dispatches to the backend the config's
        mamba_config names (Triton by default)."""
        from vllm.model_executor.layers.mamba.ops.ssu_dispatch import initialize_mamba_ssu_backend
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

        spec = self.builder.kv_cache_spec
        group = KVCacheGroupSpec([layer_name(layer) for layer in self.ctx.layers], spec)
        initialize_mamba_ssu_backend(self.vllm_config.mamba_config,
                                     KVCacheConfig(num_blocks=self.ctx.state_pool.size, kv_cache_tensors=[],
                                                   kv_cache_groups=[group]),
                                     use_replayssm=self.vllm_config.cache_config.use_replayssm)

    def configure(self, config) -> None:
        config.model_config.hf_text_config.mamba_chunk_size = CHUNK_SIZE

    def _vllm_layer(self, layer):
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

        # Built on the device as a model is (its conv_weights buffer is a view of conv1d.weight, which
        # a later move would split in two).
        with torch.device(self.ctx.device):
            mixer = MambaMixer2(hidden_size=HIDDEN_SIZE, ssm_state_size=layer.head_k_dim,
                                conv_kernel_size=layer.conv_weights.shape[1],
                                intermediate_size=layer.num_v_heads * layer.head_v_dim,
                                use_conv_bias=layer.bias is not None, use_bias=False, n_groups=layer.num_k_heads,
                                num_heads=layer.num_v_heads, head_dim=layer.head_v_dim, activation=layer.activation,
                                model_config=self.vllm_config.model_config,
                                cache_config=self.vllm_config.cache_config, prefix=layer_name(layer))
        with torch.no_grad():
            mixer.conv1d.weight.copy_(layer.conv_weights[:, None, :])
            if layer.bias is not None:
                mixer.conv1d.bias.copy_(layer.bias)
            mixer.A.copy_(-torch.exp(layer.A_log.float()))
            mixer.D.data = layer.D.clone()
            mixer.dt_bias.data = layer.dt_bias.clone()
        pool = self.ctx.state_pool
        mixer.kv_cache = (pool.conv(layer.layer_id).transpose(-1, -2), pool.temporal(layer.layer_id))
        return mixer

    def forward(self, xbc, dt, layer, batch):
        from vllm.utils.torch_utils import _encode_layer_name

        rt = runtime()
        tokens, width = xbc.shape[0], layer.num_v_heads * layer.head_v_dim
        xbc, dt = self.to_vllm_order(xbc, dt)
        projected = torch.cat([xbc.new_zeros((tokens, width)), xbc, dt], dim=-1)
        out = torch.empty((tokens, width), dtype=xbc.dtype, device=xbc.device)
        with rt.set_current_vllm_config(self.vllm_config), rt.set_forward_context(self.metadata, self.vllm_config):
            torch.ops.vllm.mamba_mixer2(projected, out, _encode_layer_name(layer_name(layer)))
        return self.to_kit_order(out).view(tokens, layer.num_v_heads, layer.head_v_dim)
