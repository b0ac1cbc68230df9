"""SGLang's own KDA backend (KDAAttnBackend, sglang 0.5.23), unmodified, behind the kit's recurrent
protocol, run as Kimi Linear runs it (models/kimi_linear.py KimiDeltaAttention.forward: inside
HybridLinearAttnBackend, its RadixLinearAttention called with the projection before the conv, the
forget gate's input `a` and beta's `b`), over the pools and batch of backends.sglang.linear.

KDA's MambaPool keeps a conv window as [kernel - 1, dim] (kda_backend.py KDAAttnBackend.__init__),
the transpose of GDN's and the kit's [dim, kernel - 1]: its pool is handed the kit's windows
transposed (a view), which its backend transposes back before its conv kernels. Kimi Linear gates
without a lower bound (`gate_lower_bound` unset: lower_bound None, and no FlashInfer prefill default).
"""
from __future__ import annotations

import dataclasses
from importlib import import_module
from typing import Optional

import torch

from backends.sglang.linear import SGLangLinearBackend, cpu_prefill_reason
from kit.engine.numerics import PREFILL
from kit.modes import ForwardMode

KDA_BACKEND = "sglang.srt.layers.attention.linear.kda_backend"
LINEAR_UTILS = "sglang.srt.layers.attention.linear.utils"


class SGLangKDABackend(SGLangLinearBackend):
    name = "sglang_kda"
    attention_kinds = ("kda",)
    numerics = dataclasses.replace(SGLangLinearBackend.numerics, qk_cast=PREFILL)  # l2norm_fwd before its kernels
    engine_modules = (KDA_BACKEND,)
    # On CPU its decode and verify run in Triton's interpreter (its prefill does not, see supports()): a case each.
    ci_cases = {"decode": ("kda_decode_bf16_long",), "target_verify": ("kda_verify_saved_bf16",)}

    @classmethod
    def _kind_problem(cls, case) -> Optional[str]:
        if case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED) and not torch.cuda.is_available():
            return cpu_prefill_reason(case, "KDAAttnBackend", "fla/kda.py:1300 chunk_kda")
        return None

    @staticmethod
    def _conv_view(conv):
        return conv.transpose(-1, -2)

    def _hf_config(self, layer):
        """Kimi Linear's config, as far as SGLang's KDA path reads it: no mamba_chunk_size (its prefill
        chunks by 64)."""
        from transformers import PretrainedConfig

        return PretrainedConfig()

    def _linear_backend(self, runner):
        # As attention_registry.py builds a Kimi Linear model's backends: no lower bound, so no
        # FlashInfer prefill default (kda_backend.py flashinfer_kda_prefill_default).
        runner.linear_attn_backends = import_module(LINEAR_UTILS).resolve_linear_attn_backends(prefill_default=None)
        return self._impl_class()(runner)

    def _impl_class(self):
        return import_module(KDA_BACKEND).KDAAttnBackend

    def forward(self, mixed_qkv, g, b, layer, batch):
        mode = self.forward_batch.forward_mode
        # Kimi Linear's shapes: the forget gate [T, H K] for a decode or verify, [1, T, H, K] for a
        # prefill; beta [1, T, H].
        a = g if mode.is_decode() or mode.is_target_verify() else g.unflatten(-1, (-1, layer.head_k_dim))[None]
        return self._call_layer(layer, mixed_qkv, a, b[None])
