"""Mutants of MLA (latent attention): each is one bug class of MLA backends, made by
overriding one method of the torch_native backend (its source stays untouched). They run
MLA cases only (`attention_kinds`): on dense cases they would be the plain backend."""
from __future__ import annotations

import dataclasses

from backends.torch_native import TorchNativeBackend


class _MlaMutant(TorchNativeBackend):
    attention_kinds = ("mla",)


class RopeDroppedFromScore(_MlaMutant):
    """The score is q_latent . c_kv alone: the rotary part (q_pe . k_pe) is left out, as a
    kernel that reads kv_lora_rank columns of q and of the latent row does."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        q = q.clone()
        q[..., layer.kv_lora_rank:] = 0
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class _PoolView:
    """The pool as the backend sees it, with V taken from other columns of the latent row."""

    def __init__(self, pool, shift: int):
        self._pool, self._shift = pool, shift

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def get_kv_buffer(self, layer_id):
        k = self._pool.get_key_buffer(layer_id)
        return k, k[..., self._shift:self._shift + self._pool.kv_lora_rank]


class ValuesFromRopeTail(_MlaMutant):
    """V read as the last kv_lora_rank columns of the latent row (shifted into the rope part)
    instead of the first: an offset of rope_dim in the value pointer."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        view = _PoolView(batch.token_to_kv_pool, layer.rope_dim)
        return super().forward(q, k, v, layer, dataclasses.replace(batch, token_to_kv_pool=view), save_kv_cache)


class ScaleFromHeadDim(_MlaMutant):
    """The softmax scale derived from the latent's head_dim (576 ** -0.5), not the model's
    (DeepSeek: 192 ** -0.5): a backend that ignores layer.scaling for MLA."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        return super().forward(q, k, v, dataclasses.replace(layer, scaling=layer.head_dim ** -0.5), batch,
                               save_kv_cache)


class LatentToWrongLayer(_MlaMutant):
    """Every layer's new latent rows are written into the first layer's buffer (a layer
    offset lost: start_layer, or a per-step buffer cached from layer 0)."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            batch.token_to_kv_pool.set_kv_buffer(dataclasses.replace(layer, layer_id=0), batch.out_cache_loc, k, v)
        return super().forward(q, k, v, layer, batch, save_kv_cache=False)


class LatentToWrongPage(_MlaMutant):
    """The new latent rows land one page past out_cache_loc (a page index taken for a slot)."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            pool = batch.token_to_kv_pool
            pool.set_kv_buffer(layer, (batch.out_cache_loc + pool.page_size) % pool.size, k, v)
        return super().forward(q, k, v, layer, batch, save_kv_cache=False)


class RopeNotWritten(_MlaMutant):
    """Only the compressed KV of a new token is written (the write of v, kv_lora_rank wide),
    not its rope part: the slot keeps whatever rope columns it held."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            pool = batch.token_to_kv_pool
            pool.get_value_buffer(layer.layer_id)[batch.out_cache_loc] = v.to(pool.dtype)
        return super().forward(q, k, v, layer, batch, save_kv_cache=False)
