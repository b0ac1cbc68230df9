"""MLA as an attention kind: the latent pool (V a view of it), the fixture's latent inputs,
the KV check over the one buffer, and backends that do not declare MLA."""
from __future__ import annotations

import pytest
import torch

from kit.engine.case import Case
from kit.engine.kinds import Geometry
from kit.engine.pools import POISON_V_MEAN, KVPool, PoolCache, PoolSpec
from kit.engine.storage import storage
from kit.harness.capabilities import Capabilities
from kit.engine.profile import SGLANG
from kit.harness.protocol import AttentionBackend
from kit.harness.runner import run_case
from kit.harness.checks import KVState, check_kv
from kit.modes import Exec, ForwardMode
from kit.report.record import PASS, UNSUPPORTED
from tests.helpers import make_fixture, small_case

MLA = dict(heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8, scale=0.3)


LATENT = Geometry(heads=1, k_width=24, v_width=16, v_in_k=True)


def _pool():
    return KVPool(storage("latent"), 64, 1, LATENT, torch.float16, "cpu")


def test_v_buffer_is_a_view_of_the_latent():
    pool = _pool()
    for layer_id in range(2):
        k, v = pool.get_kv_buffer(layer_id)
        assert k.shape == (64, 1, 24) and v.shape == (64, 1, 16)
        assert v.data_ptr() == k.data_ptr() and v.stride() == k.stride()
        k[5] = 1.5  # written through K, seen through V: one buffer
        assert torch.all(v[5] == 1.5)
    assert pool.layer_storage(1).shape == (64, 1, 24)  # SGLang's MLATokenToKVPool: one latent buffer a layer


def test_latent_poison_and_reset():
    """reset() puts the whole latent row back (the rope part too); V's poison (the latent part) is
    far from real values, K's (the rope part) adds score mass."""
    pool = _pool()
    pool.reset()
    poison = pool.layers.clone()
    assert pool.v_buffer[1].float().mean() > POISON_V_MEAN / 2
    assert pool.k_buffer[1][..., 16:].float().mean().abs() < POISON_V_MEAN / 4
    pool.layers.zero_()
    pool.reset()
    assert torch.equal(pool.layers, poison)


def test_set_kv_buffer_writes_the_whole_latent_row():
    pool = _pool()
    layer = type("L", (), {"layer_id": 1})()
    rows = torch.randn(2, 1, 24).half()
    pool.set_kv_buffer(layer, torch.tensor([7, 9]), rows, rows[..., :16])
    assert torch.equal(pool.k_buffer[1][[7, 9]], rows)
    nope, rope = torch.randn(1, 1, 16).half(), torch.randn(1, 1, 8).half()
    pool.set_mla_kv_buffer(layer, torch.tensor([11]), nope, rope)
    got = pool.get_mla_kv_buffer(layer, torch.tensor([11]))
    assert torch.equal(got[0], nope) and torch.equal(got[1], rope)


def test_pool_cache_keeps_mla_and_dense_pools_apart():
    cache = PoolCache()
    args = dict(num_slots=32, max_reqs=4, max_context=64, block=1, dtype=torch.float32, device="cpu")
    dense = cache.get(PoolSpec(geometry=Geometry(1, 24, 24, False), storage=storage("split"), **args))
    mla = cache.get(PoolSpec(geometry=LATENT, storage=storage("latent"), **args))
    assert dense is not mla
    assert not dense.token_to_kv_pool.geometry.v_in_k and mla.token_to_kv_pool.geometry.v_in_k


