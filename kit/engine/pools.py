"""The objects a backend reads and writes: request-to-token table and paged KV pool.

Conventions (SPEC): slot 0 is scratch, request row 0 is the dummy request
(all zeros); real requests use rows >= 1 and slots >= page_size. Every slot a
batch does not own holds poison (KVPool.reset, before each batch is installed).
A quantized (fp8) pool stores fp8(x / scale) with each layer's scales
(kit.engine.kv_quant.KV_SCALES, the model layers' k_scale / v_scale), its poison too.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch

from kit.engine.fingerprint import fingerprint
from kit.engine.kv_quant import KV_SCALES, dequantize, is_quantized, quantize

# The layer every case runs on. The pool holds one more layer before it, so a
# backend that ignores layer_id reads poison and writes the wrong layer.
NUM_LAYERS = 2
CASE_LAYER_ID = 1

# Poison: unowned slots hold K that wins softmax mass and V far from real
# values, so reading one moves the output well past any tolerance.
POISON_K_STD = 4.0
POISON_V_MEAN = 20.0
POISON_V_STD = 5.0
POISON_SEED = 1


class ReqToTokenPool:
    def __init__(self, max_reqs: int, max_context: int, device):
        self.size = max_reqs
        self.max_context_len = max_context
        self.req_to_token = torch.zeros((max_reqs, max_context), dtype=torch.int32, device=device)


class KVPool:
    """Per layer k_buffer/v_buffer[num_slots, num_kv_heads, head_dim], in pages of page_size slots.
    The poison is drawn once, with the pool, and copied back by reset(): a copy costs a
    fraction of drawing it again (on CPU most of what installing a batch cost)."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype, device):
        self.size = num_slots
        self.page_size = 1  # set per case by the fixture
        self.head_num = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self._init_scales()
        shape = (NUM_LAYERS, num_slots, num_kv_heads, head_dim)
        # Every layer in one allocation (k_buffer/v_buffer are its views, as backends index them):
        # the pool is reset, snapshot and compared with a few operations for all layers at once.
        self.k_layers = torch.empty(shape, dtype=dtype, device=device)
        self.v_layers = torch.empty(shape, dtype=dtype, device=device)
        self.k_buffer: List[torch.Tensor] = list(self.k_layers.unbind(0))
        self.v_buffer: List[torch.Tensor] = list(self.v_layers.unbind(0))
        self.draw_poison()

    def _init_scales(self) -> None:
        """Per layer id, the (k_scale, v_scale) its values are stored with (None: unquantized)."""
        self.quantized = is_quantized(self.dtype)
        self.scales = [KV_SCALES[i] if self.quantized else (None, None) for i in range(NUM_LAYERS)]

    def _k_scale(self, layer_id: int) -> Optional[float]:
        return self.scales[layer_id][0]

    def _v_scale(self, layer_id: int) -> Optional[float]:
        return self.scales[layer_id][1]

    def stored(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """What the pool holds for K and V of layer `layer_id` (quantized with its scales)."""
        return quantize(k, self._k_scale(layer_id), self.dtype), quantize(v, self._v_scale(layer_id), self.dtype)

    def _drawn(self, like: torch.Tensor) -> torch.Tensor:
        """An empty tensor shaped as `like` to draw poison into: float32 where the pool is
        quantized (stored by _stored_layers, so that what a backend reads is poison as designed)."""
        return torch.empty_like(like, dtype=torch.float32 if self.quantized else like.dtype)

    def _stored_layers(self, drawn: torch.Tensor, scale_of) -> torch.Tensor:
        """[layers, ...] values as the pool stores them, each layer with its scale (`scale_of(layer_id)`)."""
        if not self.quantized:
            return drawn
        return torch.stack([quantize(layer, scale_of(lid), self.dtype) for lid, layer in enumerate(drawn)])

    def _poison_like(self, layers: torch.Tensor, mean: float, std: float, gen, scale_of) -> torch.Tensor:
        """Poison drawn layer by layer, stored with each layer's scale."""
        out = self._drawn(layers)
        for layer in out:
            layer.normal_(mean, std, generator=gen)
        return self._stored_layers(out, scale_of)

    def draw_poison(self) -> None:
        gen = torch.Generator(device=self.device).manual_seed(POISON_SEED)
        # K then V: the values the pool always had
        self._poison_k = self._poison_like(self.k_layers, 0.0, POISON_K_STD, gen, self._k_scale)
        self._poison_v = self._poison_like(self.v_layers, POISON_V_MEAN, POISON_V_STD, gen, self._v_scale)
        self._sealed = fingerprint([self._poison_k, self._poison_v])

    def value_bound(self) -> torch.Tensor:
        """The largest |V| a backend can read from the pool (float32, on the pool's device)."""
        return torch.stack([dequantize(v, self._v_scale(lid)).abs().max() for lid, v in enumerate(self.v_layers)]
                           ).max()

    def sealed_poison(self) -> Tuple[torch.Tensor, List[torch.Tensor], str]:
        """(fingerprint, tensors, name) of the poison, for kit.engine.fingerprint.unchanged: it is kept for
        every run the pool serves, and drawn again if it changed (a stray write would otherwise
        leave slots a backend must not read less poisonous, unseen)."""
        return self._sealed, [self._poison_k, self._poison_v], "the KV pool's poison"

    def reset(self) -> None:
        """Every slot of every layer back to poison."""
        self.k_layers.copy_(self._poison_k)
        self.v_layers.copy_(self._poison_v)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """Quantized with the scales of the layer given (a backend's layer object)."""
        self.k_buffer[layer.layer_id][loc] = quantize(cache_k, getattr(layer, "k_scale", None), self.dtype)
        self.v_buffer[layer.layer_id][loc] = quantize(cache_v, getattr(layer, "v_scale", None), self.dtype)

    def snapshot(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copies of every layer's K and V: [layers, slots, heads, head_dim] each."""
        return self.k_layers.clone(), self.v_layers.clone()


class MLAKVPool(KVPool):
    """MLA's pool (the layout of SGLang's MLATokenToKVPool): per layer ONE latent buffer
    [num_slots, 1, kv_lora_rank + rope_dim], the compressed KV then the rotary key part.
    k_buffer is that buffer, v_buffer a view of its first kv_lora_rank columns (no copy):
    the KV check, poison, reset and snapshot cover the one buffer."""

    def __init__(self, num_slots: int, head_dim: int, kv_lora_rank: int, dtype, device):
        self.size = num_slots
        self.page_size = 1
        self.head_num = 1
        self.head_dim = head_dim
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = head_dim - kv_lora_rank
        self.dtype = dtype
        self.device = torch.device(device)
        self._init_scales()
        self.k_layers = torch.empty((NUM_LAYERS, num_slots, 1, head_dim), dtype=dtype, device=device)
        self.v_layers = self.k_layers[..., :kv_lora_rank]
        self.kv_buffer: List[torch.Tensor] = list(self.k_layers.unbind(0))
        self.k_buffer = self.kv_buffer
        self.v_buffer: List[torch.Tensor] = list(self.v_layers.unbind(0))
        self.draw_poison()

    def draw_poison(self) -> None:
        """The latent part as V's poison (far from real values), the rope part as K's (it
        adds score mass): reading an unowned slot moves the output past tolerance."""
        gen = torch.Generator(device=self.device).manual_seed(POISON_SEED)
        poison = self._drawn(self.k_layers)
        poison[..., :self.kv_lora_rank].normal_(POISON_V_MEAN, POISON_V_STD, generator=gen)
        poison[..., self.kv_lora_rank:].normal_(0.0, POISON_K_STD, generator=gen)
        self._poison = self._stored_layers(poison, self._k_scale)
        self._sealed = fingerprint([self._poison])

    def sealed_poison(self) -> Tuple[torch.Tensor, List[torch.Tensor], str]:
        return self._sealed, [self._poison], "the KV pool's poison"

    def reset(self) -> None:
        self.k_layers.copy_(self._poison)

    def _v_scale(self, layer_id: int) -> Optional[float]:
        """V is the latent's first columns: stored with the latent's one scale (k_scale)."""
        return self._k_scale(layer_id)

    def set_kv_buffer(self, layer, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """cache_k is the whole latent row (cache_v, its view, is not written again), as SGLang's;
        quantized with the scale of the layer given (k_scale)."""
        self.kv_buffer[layer.layer_id][loc] = quantize(cache_k, getattr(layer, "k_scale", None), self.dtype)

    def set_mla_kv_buffer(self, layer, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                          cache_k_rope: torch.Tensor) -> None:
        """The latent row written from its two parts (SGLang's MLA write)."""
        self.set_kv_buffer(layer, loc, torch.cat([cache_k_nope, cache_k_rope], dim=-1), None)

    def get_mla_kv_buffer(self, layer, loc: torch.Tensor, dst_dtype=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The stored rows (as SGLang's: a quantized latent is returned as stored, unscaled)."""
        rows = self.kv_buffer[layer.layer_id][loc].to(dst_dtype or self.dtype)
        return rows[..., :self.kv_lora_rank], rows[..., self.kv_lora_rank:]

    def snapshot(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """A copy of every layer's latent, and its V view."""
        k = self.k_layers.clone()
        return k, k[..., :self.kv_lora_rank]


@dataclasses.dataclass
class Pools:
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fits(have: Optional[Pools], num_slots: int, max_reqs: int, max_context: int) -> bool:
    return (have is not None and have.token_to_kv_pool.size >= num_slots and have.req_to_token_pool.size >= max_reqs
            and have.req_to_token_pool.max_context_len >= max_context)


class PoolCache:
    """Pools built once per worker and reused while big enough (SPEC speed rule); their poison is
    checked before each run (kit.engine.fixture.fixtures_for)."""

    def __init__(self):
        self._pools: Dict[tuple, Pools] = {}

    def clear(self) -> None:
        self._pools.clear()

    def new_bytes(self, *, num_slots: int, max_reqs: int, max_context: int, num_kv_heads: int,
                  head_dim: int, dtype, device, kv_lora_rank: int = 0) -> int:
        """About the bytes get() would allocate for these arguments (0: the cached pool fits): K, V
        and their poison, and the int32 req_to_token table, at least as large as asked."""
        if _fits(self._pools.get((num_kv_heads, head_dim, kv_lora_rank, dtype, str(device))),
                 num_slots, max_reqs, max_context):
            return 0
        heads = 1 if kv_lora_rank else num_kv_heads
        size = torch.empty(0, dtype=dtype).element_size()
        return (4 * NUM_LAYERS * _round_up_pow2(num_slots) * heads * head_dim * size
                + 4 * _round_up_pow2(max_reqs) * _round_up_pow2(max_context))

    def get(self, *, num_slots: int, max_reqs: int, max_context: int, num_kv_heads: int,
            head_dim: int, dtype, device, kv_lora_rank: int = 0) -> Pools:
        """kv_lora_rank > 0: an MLA pool (MLAKVPool, one KV head)."""
        key = (num_kv_heads, head_dim, kv_lora_rank, dtype, str(device))
        have = self._pools.get(key)
        if not _fits(have, num_slots, max_reqs, max_context):
            if have is not None:  # grow to cover both the old and the new need
                num_slots = max(num_slots, have.token_to_kv_pool.size)
                max_reqs = max(max_reqs, have.req_to_token_pool.size)
                max_context = max(max_context, have.req_to_token_pool.max_context_len)
            self._pools.pop(key, None)
            slots = _round_up_pow2(num_slots)
            kv = (MLAKVPool(slots, head_dim, kv_lora_rank, dtype, device) if kv_lora_rank
                  else KVPool(slots, num_kv_heads, head_dim, dtype, device))
            have = Pools(ReqToTokenPool(_round_up_pow2(max_reqs), _round_up_pow2(max_context), device), kv)
            self._pools[key] = have
        return have


POOL_CACHE = PoolCache()
