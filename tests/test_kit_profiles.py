"""An engine's conventions are its profile (kit.engine.profile): the pool is one allocation a layer
in the engine's storage layout, padded rows carry the engine's values, and metadata hooks are
driven in the engine's style. A toy engine with vLLM-like conventions runs through the same
harness as SGLang's, and a write through a padded row is caught."""
import dataclasses

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


class _NoExtendGraphs(InterleavedBackend):
    """Declares that its engine captures no graph of EXTEND batches."""

    @classmethod
    def supports_graph(cls, case):
        return "no full graph of EXTEND batches" if case.mode is ForwardMode.EXTEND else None


def test_a_backend_may_leave_graph_runs_of_a_case_out_and_keep_its_eager_runs():
    case = CASES[ForwardMode.EXTEND]
    graph = run_case(f"{__name__}:_NoExtendGraphs", case, Exec.GRAPH)
    assert (graph.outcome, graph.message) == ("unsupported", "no full graph of EXTEND batches")
    assert run_case(f"{__name__}:_NoExtendGraphs", case, Exec.EAGER).outcome == PASS
    assert run_case(f"{__name__}:_NoExtendGraphs", CASES[ForwardMode.DECODE], Exec.GRAPH).outcome == PASS


class _Recording(InterleavedBackend):
    """Keeps the host view of every description its hooks get: (hook, num_reqs, num_actual_tokens,
    max_query_len, max_seq_len, query_start_loc, seq_lens, slot_mapping, any block table entry);
    its EXTEND forward is captured once per token bucket, as an engine's full graphs capture it."""

    extend_capture = True
    seen: list = []

    def _record(self, hook, batch):
        c = batch.common
        type(self).seen.append((hook, c.num_reqs, c.num_actual_tokens, c.max_query_len, c.max_seq_len,
                                c.query_start_loc.tolist(), c.seq_lens.tolist(), c.slot_mapping.tolist(),
                                c.block_table.any().item()))

    def build_for_capture(self, batch):
        self._record("capture", batch)
        super().build_for_capture(batch)

    def init_forward_metadata(self, batch):
        self._record("metadata", batch)
        super().init_forward_metadata(batch)


def _graph_hooks_seen(case):
    _Recording.seen = []
    assert run_case(f"{__name__}:_Recording", case, Exec.GRAPH).outcome == PASS
    return _Recording.seen


def test_a_graph_is_captured_with_the_engines_capture_batch_and_replayed_with_empty_padded_requests():
    """vLLM's conventions, the profile's: a decode graph of bucket 4 is captured with 4 requests of
    one token each, nothing cached, the null block everywhere, no slot, the longest context as its
    host maximum; a bs-3 replay of it has 4 requests, the padded one empty (query_start_loc stays
    at the 3 real tokens, seq_len 0, slot -1), 4 tokens of which 3 real."""
    case = small_case("toy_dec3", ForwardMode.DECODE, (5, 17, 33), page=4)
    seen = _graph_hooks_seen(case)
    max_context = run_setup(case, Exec.GRAPH, backend_cls=InterleavedBackend).fixtures[0].pools.req_to_token_pool.max_context_len
    captures = [s for s in seen if s[0] == "capture"]
    assert ("capture", 4, 4, 1, max_context, [0, 1, 2, 3, 4], [1, 1, 1, 1], [-1] * 4, False) in captures
    replays = [s for s in seen if s[0] == "metadata" and s[1] == 4 and s[5][-2:] == [3, 3]]
    assert replays, seen
    _, _, tokens, max_query_len, _, qsl, seq_lens, slots, _ = replays[0]
    assert (tokens, max_query_len, qsl, seq_lens[3], slots[3]) == (3, 1, [0, 1, 2, 3, 3], 0, -1)
    assert min(seq_lens[:3]) > 1


def test_a_token_graphs_replays_pad_their_requests_to_its_capture():
    """EXTEND graphs under the profile: the graph of a 16-token bucket is captured for 16 requests
    (one token each, the whole bucket as the host maximum of one query) and a 2-request batch of
    it is replayed with 14 empty requests after its two."""
    seen = _graph_hooks_seen(CASES[ForwardMode.EXTEND])
    assert any(s[:5] == ("capture", 16, 16, 16, s[4]) and s[6] == [1] * 16 for s in seen), seen
    two = [s for s in seen if s[0] == "metadata" and s[5][:3] == [0, 8, 16]]
    assert two and two[0][1] == 16 and two[0][5][3:] == [16] * 14 and two[0][6][2:] == [0] * 14, two


class _UnpaddedTokenGraphs(_Recording):
    profile = dataclasses.replace(PROFILE, pads_token_graph_requests=False)


def test_a_token_graph_replayed_with_fewer_requests_than_captured_needs_them_padded():
    """A graph keeps its capture's launch arguments (the emulated replay puts the backend's host
    state back to capture), here its request count: replayed with 2 requests after a 16-request
    capture, without padded requests it reads rows the capture left in the static buffers."""
    r = run_case(f"{__name__}:_UnpaddedTokenGraphs", CASES[ForwardMode.EXTEND], Exec.GRAPH)
    assert (r.outcome, r.failure_class) == ("fail", "graph") and "bs=2, 16 tokens, after bs=16" in r.message, r.message


class _LeavesPaddedRows(InterleavedBackend):
    """Writes nothing into the output rows of padded tokens (slot -1), as vLLM's layer leaves the
    rows it allocated for them."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out = super().forward(q, k, v, layer, batch, save_kv_cache)
        return torch.where((self.slot_mapping >= 0).view(-1, 1, 1), out, float("nan"))


class _LeavesPaddedRowsOfRealRequests(_LeavesPaddedRows):
    profile = dataclasses.replace(PROFILE, padded_query_len=None)


def test_padded_rows_are_judged_only_where_a_padded_token_belongs_to_a_request():
    """Under empty padded requests a padded token is nobody's: its output row is not judged. Where
    padded requests decode like real ones, their rows must be finite."""
    case = CASES[ForwardMode.DECODE]
    assert run_case(f"{__name__}:_LeavesPaddedRows", case, Exec.GRAPH).outcome == PASS
    r = run_case(f"{__name__}:_LeavesPaddedRowsOfRealRequests", case, Exec.GRAPH)
    assert r.outcome == "fail" and "padded rows not finite" in r.message, r.message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real capture: CPU graphs are emulated, and an emulated "
                    "replay does not re-run what a captured run recorded on its first forward")
@pytest.mark.parametrize("mode", list(CASES), ids=lambda m: m.value)
def test_a_builders_metadata_planned_at_its_first_forward_is_planned_in_the_graph(mode):
    """The builder driver builds the capture's metadata anew before each warm-up run and the captured run,
    as vLLM's runner does: a plan the first forward makes on it is recorded, and each replay plans anew."""
    r = run_case(f"{TOY}:PlansAtFirstForward", CASES[mode], Exec.GRAPH)
    assert r.outcome == PASS, r.message
