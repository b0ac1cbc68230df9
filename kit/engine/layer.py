"""The attention layer handed to forward(): the fields of a serving engine's attention layer."""
from __future__ import annotations

import dataclasses
import random
import zlib
from typing import TYPE_CHECKING, Optional, Tuple

from kit.engine.case import Case
from kit.engine.kv_quant import KV_SCALES
from kit.engine.pools import CASE_LAYER_ID

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class Layer:
    layer_id: int
    tp_q_head_num: int
    tp_k_head_num: int
    head_dim: int
    scaling: float
    logit_cap: float = 0.0  # 0 = off; else cap * tanh(score / cap)
    sliding_window_size: int = -1  # -1 = off; else a query at p sees keys p-W..p
    # MLA: head_dim = kv_lora_rank + rope_dim (the latent row), one KV head; V and each head's
    # output are the latent's first kv_lora_rank columns. 0: dense attention.
    kv_lora_rank: int = 0
    rope_dim: int = 0
    # Sparse MLA: the indexer's top-k, the width of a batch's topk_indices (a model's config holds
    # it: DeepSeek-V3.2's index_topk). 0: every key attended.
    index_topk: int = 0
    # A quantized KV cache's per-tensor scales (SGLang's RadixAttention.k_scale / v_scale): the pool
    # stores fp8(k / k_scale) and a backend reads fp8 * k_scale. None: the cache is not quantized.
    k_scale: Optional[float] = None
    v_scale: Optional[float] = None
    # Attention sinks: one logit per query head (float32 values), in the units of the scaled
    # (and capped) scores, itself neither scaled nor capped; it joins each query's softmax
    # denominator and carries no value: out = sum_j e^(s_j - m) v_j / (e^(sink - m) + sum_j e^(s_j - m)).
    # (): no sinks.
    sinks: Tuple[float, ...] = ()

    def sinks_tensor(self, device, dtype=None) -> "torch.Tensor":
        """[tp_q_head_num] the sink logits on `device` (float32 unless `dtype`), as a model holds them."""
        import torch  # here: the layer is imported where torch must not be
        return torch.tensor(self.sinks, dtype=dtype or torch.float32, device=device)

    @property
    def tp_v_head_num(self) -> int:
        return self.tp_k_head_num

    @property
    def qk_head_dim(self) -> int:
        return self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.kv_lora_rank if self.kv_lora_rank else self.head_dim

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @classmethod
    def for_case(cls, case: Case, layer_id: int = CASE_LAYER_ID) -> "Layer":
        """The layer the case describes (layer CASE_LAYER_ID of its model), with the KV scales of
        `layer_id` where the case's KV cache is quantized."""
        k_scale, v_scale = KV_SCALES[layer_id] if case.kv_dtype else (None, None)
        return cls(
            layer_id=layer_id,
            tp_q_head_num=case.num_q_heads,
            tp_k_head_num=case.num_kv_heads,
            head_dim=case.head_dim,
            scaling=case.sm_scale,
            logit_cap=case.cap,
            sliding_window_size=case.window,
            kv_lora_rank=case.kv_lora_rank,
            rope_dim=case.rope_dim,
            index_topk=case.index_topk,
            k_scale=k_scale,
            v_scale=k_scale if case.is_mla else v_scale,  # MLA: one latent, one scale
            sinks=sink_logits(case, layer_id),
        )


# A hybrid model's other layer: a window that cuts keys in every request of the catalog's hybrid cases,
# and a cap its logits pass well (at half the case's scaling they spread about +-2): dropping it moves
# every head of every row past the per-head limit, not only some layouts' draws.
HYBRID_WINDOW, HYBRID_CAP = 8, 1.0
# Sink logits are drawn in [SINK_LOW, SINK_HIGH], one per stratum of that range per head (so that
# a layer has sinks that take most of a short context's mass and negative ones), on a grid of
# SINK_GRID: exact in bf16 and fp16, so a model keeping them in either dtype keeps them exactly.
SINK_LOW, SINK_HIGH, SINK_GRID = -3.0, 5.0, 1 / 32


def sink_logits(case: Case, layer_id: int) -> Tuple[float, ...]:
    """The case's sink logits of one layer (per query head), or () without sinks. Seeded from the
    layer config alone: every batch of a run (kit.engine.variants: other names, lengths and data
    seeds; a MIXED graph run's EXTEND batch, another mode) runs the same model."""
    if not case.sinks:
        return ()
    model = (case.heads, case.head_dim, case.dtype, case.window, case.cap, case.scale, case.hybrid)
    rng = random.Random(zlib.crc32(f"sinks/{model}/{layer_id}".encode()))
    heads = case.num_q_heads
    strata = rng.sample(range(heads), heads)
    width = (SINK_HIGH - SINK_LOW) / heads
    return tuple(round((SINK_LOW + (s + rng.random()) * width) / SINK_GRID) * SINK_GRID for s in strata)


def model_layers(case: Case) -> Tuple[Layer, ...]:
    """The model a case runs, in layer order: every step calls forward once per layer on
    the same metadata. Layer 0 repeats the case's config (with its own KV scales and sinks), or
    (hybrid) differs in window, scale and cap as hybrid models' layers do; layer 1 is the case's.
    With sinks, every layer has its own (gpt-oss: its window and full-attention layers alike)."""
    layer = Layer.for_case(case)
    other = Layer.for_case(case, layer_id=0)
    if case.hybrid:
        other = dataclasses.replace(
            other, scaling=layer.scaling * 0.5, logit_cap=0.0 if layer.logit_cap > 0 else HYBRID_CAP,
            sliding_window_size=-1 if layer.sliding_window_size >= 0 else HYBRID_WINDOW)
    return (other, layer)
