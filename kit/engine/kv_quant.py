"""A quantized (fp8) KV cache, as SGLang's and vLLM's pools hold one: per layer, one scale for K
and one for V (per tensor), kept on the layer (`k_scale`, `v_scale`). What the pool stores is
fp8(k / k_scale); what a backend reads back is fp8 * k_scale. The pool's write, the pool's
poison, the reference and the KV check all quantize here, so they agree byte for byte.

The scales are powers of two: k / k_scale is then exact in every float dtype, and the stored
bytes do not depend on where (in which precision) a backend divides. They differ per layer and
between K and V, and none is 1, so a scale applied twice, never, to K only, taken from the
other layer or K's used for V moves the output."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

# Per layer id, (k_scale, v_scale) of the model's layers (kit.engine.layer.model_layers). An MLA
# layer's latent is K and V at once: it takes k_scale for both (its one buffer has one scale).
KV_SCALES: Dict[int, Tuple[float, float]] = {0: (2.0, 0.25), 1: (0.5, 4.0)}


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(x: torch.Tensor, scale: Optional[float], dtype: torch.dtype) -> torch.Tensor:
    """What a pool of `dtype` stores for x (a new tensor; x is left as it was). Unquantized
    pools store x cast to their dtype."""
    if not is_quantized(dtype):
        return x.to(dtype)
    return (x.to(torch.float32) / scale).to(dtype)


def dequantize(stored: torch.Tensor, scale: Optional[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values a backend reads from stored ones, in `dtype` (exact: fp8 times a power of two)."""
    if not is_quantized(stored.dtype):
        return stored.to(dtype)
    return (stored.to(torch.float32) * scale).to(dtype)


def as_stored(x: torch.Tensor, scale: Optional[float], dtype: torch.dtype) -> torch.Tensor:
    """x as a backend reads it back from a pool of `dtype` (float32 where quantized; else x)."""
    return dequantize(quantize(x, scale, dtype), scale) if is_quantized(dtype) else x
