"""MLA as an attention kind: the latent pool (V a view of it), the fixture's latent inputs,
the KV check over the one buffer, and backends that do not declare MLA."""
from __future__ import annotations

import pytest
import torch

from kit.engine.case import Case
from kit.engine.pools import MLAKVPool, POISON_V_MEAN, PoolCache
from kit.harness.capabilities import Capabilities
from kit.harness.protocol import AttentionBackend
from kit.harness.runner import run_case
from kit.harness.checks import check_kv
from kit.modes import Exec, ForwardMode
from kit.report.record import PASS, UNSUPPORTED
from tests.helpers import make_fixture, small_case

MLA = dict(heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8, scale=0.3)


def _pool():
    return MLAKVPool(64, head_dim=24, kv_lora_rank=16, dtype=torch.float16, device="cpu")


def test_v_buffer_is_a_view_of_the_latent():
    pool = _pool()
    for layer_id in range(2):
        k, v = pool.get_kv_buffer(layer_id)
        assert k.shape == (64, 1, 24) and v.shape == (64, 1, 16)
        assert v.data_ptr() == k.data_ptr() and v.stride() == k.stride()
        k[5] = 1.5  # written through K, seen through V: one buffer
        assert torch.all(v[5] == 1.5)
    assert pool.v_layers.data_ptr() == pool.k_layers.data_ptr()


def test_latent_poison_reset_and_snapshot():
    """reset() puts the whole latent row back (the rope part too); the snapshot is one copy,
    its V a view of it."""
    pool = _pool()
    pool.reset()
    poison = pool.k_layers.clone()
    assert pool.v_layers.float().mean() > POISON_V_MEAN / 2  # V's poison is far from real values
    pool.k_layers.zero_()
    pool.reset()
    assert torch.equal(pool.k_layers, poison)
    k, v = pool.snapshot()
    assert torch.equal(k, poison) and v.data_ptr() == k.data_ptr() and v.shape[-1] == 16
    pool.k_layers[1, 3, 0, -1] += 1  # a rope column
    assert not torch.equal(pool.k_layers, k)


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
    args = dict(num_slots=32, max_reqs=4, max_context=64, num_kv_heads=1, head_dim=24, dtype=torch.float32,
                device="cpu")
    dense, mla = cache.get(**args), cache.get(**args, kv_lora_rank=16)
    assert not isinstance(dense.token_to_kv_pool, MLAKVPool) and isinstance(mla.token_to_kv_pool, MLAKVPool)


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
    before = pool.snapshot()
    writes = {lid: (x.k_new, x.v_new) for lid, x in enumerate(fx.inputs)}
    for lid, x in enumerate(fx.inputs):
        pool.k_buffer[lid][fx.batch.out_cache_loc] = x.k_new
    assert check_kv(pool, *before, fx.batch.out_cache_loc, writes).ok
    slot = int(fx.batch.out_cache_loc[0])
    pool.k_buffer[1][slot, 0, part] = before[0][1, slot, 0, part]
    check = check_kv(pool, *before, fx.batch.out_cache_loc, writes)
    assert not check.ok and check.num_missing == 1 and check.missing == [(1, slot)]
    pool.k_buffer[1][slot] = fx.inputs[1].k_new[0]
    pool.k_buffer[0][1, 0, part] += 1  # slot 1: owned by no request here
    check = check_kv(pool, *before, fx.batch.out_cache_loc, writes)
    assert not check.ok and check.num_collateral == 1


class DenseOnly(AttentionBackend):
    """A backend written before MLA: it declares no attention kinds."""

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
