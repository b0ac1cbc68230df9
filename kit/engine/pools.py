"""The objects a backend reads and writes: request-to-token table and paged KV pool.

Conventions (SPEC): page 0 (which holds slot 0, an engine's scratch or null block) is never a
request's, request row 0 is the dummy request (all zeros); real requests use rows >= 1 and
slots >= page_size. Every slot a batch does not own holds poison (KVPool.reset, before each
batch is installed). The pool keeps every layer's KV in one tensor in an engine's storage layout
(kit.engine.storage), so that a backend is handed the layout its engine builds; the kit reads and
writes through K and V views of it. A quantized (fp8) pool stores fp8(x / scale) with each
layer's scales (kit.engine.kv_quant.KV_SCALES, the model layers' k_scale / v_scale), its poison
too.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Optional, Tuple

import torch

from kit.engine.depth import NUM_LAYERS
from kit.engine.fingerprint import fingerprint
from kit.engine.kinds import Geometry
from kit.engine.kv_quant import KV_SCALES, dequantize, is_quantized, quantize
from kit.engine.storage import KVStorage, flat

CASE_LAYER_ID = 1  # the layer every case runs on (kit.engine.depth: the one before it)

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
    """Every layer's KV in one tensor, `layers` [NUM_LAYERS, *storage shape]; per layer the K and
    V views `k_blocks` / `v_blocks` [blocks, block, heads, width], and where the layout allows it
    without a copy `k_buffer` / `v_buffer` [slots, heads, width] (SGLang's pool interface). An MLA
    pool (V a view of K's leading columns) is also SGLang's MLATokenToKVPool: `kv_buffer`, its
    ranks, and the latent's two writers. The poison is drawn once, with the pool, and copied back
    by reset()."""

    def __init__(self, storage: KVStorage, num_blocks: int, block: int, geometry: Geometry, dtype, device):
        problem = storage.check(geometry)
        if problem:
            raise ValueError(problem)
        self.storage, self.geometry = storage, geometry
        self.num_blocks, self.block = num_blocks, block
        self.size = num_blocks * block
        self.page_size = block  # a flat layout's is set per case (kit.engine.fixture)
        self.head_num, self.head_dim, self.v_head_dim = geometry.heads, geometry.k_width, geometry.v_width
        self.dtype = dtype
        self.device = torch.device(device)
        self.quantized = is_quantized(dtype)
        self.scales = [KV_SCALES[i] if self.quantized else (None, None) for i in range(NUM_LAYERS)]
        if geometry.v_in_k:  # one latent, one scale (its k_scale)
            self.scales = [(k, k) for k, _ in self.scales]
        # zeros: a layout's gaps (no view's) hold defined bytes, as the poison's fingerprint needs
        self.layers = torch.zeros((NUM_LAYERS,) + storage.shape(num_blocks, block, geometry), dtype=dtype,
                                  device=device)
        self.k_blocks = [self._view(storage.k_view, t) for t in self.layers.unbind(0)]
        self.v_blocks = [self._view(storage.v_view, t) for t in self.layers.unbind(0)]
        self.k_buffer: List[Optional[torch.Tensor]] = [flat(k) for k in self.k_blocks]
        self.v_buffer: List[Optional[torch.Tensor]] = [flat(v) for v in self.v_blocks]
        if geometry.v_in_k:
            self.kv_buffer = self.k_buffer
            self.kv_lora_rank, self.qk_rope_head_dim = geometry.v_width, geometry.k_width - geometry.v_width
        self.draw_poison()

    def _view(self, view, layer: torch.Tensor) -> torch.Tensor:
        return view(layer, self.num_blocks, self.block, self.geometry)

    def layer_storage(self, layer_id: int) -> torch.Tensor:
        """One layer's KV as its engine's cache holds it (the storage layout's shape)."""
        return self.layers[layer_id]

    def _k_scale(self, layer_id: int) -> Optional[float]:
        return self.scales[layer_id][0]

    def _v_scale(self, layer_id: int) -> Optional[float]:
        return self.scales[layer_id][1]

    def stored(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """What the pool holds for K and V of layer `layer_id` (quantized with its scales)."""
        return quantize(k, self._k_scale(layer_id), self.dtype), quantize(v, self._v_scale(layer_id), self.dtype)

    def at(self, slots: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(block, offset) index tensors of `slots`, to index the [blocks, block, ...] views."""
        slots = slots.to(torch.int64)
        return slots // self.block, slots % self.block

    def write(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]) -> None:
        """Stores K and V (already as stored) at `slots` of one layer; V is not written again where
        it is a view of K."""
        index = self.at(slots)
        self.k_blocks[layer_id][index] = k
        if not self.geometry.v_in_k:
            self.v_blocks[layer_id][index] = v

    def _poison_view(self, views, mean: float, std: float, gen, scale_of) -> None:
        for layer_id, view in enumerate(views):
            drawn = torch.empty(view.shape, dtype=torch.float32, device=self.device).normal_(mean, std, generator=gen)
            view.copy_(quantize(drawn, scale_of(layer_id), self.dtype))

    def draw_poison(self) -> None:
        """K poison (it adds score mass), then V's (far from real values; where V is a view of K's
        leading columns, the latent part holds V's poison and the rope part K's)."""
        gen = torch.Generator(device=self.device).manual_seed(POISON_SEED)
        self._poison_view(self.k_blocks, 0.0, POISON_K_STD, gen, self._k_scale)
        self._poison_view(self.v_blocks, POISON_V_MEAN, POISON_V_STD, gen, self._v_scale)
        self.poison = self.layers.clone()
        self.poison_k = [self._view(self.storage.k_view, t) for t in self.poison.unbind(0)]
        self.poison_v = [self._view(self.storage.v_view, t) for t in self.poison.unbind(0)]
        self._sealed = fingerprint([self.poison])

    def value_bound(self) -> torch.Tensor:
        """The largest |V| a backend can read from the pool (float32, on the pool's device)."""
        return torch.stack([dequantize(v, self._v_scale(lid)).abs().max() for lid, v in enumerate(self.v_blocks)]).max()

    def sealed_poison(self) -> Tuple[torch.Tensor, List[torch.Tensor], str]:
        """(fingerprint, tensors, name) of the poison, for kit.engine.fingerprint.unchanged: a stray
        write into it would leave slots a backend must not read less poisonous, unseen."""
        return self._sealed, [self.poison], "the KV pool's poison"

    def reset(self) -> None:
        """Every slot of every layer back to poison."""
        self.layers.copy_(self.poison)

    # SGLang's pool interface, which the in-box backends use too.
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """Quantized with the scales of the layer given (a backend's layer object); an MLA pool
        takes the whole latent row in cache_k (cache_v, its view, is not written again), as SGLang's."""
        k = quantize(cache_k, getattr(layer, "k_scale", None), self.dtype)
        v = None if self.geometry.v_in_k else quantize(cache_v, getattr(layer, "v_scale", None), self.dtype)
        self.write(layer.layer_id, loc, k, v)

    def set_mla_kv_buffer(self, layer, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                          cache_k_rope: torch.Tensor) -> None:
        """The latent row written from its two parts (SGLang's MLA write)."""
        self.set_kv_buffer(layer, loc, torch.cat([cache_k_nope, cache_k_rope], dim=-1), None)

    def get_mla_kv_buffer(self, layer, loc: torch.Tensor, dst_dtype=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The stored rows (as SGLang's: a quantized latent is returned as stored, unscaled)."""
        rows = self.k_blocks[layer.layer_id][self.at(loc)].to(dst_dtype or self.dtype)
        return rows[..., :self.v_head_dim], rows[..., self.v_head_dim:]


@dataclasses.dataclass
class Pools:
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool


def round_up_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """What a pool is made for: at least num_slots slots, max_reqs request rows of max_context
    tokens, KV of `geometry` in `storage`, blocks of `block` slots where the storage is blocked."""

    num_slots: int
    max_reqs: int
    max_context: int
    geometry: Geometry
    storage: KVStorage
    block: int
    dtype: torch.dtype
    device: str

    @property
    def size_class(self) -> tuple:
        """The pool that serves it: every size rounded up to a power of two (a pool serves the runs
        of its size class alone, so a run costs what its own size costs, whatever ran before)."""
        block = self.block if self.storage.blocked else 1
        slots = round_up_pow2(max(self.num_slots, block))
        return (self.geometry, self.storage.name, block, self.dtype, self.device, slots,
                round_up_pow2(self.max_reqs), round_up_pow2(self.max_context))

    def new_bytes(self) -> int:
        """About the bytes the pool of this size class takes: the KV and its poison, and the
        int32 req_to_token table."""
        _, _, block, _, _, slots, reqs, context = self.size_class
        g = self.geometry
        width = g.k_width * g.heads + (0 if g.v_in_k else g.v_width * g.heads)
        size = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * NUM_LAYERS * slots * width * size + 4 * reqs * context

    def make(self) -> Pools:
        _, _, block, _, _, slots, reqs, context = self.size_class
        kv = KVPool(self.storage, slots // block, block, self.geometry, self.dtype, self.device)
        return Pools(ReqToTokenPool(reqs, context, self.device), kv)


class PoolCache:
    """Pools kept between runs, one per size class (PoolSpec.size_class), the least recently used
    let go past `kept`; their poison is checked before a run where a stray write is suspected
    (kit.engine.fixture.fixtures_for)."""

    def __init__(self, kept: int = 4):
        self.kept = kept
        self._pools: "collections.OrderedDict[tuple, Pools]" = collections.OrderedDict()

    def clear(self) -> None:
        self._pools.clear()

    def new_bytes(self, spec: PoolSpec) -> int:
        """Bytes get(spec) would allocate (0: a pool of its class is kept)."""
        return 0 if spec.size_class in self._pools else spec.new_bytes()

    def get(self, spec: PoolSpec) -> Pools:
        key = spec.size_class
        if key not in self._pools:
            self._pools[key] = spec.make()
            while len(self._pools) > self.kept:
                self._pools.popitem(last=False)
        self._pools.move_to_end(key)
        return self._pools[key]
