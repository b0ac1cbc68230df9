"""torch_native with declared numerics (kit.engine.numerics), followed or not: the vehicles of
tests/test_kit_numerics.py."""
from __future__ import annotations

import math

import torch

from backends.torch_native import TorchNativeBackend, _sink_column
from kit.engine.kv_quant import as_stored, is_quantized
from kit.engine.numerics import ALL, Numerics


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 values truncated to TF32's 10 mantissa bits, as a tensor core takes them."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


class QuantizesQ(TorchNativeBackend):
    """Quantizes q to the KV cache's fp8 type with q_scale = k_scale, as vLLM's
    supports_quant_query_input backends do, and declares it."""

    name = "quantizes_q"
    numerics = Numerics(q_fp8=ALL)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        dtype = batch.token_to_kv_pool.dtype
        if is_quantized(dtype):
            q = as_stored(q, layer.k_scale, dtype).to(q.dtype)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class DeclaresQButDoesNot(TorchNativeBackend):
    """Declares q quantized to fp8 but attends q as handed."""

    name = "declares_q_but_does_not"
    numerics = Numerics(q_fp8=ALL)


class QuantizesQUndeclared(QuantizesQ):
    """Quantizes q to fp8 but declares exact numerics."""

    name = "quantizes_q_undeclared"
    numerics = Numerics()


class TruncatesToTF32(TorchNativeBackend):
    """fp32 q taken as a TF32 operand of QK (its low mantissa bits dropped), declared."""

    name = "truncates_to_tf32"
    numerics = Numerics(tf32_dots=ALL)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        return super().forward(_tf32(q) if q.dtype == torch.float32 else q, k, v, layer, batch, save_kv_cache)


class TruncatesToTF32Undeclared(TruncatesToTF32):
    """The same, declared exact."""

    name = "truncates_to_tf32_undeclared"
    numerics = Numerics()


class VScaleTwiceToo(QuantizesQUndeclared):
    """A second bug where the first already fails: a quantized cache's V multiplied by its scale twice."""

    name = "v_scale_twice_too"

    def _attend(self, scores, vals, layer):
        return super()._attend(scores, vals if layer.v_scale is None else vals * layer.v_scale, layer)


class QuantizesGroupedQ(QuantizesQ):
    """Quantizes q only where query heads share a KV head, as SGLang's decode kernels cast it, and
    declares so (grouped_only)."""

    name = "quantizes_grouped_q"
    numerics = Numerics(q_fp8=ALL, grouped_only=ALL)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if layer.tp_q_head_num > layer.tp_k_head_num:
            return super().forward(q, k, v, layer, batch, save_kv_cache)
        return TorchNativeBackend.forward(self, q, k, v, layer, batch, save_kv_cache)


class DeclaresGroupedQButQuantizesEvery(QuantizesQ):
    """Declares q quantized only where query heads share a KV head, but quantizes every query."""

    name = "declares_grouped_q_but_quantizes_every"
    numerics = QuantizesGroupedQ.numerics


class QuantizesLatentQ(TorchNativeBackend):
    """Quantizes an MLA query's latent columns to fp8 (q_scale = k_scale), its rope columns as handed, and
    declares so (rope_as_handed)."""

    name = "quantizes_latent_q"
    numerics = Numerics(q_fp8=ALL, rope_as_handed=ALL)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        dtype = batch.token_to_kv_pool.dtype
        if is_quantized(dtype):
            rank = layer.kv_lora_rank
            q = torch.cat([as_stored(q[..., :rank], layer.k_scale, dtype).to(q.dtype), q[..., rank:]], dim=-1)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class DeclaresRopeAsHandedButQuantizesIt(QuantizesQ):
    """Declares an MLA query's rope columns as handed, but quantizes the whole query."""

    name = "declares_rope_as_handed_but_quantizes_it"
    numerics = QuantizesLatentQ.numerics


class QuantizesLatentQUndeclared(QuantizesLatentQ):
    """Quantizes an MLA query's latent columns only, but declares the whole query quantized."""

    name = "quantizes_latent_q_undeclared"
    numerics = QuantizesQ.numerics


class SumsRoundedProbs(TorchNativeBackend):
    """Rounds each exp(s - max) to the model's dtype before the PV product and before the row sum that
    divides it and gives the log-sum-exp, as FlashInfer's prefill kernels do, and declares it (p_half)."""

    name = "sums_rounded_probs"
    numerics = Numerics(p_half=ALL)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        self.model_dtype = q.dtype
        return super().forward(q, k, v, layer, batch, save_kv_cache)

    def _rounded(self, scores, layer):
        """([h, q, k] each key's exp(s - max) in the model's dtype, [h, q, 1] the max, the sink's term unrounded)."""
        logits = torch.cat([scores, _sink_column(scores, layer)], dim=-1) if layer.sinks else scores
        top = logits.amax(dim=-1, keepdim=True)
        terms = torch.exp(logits - top)
        keys = terms[..., :scores.shape[-1]].to(self.model_dtype).float()
        return keys, top, terms[..., scores.shape[-1]:].sum(dim=-1, keepdim=True)

    def _attend(self, scores, vals, layer):
        keys, _, sink = self._rounded(scores, layer)
        return torch.einsum("hqk,khd->qhd", keys / (keys.sum(dim=-1, keepdim=True) + sink), vals)

    def _lse(self, scores, layer):
        keys, top, sink = self._rounded(scores, layer)
        return (top + torch.log(keys.sum(dim=-1, keepdim=True) + sink)).squeeze(-1)


class SumsRoundedProbsUndeclared(SumsRoundedProbs):
    """The same, declared exact."""

    name = "sums_rounded_probs_undeclared"
    numerics = Numerics()


class SumsRoundedProbsLseInLog2(SumsRoundedProbs):
    """Declared p_half, and a second bug its envelope must not hide: the LSE handed on in base 2."""

    name = "sums_rounded_probs_lse_in_log2"

    def _lse(self, scores, layer):
        return super()._lse(scores, layer) / math.log(2)
