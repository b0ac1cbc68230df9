"""KV storage layouts: how one layer's K and V sit in one allocation, as an engine's KV cache
holds them. The pool (kit.engine.pools) keeps every layer in one tensor, [layers, *shape]; a
backend is handed each layer's tensor, or K and V views of it, in its engine's layout, and the
kit itself reads and writes only through the K and V views, [blocks, block, heads, width] with
whatever strides the layout gives. An engine names its layout per attention kind in its
profile (kit.engine.profile); a new layout is one more entry of STORAGES."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import torch

from kit.engine.kinds import Geometry

Shape = Callable[[int, int, Geometry], Tuple[int, ...]]  # (blocks, block, geometry) -> one layer's shape
View = Callable[[torch.Tensor, int, int, Geometry], torch.Tensor]  # one layer's tensor -> [blocks, block, H, W]


@dataclasses.dataclass(frozen=True)
class KVStorage:
    name: str
    shape: Shape
    k_view: View
    v_view: View
    # Whether the block size is part of the shape (a pool then serves one page size); else the
    # slots are one flat axis and any page size reads them.
    blocked: bool
    what: str  # the layout, as docs and errors name it

    def check(self, geometry: Geometry) -> Optional[str]:
        """Why this layout cannot hold KV of `geometry`, or None."""
        if self.name in _EQUAL_WIDTHS and (geometry.v_in_k or geometry.k_width != geometry.v_width):
            return f"{self.name} holds K and V of equal widths, not {geometry}"
        if self.name in _LATENT and not geometry.v_in_k:
            return f"{self.name} holds a latent row whose leading columns are V, not {geometry}"
        return None


def _split(blocks, block, g):
    return (2, blocks * block, g.heads, g.k_width)


def _latent(blocks, block, g):
    return (blocks * block, g.heads, g.k_width)


def _kv_first(blocks, block, g):
    return (2, blocks, block, g.heads, g.k_width)


def _interleaved(blocks, block, g):
    return (blocks, block, g.heads, g.k_width + g.v_width)


def _block_major(blocks, block, g):
    return (blocks, 2, block, g.heads, g.k_width)


def _latent_blocks(blocks, block, g):
    return (blocks, block, g.k_width)


def _latent_strided_blocks(blocks, block, g):
    return (blocks, block + 1, g.k_width)


STORAGES: Dict[str, KVStorage] = {s.name: s for s in (
    # SGLang's MHATokenToKVPool: K and V each [slots, heads, head_dim], one after the other.
    KVStorage("split", _split, lambda t, n, b, g: t[0].view(n, b, g.heads, g.k_width),
              lambda t, n, b, g: t[1].view(n, b, g.heads, g.v_width), False,
              "[2, slots, heads, head_dim]: K, then V"),
    # SGLang's MLATokenToKVPool: one latent row per slot; V is its leading columns.
    KVStorage("latent", _latent, lambda t, n, b, g: t.view(n, b, g.heads, g.k_width),
              lambda t, n, b, g: t.view(n, b, g.heads, g.k_width)[..., :g.v_width], False,
              "[slots, 1, rank + rope]: V is the first rank columns"),
    KVStorage("kv_first", _kv_first, lambda t, n, b, g: t[0], lambda t, n, b, g: t[1], True,
              "[2, blocks, block, heads, head_dim]: K blocks, then V blocks"),
    KVStorage("interleaved", _interleaved, lambda t, n, b, g: t[..., :g.k_width],
              lambda t, n, b, g: t[..., g.k_width:], True,
              "[blocks, block, heads, 2 * head_dim]: each head's K, then its V"),
    KVStorage("block_major", _block_major, lambda t, n, b, g: t[:, 0], lambda t, n, b, g: t[:, 1], True,
              "[blocks, 2, block, heads, head_dim]: each block's K, then its V"),
    KVStorage("latent_blocks", _latent_blocks, lambda t, n, b, g: t.unsqueeze(2),
              lambda t, n, b, g: t.unsqueeze(2)[..., :g.v_width], True,
              "[blocks, block, rank + rope]: V is the first rank columns"),
    # Blocks a row further apart than their rows take: the block stride of a cache whose blocks
    # share an allocation with another cache's (vLLM's sparse MLA beside its indexer's keys); a
    # kernel that takes a block to be block x row wide reads the wrong rows (vllm#47783).
    KVStorage("latent_strided_blocks", _latent_strided_blocks, lambda t, n, b, g: t[:, :b].unsqueeze(2),
              lambda t, n, b, g: t[:, :b].unsqueeze(2)[..., :g.v_width], True,
              "[blocks, block + 1, rank + rope]: a row's gap after each block; V is the first rank columns"),
)}
_EQUAL_WIDTHS = ("split", "kv_first", "block_major")
_LATENT = ("latent", "latent_blocks", "latent_strided_blocks")


def storage(name: str) -> KVStorage:
    if name not in STORAGES:
        raise ValueError(f"unknown KV storage {name!r}; known: {', '.join(STORAGES)}")
    return STORAGES[name]


def flat(blocks: torch.Tensor) -> Optional[torch.Tensor]:
    """A [blocks, block, H, W] view as [slots, H, W] without a copy, or None where its strides do
    not allow one (K of a block-major layout)."""
    n, b = blocks.shape[:2]
    s0, s1 = blocks.stride()[:2]
    if n > 1 and b > 1 and s0 != b * s1:
        return None
    # as_strided, not view: a view may give a size-1 axis any stride, and kernels read strides.
    return blocks.as_strided((n * b,) + tuple(blocks.shape[2:]), (s1 if b > 1 else s0,) + tuple(blocks.stride()[2:]),
                             blocks.storage_offset())
