"""An fp8 KV cache (kit.engine.kv_quant): what the pool stores, what the reference attends, what
the KV check compares byte for byte, and a backend reading the scales wrong failing."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from backends.torch_native import TorchNativeBackend
from kit.engine.kv_quant import KV_SCALES, dequantize, quantize
from kit.engine.layer import model_layers
from kit.engine.pools import CASE_LAYER_ID, POISON_K_STD, POISON_V_MEAN
from kit.engine.reference import golden
from kit.harness.checks import KVState, check_kv
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from kit.report.record import FAIL, KERNEL, PASS
from tests.helpers import make_fixture, small_case

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _case(kv_dtype="fp8_e4m3", mla=False, mode=ForwardMode.EXTEND):
    shape = dict(prefix=(5, 0, 9), new=(3, 4, 1)) if mode is ForwardMode.EXTEND else dict(prefix=(5, 0, 9))
    if mla:
        return small_case(f"fp8_mla_{kv_dtype}", mode, heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8,
                          scale=0.1, page=4, kv_dtype=kv_dtype, **shape)
    return small_case(f"fp8_dense_{kv_dtype}", mode, page=4, kv_dtype=kv_dtype, **shape)


CASES = [_case(kv, mla) for kv in FP8 for mla in (False, True)]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_scales_tell_every_swap_apart():
    """Per layer, K's scale and V's differ, none is 1, the layers' differ, and each is a power of
    two (so that k / scale is exact wherever a backend divides); an MLA latent has one scale."""
    pairs = list(KV_SCALES.values())
    for k_scale, v_scale in pairs:
        assert k_scale != v_scale and 1.0 not in (k_scale, v_scale)
        for s in (k_scale, v_scale):
            assert torch.frexp(torch.tensor(s, dtype=torch.float64)).mantissa.item() == 0.5
    assert len(set(pairs)) == len(pairs)
    dense, mla = model_layers(_case()), model_layers(_case(mla=True))
    assert [(l.k_scale, l.v_scale) for l in dense] == [KV_SCALES[l.layer_id] for l in dense]
    assert all(l.v_scale == l.k_scale == KV_SCALES[l.layer_id][0] for l in mla)
    assert all(l.k_scale is None and l.v_scale is None for l in model_layers(_case(kv_dtype=None)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_pool_holds_fp8_of_k_over_its_scale(case):
    """The cached tokens are installed as fp8(k / k_scale) (V with v_scale), byte for byte, in a
    pool of the fp8 dtype; its poison, read back with each layer's scale, is the poison designed."""
    fx = make_fixture(case)
    pool = fx.pools.token_to_kv_pool
    assert pool.dtype == FP8[case.kv_dtype] and pool.layers.dtype == FP8[case.kv_dtype]
    old = torch.tensor([s for r in fx.plan.requests for s in r.slots[:r.n_old]])
    for layer, x in zip(fx.layers, fx.inputs):
        expected = quantize(x.k_old, layer.k_scale, pool.dtype)
        assert torch.equal(_bytes(pool.k_buffer[layer.layer_id][old]), _bytes(expected))
        assert not torch.equal(_bytes(expected), _bytes(x.k_old.to(pool.dtype)))  # the scale matters
        assert torch.equal(_bytes(pool.v_buffer[layer.layer_id][old]), _bytes(quantize(x.v_old, layer.v_scale,
                                                                                        pool.dtype)))
    pool.reset()
    for layer in fx.layers:
        v = dequantize(pool.v_buffer[layer.layer_id], layer.v_scale)
        assert abs(v.mean().item() - POISON_V_MEAN) < 2
        if not case.is_mla:
            k = dequantize(pool.k_buffer[layer.layer_id], layer.k_scale)
            assert abs(k.std().item() - POISON_K_STD) < 0.5
    assert pool.value_bound().item() == max(dequantize(pool.v_buffer[l.layer_id], l.v_scale).abs().max().item()
                                            for l in fx.layers)