def test_fixture_inputs_are_latent_rows():
    """q [T, H, R + P], k [T, 1, R + P], v a view of k's first R columns; handed copies keep it so."""
    case = small_case("mla_fx", ForwardMode.EXTEND, (3, 5), (2, 4), **MLA)
    fx = make_fixture(case)
    x = fx.inputs[1]
    assert x.q.shape == (6, 4, 24) and x.k_new.shape == (6, 1, 24) and x.v_new.shape == (6, 1, 16)
    assert x.v_in_k and x.v_new.data_ptr() == x.k_new.data_ptr()
    q, k, v = x.handed()
    assert k.data_ptr() != x.k_new.data_ptr() and v.data_ptr() == k.data_ptr() and torch.equal(v, x.v_new)
    assert x.k_new[..., 16:].abs().sum() > 0 and not torch.equal(x.k_new[..., 16:], x.k_new[..., :8])
    dense = make_fixture(small_case("dense_fx", ForwardMode.EXTEND, (3, 5), (2, 4))).inputs[1]
    assert not dense.v_in_k and dense.handed()[2].data_ptr() != dense.handed()[1].data_ptr()


@pytest.mark.parametrize("part", [slice(0, 16), slice(16, 24)], ids=["latent", "rope"])
def test_kv_check_sees_each_part_of_the_latent_row(part):
    """A new token's row with its latent or its rope part unwritten is a missing write; a
    stray write into another slot's rope part is seen too."""
    case = small_case("mla_kv", ForwardMode.DECODE, (3, 5), **MLA)
    fx = make_fixture(case)
    pool = fx.pools.token_to_kv_pool
    writes = {lid: (x.k_new, x.v_new) for lid, x in enumerate(fx.inputs)}
    state = KVState(fx.old_slots(), fx.installed_kv(), fx.batch.out_cache_loc, writes)
    for lid, x in enumerate(fx.inputs):
        pool.k_buffer[lid][fx.batch.out_cache_loc] = x.k_new
    assert check_kv(pool, state).ok
    slot = int(fx.batch.out_cache_loc[0])
    pool.k_buffer[1][slot, 0, part] = pool.poison_k[1].reshape(pool.size, 1, 24)[slot, 0, part]
    check = check_kv(pool, state)
    assert not check.ok and check.num_missing == 1 and check.missing == [(1, slot)]
    pool.k_buffer[1][slot] = fx.inputs[1].k_new[0]
    pool.k_buffer[0][1, 0, part] += 1  # slot 1: owned by no request here
    check = check_kv(pool, state)
    assert not check.ok and check.num_collateral == 1


class DenseOnly(AttentionBackend):
    """A backend written before MLA: it declares no attention kinds."""

    profile = SGLANG

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        raise AssertionError("never called for an MLA case")


def test_a_backend_without_mla_reads_unsupported():
    case = Case("mla_dec", ForwardMode.DECODE, prefix=(3,), **MLA)
    kind_reason = Capabilities.of(DenseOnly).kind_reason
    assert "MLA" in kind_reason(case) and "attention_kinds" in kind_reason(case)
    assert kind_reason(case.with_(kv_lora_rank=0, rope_dim=0, heads=(4, 1), scale=None)) is None
    for exec_ in Exec:
        result = run_case("tests.test_kit_mla:DenseOnly", case, exec_)
        assert result.outcome == UNSUPPORTED and result.message.startswith("MLA (latent attention)")
    assert run_case("torch_native", case, Exec.EAGER).outcome == PASS


TRITON_MLA = dict(heads=(32, 1), head_dim=32, kv_lora_rank=16, rope_dim=16, scale=0.3, dtype="fp16")


@pytest.mark.parametrize("mode, new, extra, exec_", [
    (ForwardMode.DECODE, 1, {}, Exec.GRAPH),  # split-K and its merge; two head blocks; bucket replays
    (ForwardMode.TARGET_VERIFY, 4, dict(topk=2), Exec.EAGER),  # extend kernel, custom (tree) mask
    (ForwardMode.EXTEND, (3, 6), {}, Exec.EAGER),  # causal extend (its graphs: the CPU matrix's MLA extend case)
], ids=["decode_graph", "tree_verify_eager", "extend_eager"])
def test_triton_mla_kernels(mode, new, extra, exec_):
    """Our Triton MLA kernels pass the kit's checks in the interpreter, in graphs too."""
    case = Case("mla_triton", mode, prefix=(40, 3), new=new, page=16, **TRITON_MLA, **extra)
    result = run_case("triton", case, exec_)
    assert result.outcome == PASS, result.message
