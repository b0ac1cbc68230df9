"""The objects a backend reads and writes: request-to-token table and paged KV pool.

Conventions (SPEC): slot 0 is scratch, request row 0 is the dummy request
(all zeros); real requests use rows >= 1 and slots >= page_size. Every slot a
batch does not own holds poison (KVPool.reset, before each batch is installed).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import torch

from kit.fingerprint import fingerprint, unchanged

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
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_buffer: List[torch.Tensor] = [torch.empty(shape, dtype=dtype, device=device) for _ in range(NUM_LAYERS)]
        self.v_buffer: List[torch.Tensor] = [torch.empty(shape, dtype=dtype, device=device) for _ in range(NUM_LAYERS)]
        self._draw_poison()

    def _draw_poison(self) -> None:
        shape, dtype, device = self.k_buffer[0].shape, self.dtype, self.device
        gen = torch.Generator(device=device).manual_seed(POISON_SEED)
        self._poison_k = [torch.empty(shape, dtype=dtype, device=device).normal_(0.0, POISON_K_STD, generator=gen)
                          for _ in range(NUM_LAYERS)]
        self._poison_v = [torch.empty(shape, dtype=dtype, device=device).normal_(POISON_V_MEAN, POISON_V_STD,
                                                                                  generator=gen)
                          for _ in range(NUM_LAYERS)]
        self._sealed = fingerprint(self._poison_k + self._poison_v)

    def check_poison(self) -> None:
        """The poison is kept for every run the pool serves: drawn again if it changed (a stray
        write would otherwise leave slots a backend must not read less poisonous, unseen)."""
        if not unchanged(self._sealed, self._poison_k + self._poison_v, "the KV pool's poison"):
            self._draw_poison()

    def reset(self) -> None:
        """Every slot of every layer back to poison."""
        for buf, poison in zip(self.k_buffer + self.v_buffer, self._poison_k + self._poison_v):
            buf.copy_(poison)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        self.k_buffer[layer.layer_id][loc] = cache_k.to(self.dtype)
        self.v_buffer[layer.layer_id][loc] = cache_v.to(self.dtype)

    def snapshot(self) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        return [b.clone() for b in self.k_buffer], [b.clone() for b in self.v_buffer]


@dataclasses.dataclass
class Pools:
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class PoolCache:
    """Pools built once per worker and reused while big enough (SPEC speed rule)."""

    def __init__(self):
        self._pools: Dict[tuple, Pools] = {}

    def get(self, *, num_slots: int, max_reqs: int, max_context: int, num_kv_heads: int,
            head_dim: int, dtype, device) -> Pools:
        key = (num_kv_heads, head_dim, dtype, str(device))
        have = self._pools.get(key)
        if (have is None or have.token_to_kv_pool.size < num_slots
                or have.req_to_token_pool.size < max_reqs
                or have.req_to_token_pool.max_context_len < max_context):
            if have is not None:  # grow to cover both the old and the new need
                num_slots = max(num_slots, have.token_to_kv_pool.size)
                max_reqs = max(max_reqs, have.req_to_token_pool.size)
                max_context = max(max_context, have.req_to_token_pool.max_context_len)
            self._pools.pop(key, None)
            have = Pools(
                ReqToTokenPool(_round_up_pow2(max_reqs), _round_up_pow2(max_context), device),
                KVPool(_round_up_pow2(num_slots), num_kv_heads, head_dim, dtype, device),
            )
            self._pools[key] = have
        else:
            have.token_to_kv_pool.check_poison()
        return have


POOL_CACHE = PoolCache()
