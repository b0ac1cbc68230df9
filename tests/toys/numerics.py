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
