"""torch_native with declared numerics (kit.engine.numerics), followed or not: the vehicles of
tests/test_kit_numerics.py."""
from __future__ import annotations

import torch

from backends.torch_native import TorchNativeBackend
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
