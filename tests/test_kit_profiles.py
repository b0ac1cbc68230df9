"""An engine's conventions are its profile (kit.engine.profile): the pool is one allocation a layer
in the engine's storage layout, padded rows carry the engine's values, and metadata hooks are
driven in the engine's style. A toy engine with vLLM-like conventions runs through the same
harness as SGLang's, and a write through a padded row is caught."""
import pytest
import torch

from kit.engine.kinds import Geometry
from kit.engine.pools import KVPool
from kit.engine.profile import SGLANG
from kit.engine.storage import STORAGES, storage
from kit.modes import Exec, ForwardMode
from kit.harness.runner import run_case
from kit.report.record import PASS
from tests.helpers import run_setup, small_case
from tests.toys.interleaved import PROFILE, InterleavedBackend

TOY = "tests.toys.interleaved"
CASES = {ForwardMode.DECODE: small_case("toy_dec", ForwardMode.DECODE, (5, 17, 33), page=4),
         ForwardMode.EXTEND: small_case("toy_ext", ForwardMode.EXTEND, (3, 0, 20), (4, 9, 1), page=4)}


@pytest.mark.parametrize("name", list(STORAGES))
def test_every_storage_layout_is_read_and_written_through_its_views(name):
    """What the kit writes through a layout's K and V views lands where the layout says, in the
    one tensor a layer has; the flat [slots, heads, width] views, where a layout has them, are
    the same memory."""
    layout = storage(name)
    geometry = Geometry(1, 24, 16, True) if name.startswith("latent") else Geometry(2, 8, 8, False)
    pool = KVPool(layout, 6, 4, geometry, torch.float32, "cpu")
    slots = torch.tensor([5, 22, 9])
    k = torch.randn(3, geometry.heads, geometry.k_width)
    v = k[..., :geometry.v_width] if geometry.v_in_k else torch.randn(3, geometry.heads, geometry.v_width)
    pool.write(1, slots, k, v)
    layer = pool.layer_storage(1)
    assert layer.shape == layout.shape(6, 4, geometry) and layer.data_ptr() == pool.layers[1].data_ptr()
    blocks, offsets = slots // 4, slots % 4
    assert torch.equal(layout.k_view(layer, 6, 4, geometry)[blocks, offsets], k)
    assert torch.equal(layout.v_view(layer, 6, 4, geometry)[blocks, offsets], v)
    if pool.k_buffer[1] is not None:
        assert torch.equal(pool.k_buffer[1][slots], k) and torch.equal(pool.v_buffer[1][slots], v)
    assert torch.equal(pool.layers[0], pool.poison[0])  # the other layer untouched


def test_the_interleaved_layout_puts_each_heads_v_after_its_k():
    pool = KVPool(storage("interleaved"), 2, 4, Geometry(2, 8, 8, False), torch.float32, "cpu")
    k, v = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    pool.write(0, torch.tensor([6]), k, v)
    row = pool.layer_storage(0)[1, 2]  # slot 6: block 1, offset 2
    assert torch.equal(row[:, :8], k[0]) and torch.equal(row[:, 8:], v[0])


@pytest.mark.parametrize("mode", list(CASES), ids=lambda m: m.value)
def test_a_toy_engines_pool_is_its_own_layout_and_its_runs_pass(mode):
    case = CASES[mode]
    setup = run_setup(case, Exec.GRAPH, backend_cls=InterleavedBackend)
    kv = setup.fixtures[0].pools.token_to_kv_pool
    assert kv.storage.name == "interleaved" and kv.layer_storage(1).shape[1:] == (4, 2, 32)
    for exec_ in Exec:
        r = run_case(f"{TOY}:InterleavedBackend", case, exec_)
        assert r.outcome == PASS, (exec_, r.message)


@pytest.mark.parametrize("mode", list(CASES), ids=lambda m: m.value)
@pytest.mark.parametrize("bug", ["WritesPaddedRows", "ClampsPaddedRows"])
def test_a_write_through_a_padded_row_is_caught(mode, bug):
    """Padded tokens carry slot -1 under this profile: a backend that writes them anyway (where -1
    points, the layer's last slot; or clamped to slot 0, which this engine does not set aside)
    fails its graph runs as a KV write, naming the stray slot; its eager runs, with no padded rows,
    pass."""
    case = CASES[mode]
    assert run_case(f"{TOY}:{bug}", case, Exec.EAGER).outcome == PASS
    r = run_case(f"{TOY}:{bug}", case, Exec.GRAPH)
    assert (r.outcome, r.failure_class) == ("fail", "kv-write"), r.message
    assert "stray writes" in r.message, r.message


def test_the_sglang_profile_keeps_slot_0_as_scratch_and_this_one_does_not():
    assert SGLANG.scratch and not PROFILE.scratch
    assert PROFILE.problem() is None and SGLANG.problem() is None