def _wrong_writes(layer, k, v, dtype):
    """Layer -> the (k, v) a buggy write stores, by bug."""
    other = torch.float8_e5m2 if dtype == torch.float8_e4m3fn else torch.float8_e4m3fn
    return {
        "scale applied twice": (quantize(k, layer.k_scale ** 2, dtype), quantize(v, layer.v_scale ** 2, dtype)),
        "scale ignored": (quantize(k, 1.0, dtype), quantize(v, 1.0, dtype)),
        "K scale used for V": (quantize(k, layer.k_scale, dtype), quantize(v, layer.k_scale, dtype)),
        "the other fp8 format": (quantize(k, layer.k_scale, other).view(dtype),
                                 quantize(v, layer.v_scale, other).view(dtype)),
    }


@pytest.mark.parametrize("case", [c for c in CASES if not c.is_mla], ids=lambda c: c.name)
def test_kv_check_compares_the_stored_bytes(case):
    """The pool's own write (the layer's scales) passes the KV check; a write that quantizes with
    the scale applied twice, none, K's for V, or into the other fp8 format fails it in every slot."""
    fx = make_fixture(case)
    pool, loc = fx.pools.token_to_kv_pool, fx.batch.out_cache_loc
    layer, x = fx.layers[CASE_LAYER_ID], fx.inputs[CASE_LAYER_ID]
    state = KVState(fx.old_slots(), fx.installed_kv(), loc, {CASE_LAYER_ID: (x.k_new, x.v_new)})
    pool.set_kv_buffer(layer, loc, x.k_new, x.v_new)
    assert check_kv(pool, state).ok
    for bug, (k, v) in _wrong_writes(layer, x.k_new, x.v_new, pool.dtype).items():
        fx.install()
        pool.k_buffer[CASE_LAYER_ID][loc] = k
        pool.v_buffer[CASE_LAYER_ID][loc] = v
        chk = check_kv(pool, state)
        assert not chk.ok and chk.num_missing == loc.numel(), bug


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_attends_what_the_pool_holds(case):
    """The golden of an fp8 case is the golden of an unquantized batch holding fp8(k / s) * s:
    quantized as the pool stores, attended as read back (and not the raw inputs')."""
    fx = make_fixture(case)
    plain = fx.case.with_(kv_dtype=None)
    read = [dataclasses.replace(x, **{name: dequantize(quantize(getattr(x, name), scale, case.kv_torch_dtype),
                                                       scale).to(getattr(x, name).dtype)
                                      for name, scale in (("k_new", l.k_scale), ("k_old", l.k_scale),
                                                          ("v_new", l.v_scale), ("v_old", l.v_scale))})
            for x, l in zip(fx.inputs, fx.layers)]
    as_read = types.SimpleNamespace(plan=dataclasses.replace(fx.plan, case=plain), layers=model_layers(plain),
                                    inputs=read)
    raw = types.SimpleNamespace(plan=as_read.plan, layers=as_read.layers, inputs=fx.inputs)
    for layer_id in range(len(fx.layers)):
        assert torch.equal(golden(fx.step, layer_id), golden(as_read, layer_id))
        assert not torch.allclose(golden(fx.step, layer_id), golden(raw, layer_id), atol=1e-3)


class _OtherFormat(TorchNativeBackend):
    """Reads the fp8 bytes as the other fp8 format (e5m2 for e4m3 and back)."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        other = torch.float8_e5m2 if pool.dtype == torch.float8_e4m3fn else torch.float8_e4m3fn

        class View:
            def __getattr__(self, name):
                return getattr(pool, name)

            def get_kv_buffer(self, layer_id):
                return tuple(t.view(other) for t in pool.get_kv_buffer(layer_id))
        return super().forward(q, k, v, layer, dataclasses.replace(batch, token_to_kv_pool=View()), False)


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("mode", (ForwardMode.DECODE, ForwardMode.EXTEND), ids=lambda m: m.value)
def test_reading_the_scales_wrong_fails(kv_dtype, mode):
    """torch_native passes; the same backend reading the cache with a scale applied twice, none,
    K's for V, or the bytes as the other fp8 format fails with a kernel verdict."""
    case = _case(kv_dtype, mode=mode)
    assert run_case("torch_native", case, Exec.EAGER).outcome == PASS
    for bug in ("tests.mutants.fp8:ScaleAppliedTwice", "tests.mutants.fp8:ScaleIgnored",
                "tests.mutants.fp8:KScaleUsedForV", "tests.test_kit_fp8:_OtherFormat"):
        result = run_case(bug, case, Exec.EAGER)
        assert (result.outcome, result.failure_class) == (FAIL, KERNEL), (bug, result.message)
