"""vLLM's GDN_ATTN (gated delta net, Qwen3-Next / Qwen3.5), unmodified, behind the kit's recurrent
protocol (kit.engine.kinds.recurrent).

What is mapped, and nothing more (a bug here could hide one in vLLM):
- each kit layer -> vLLM's own QwenGatedDeltaNetAttention, built as Qwen3-Next builds it (a
  Qwen3NextConfig of the kit's heads, widths and conv width), its conv1d weight, A_log and dt_bias
  the kit layer's; its `kv_cache` the kit's pools of that layer: the conv window (vLLM's default
  `SD` layout, [blocks, state_len, dim], handed as the transposed view of the pool's
  [slots, dim, state_len], which the layer transposes back) and the recurrent state [slots, Hv, V, K]
  (float32: vLLM's --mamba-ssm-cache-dtype float32, as Qwen3.5's config sets it);
- the kit's RecurrentBatch -> vLLM's CommonAttentionMetadata as its runner renders a step
  (backends/vllm/recurrent.py); GDNAttentionMetadataBuilder.build() makes the metadata;
- forward -> the layer's own core op, torch.ops.vllm.qwen_gdn_attention_core (the call of its
  forward_cuda after the input projection: conv1d, then fla's chunk_gated_delta_rule for prefill
  rows and fused_sigmoid_gating_delta_rule_update for decode and verify rows, on the slot-indexed
  pools), inside vLLM's forward context. Its output is the core attention before the gated norm,
  which is what the kit judges.

Every op it runs is Triton (vLLM's causal_conv1d and its flash-linear-attention copy), on CUDA only
(CPU_REASON). On Hopper with bf16 heads of 128, vLLM's forward_cuda may take other paths than this
op: FlashInfer's GDN prefill inside it (its chunk_gated_delta_rule's choice, which this op follows),
and with speculative decoding the fused CUDA MTP kernel with the gated norm (VLLM_GDN_DECODE_KERNEL=
cuda, qwen_gdn_attention_core_fused_norm_packed), whose output is past the norm: not covered here. The speculative rule is vLLM's (the profile's
`recurrent_verify`, kit.engine.recurrent_rules): a verify writes the state after each of its
tokens to the request's block of that token, and the next step continues from block
num_accepted_tokens - 1 and the conv window at that offset.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from backends.qwen3_next import qwen3_next_config
from backends.vllm.adapter import runtime
from backends.vllm.recurrent import VllmRecurrentBackend
from kit.engine.numerics import PREFILL
from kit.modes import ForwardMode

# Why the layer runs on CUDA only: its ops on vLLM's CPU platform, and its Triton kernels in the interpreter.
CPU_REASON = ("vLLM's GDN layer on CPU: its CPU platform's conv ops are compiled ones (_C.causal_conv1d_update_cpu_vec, "
              "ops/cpu/causal_conv1d.py; not in the CPU wheel the kit installs), and its Triton kernels do not run in "
              "Triton's interpreter (causal_conv1d_update: 'mask has unsupported dtype'; fla's chunk kernels' loop index "
              "a Python int, chunk_delta_h.py:144)")


def layer_name(layer) -> str:
    """A GDN layer's name in vLLM's forward context, as Qwen3-Next's decoder layer names it."""
    return f"model.layers.{layer.layer_id}.linear_attn"


class VllmGdnBackend(VllmRecurrentBackend):
    """GDN_ATTN (v1/attention/backends/gdn_attn.py) with Qwen3-Next's GDN layer
    (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py)."""

    name = "vllm_gdn"
    attention_kinds = ("gdn",)
    builder_class = ("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadataBuilder")
    layer_name = staticmethod(layer_name)
    cpu_reason = CPU_REASON
    # l2norm_fwd's q and k in the model's dtype, before its kernels
    numerics = dataclasses.replace(VllmRecurrentBackend.numerics, qk_cast=PREFILL)

    @classmethod
    def load_engine(cls) -> None:
        """What a run imports of vLLM (the offline bundle traces it): the runtime, the builder, the layer."""
        runtime()
        from transformers import Qwen3NextConfig  # noqa: F401
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention  # noqa: F401
        from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder  # noqa: F401

    @classmethod
    def _kind_problem(cls, case) -> Optional[str]:
        if case.dtype == "fp32" and _has_prefill_rows(case):
            return ("fp32 prefill rows: vLLM's chunk_gated_delta_rule refuses float32 (flash_linear_attention/"
                    "ops/chunk.py:213)")
        return None

    def _vllm_layer(self, layer):
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

        hf = qwen3_next_config(layer)
        gdn = QwenGatedDeltaNetAttention(hf, self.vllm_config, prefix=layer_name(layer)).to(self.ctx.device)
        with torch.no_grad():
            gdn.conv1d.weight.copy_(layer.conv_weights[:, None, :])
            gdn.A_log.copy_(layer.A_log)
            # The kit's dt_bias is float32 (a checkpoint's may be): the kernels read it as float32 either way.
            gdn.dt_bias.data = layer.dt_bias.clone()
        pool = self.ctx.state_pool
        gdn.kv_cache = (pool.conv(layer.layer_id).transpose(-1, -2), pool.temporal(layer.layer_id))
        return gdn

    def forward(self, mixed_qkv, a, b, layer, batch):
        from vllm.utils.torch_utils import _encode_layer_name

        rt = runtime()
        out = torch.zeros((mixed_qkv.shape[0], layer.num_v_heads, layer.head_v_dim), dtype=mixed_qkv.dtype,
                          device=mixed_qkv.device)
        # The model hands the op a projection of its own (forward_cuda's torch.cat or split of
        # in_proj_qkvz's output), which its conv update overwrites in place: a copy of the kit's (the
        # permutation to vLLM's order makes it).
        mixed_qkv, a, b = self.to_vllm_order(mixed_qkv, a, b)
        with rt.set_current_vllm_config(self.vllm_config), rt.set_forward_context(self.metadata, self.vllm_config):
            torch.ops.vllm.qwen_gdn_attention_core(mixed_qkv, b.contiguous(), a.contiguous(), out,
                                                   layer_name=_encode_layer_name(layer_name(layer)))
        return self.to_kit_order(out)


def _has_prefill_rows(case) -> bool:
    """Whether vLLM's builder sends some row of the case to the chunk kernel: a new request, or an
    extend of more than one token."""
    if case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
        return True
    return case.mode == ForwardMode.DECODE and 0 in case.prefix
