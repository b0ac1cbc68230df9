"""Mutants of an fp8 KV cache's scales: each is one bug class of backends reading a quantized
cache (sglang#24198, flashinfer#4979, vllm#42580: a path that drops the descale), made by
overriding forward() of the torch_native backend (its source stays untouched). The pool's
write is the right one (the layer's scales); the read multiplies by the wrong ones. They run
fp8 cases only: elsewhere they would be the plain backend."""
from __future__ import annotations

import dataclasses

from backends.torch_native import TorchNativeBackend


class _Fp8ReadMutant(TorchNativeBackend):
    @classmethod
    def supports(cls, case):
        return None if case.kv_dtype else "not an fp8 KV case: the mutant is the plain backend there"

    def read_scales(self, layer):
        """(k_scale, v_scale) the mutant's read multiplies the stored values by."""
        raise NotImplementedError

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            batch.token_to_kv_pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        k_scale, v_scale = self.read_scales(layer)
        return super().forward(q, k, v, dataclasses.replace(layer, k_scale=k_scale, v_scale=v_scale), batch,
                               save_kv_cache=False)


class ScaleAppliedTwice(_Fp8ReadMutant):
    """The stored values multiplied by the scale twice (a kernel that descales what a wrapper
    already dequantized)."""

    def read_scales(self, layer):
        return layer.k_scale ** 2, layer.v_scale ** 2


class ScaleIgnored(_Fp8ReadMutant):
    """The stored fp8 values read as the values themselves: the descale dropped (a fast path or
    a ragged/prefix split that never passes k_scale / v_scale)."""

    def read_scales(self, layer):
        return 1.0, 1.0


class KScaleUsedForV(_Fp8ReadMutant):
    """V descaled with K's scale (one scale argument passed for both)."""

    def read_scales(self, layer):
        return layer.k_scale, layer.k_scale
