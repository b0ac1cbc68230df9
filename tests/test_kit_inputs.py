"""What forward() is handed: q, k and v in the case's input form (views of one fused QKV row,
as models pass them, or tensors of their own), and judged unchanged, bit for bit, after every
forward: eager steps, graph captures and replays (kit.harness.checks.InputsCheck)."""
from __future__ import annotations

import pytest
import torch

from backends.torch_native import TorchNativeBackend
from kit.engine.profile import SGLANG
from kit.harness.checks import Handed, check_inputs, inputs_figures, read_back
from kit.harness.graph import harness_for
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from tests.helpers import make_fixture, run_setup, small_case
from tests.toys.dense import DenseGraphBackend

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
MODULE = "tests.test_kit_inputs"
HQ, HKV, D = 4, 2, 16  # small_case's heads and head_dim
ROW = (HQ + 2 * HKV) * D  # the fused QKV row's width

FUSED = {
    DECODE: small_case("inputs_decode", DECODE, (3, 9, 17), inputs="fused_qkv"),
    EXTEND: small_case("inputs_extend", EXTEND, (0, 6, 11), (4, 1, 3), page=16, inputs="fused_qkv"),
    TARGET_VERIFY: small_case("inputs_tv", TARGET_VERIFY, (5, 12, 2), 3, inputs="fused_qkv"),
    DRAFT_EXTEND_V2: small_case("inputs_dev2", DRAFT_EXTEND_V2, (2, 9, 4), 2, inputs="fused_qkv"),
}


def _fused_layout(q, k, v, rows):
    """q, k and v are the three parts of one [rows, ROW] row per token, in that order."""
    assert (q.shape, k.shape, v.shape) == ((rows, HQ, D), (rows, HKV, D), (rows, HKV, D))
    assert q.stride() == k.stride() == v.stride() == (ROW, D, 1)
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    size = q.element_size()
    assert (k.data_ptr() - q.data_ptr(), v.data_ptr() - q.data_ptr()) == (HQ * D * size, (HQ + HKV) * D * size)


def test_fused_copies_are_views_of_one_qkv_row():
    x = make_fixture(FUSED[EXTEND]).inputs[1]
    q, k, v = x.handed("fused_qkv")
    _fused_layout(q, k, v, x.q.shape[0])
    assert torch.equal(q, x.q) and torch.equal(k, x.k_new) and torch.equal(v, x.v_new)
    assert q.data_ptr() != x.q.data_ptr()  # a copy: the kit's own inputs are shared between runs
    static = x.buffers(32, "fused_qkv")
    _fused_layout(*static, 32)
    assert all(not t.any() for t in static)
    assert all(t.is_contiguous() for t in x.handed("contiguous") + x.buffers(32, "contiguous"))


class _Spy:
    """Records the strides of each q, k and v forward() is handed, of more than one token (one token's
    stride is any: torch gives a one-row view a contiguous one)."""
    seen: list = []

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if q.shape[0] > 1:
            _Spy.seen.append((q.stride(), k.stride(), v.stride()))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class SpyDense(_Spy, DenseGraphBackend):
    pass


class SpyNative(_Spy, TorchNativeBackend):
    pass


@pytest.mark.parametrize("mode, exec_, backend", [
    (DECODE, Exec.EAGER, "SpyDense"), (DECODE, Exec.GRAPH, "SpyDense"), (TARGET_VERIFY, Exec.GRAPH, "SpyDense"),
    (DRAFT_EXTEND_V2, Exec.GRAPH, "SpyDense"), (EXTEND, Exec.EAGER, "SpyNative")], ids=str)
def test_forward_is_handed_the_fused_views(mode, exec_, backend):
    _Spy.seen = []
    r = run_case(f"{MODULE}:{backend}", FUSED[mode], exec_, torch.device("cpu"))
    assert r.outcome == "pass", r.message
    assert _Spy.seen and set(_Spy.seen) == {((ROW, D, 1),) * 3}, _Spy.seen


class _NoHooks:
    profile = SGLANG

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        pass


def test_extend_graph_static_inputs_are_fused():
    """EXTEND's token-bucket graphs hand forward() rows of these buffers."""
    harness = harness_for(_NoHooks(), run_setup(FUSED[EXTEND], Exec.GRAPH).fixtures)
    step = harness.steps[0]
    for q, k, v in zip(step.q, step.k, step.v):
        _fused_layout(q, k, v, harness.max_tokens)


def test_inputs_check_compares_bits():
    """Each changed input is named with how many values differ and the first token row; -0.0 is
    not 0.0, and a NaN kept is kept."""
    before = torch.randn(4, 2, 8)
    before[1, 0, 0] = float("nan")
    after = before.clone()
    zeros = torch.zeros(3, 2, 8)
    same = read_back([inputs_figures([Handed("q", "layer 0", after, before), Handed("k", "layer 0", zeros)])])
    assert check_inputs(same).ok
    after[2, 1, 3] = -after[2, 1, 3]
    signed = zeros.clone()
    signed[1, 0, 0] = -0.0
    check = check_inputs(read_back([inputs_figures([Handed("q", "layer 1", after, before),
                                                    Handed("v", "layer 0, padded rows", signed)])]))
    assert not check.ok and check.failure_class == "kernel" and check.graph_class == "graph"
    assert check.changed == [
        "q passed to forward was changed in place: 1 of 64 values differ, first in token row 2 (layer 1)",
        "v passed to forward was changed in place: 1 of 48 values differ, first in token row 1 "
        "(layer 0, padded rows)"]


class WritesLayerOneK(TorchNativeBackend):
    """Right output and KV writes; then k of layer 1 scaled in place."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out = super().forward(q, k, v, layer, batch, save_kv_cache)
        if layer.layer_id == 1:
            k.mul_(0.5)
        return out


@pytest.mark.parametrize("form", ["contiguous", "fused_qkv"])
def test_an_eager_write_is_a_kernel_failure_naming_the_input(form):
    case = FUSED[EXTEND].with_(inputs=form)
    r = run_case(f"{MODULE}:WritesLayerOneK", case, Exec.EAGER, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "kernel"), r.message
    assert r.message.startswith("eager batch 1/"), r.message
    assert "output ok" in r.message and "kv pool ok" in r.message, r.message
    assert "k passed to forward was changed in place" in r.message and "(layer 1)" in r.message, r.message
    assert "q passed" not in r.message and "v passed" not in r.message and "(layer 0)" not in r.message


class WritesLastRowInGraphs(DenseGraphBackend):
    """Right output; in graph runs only (captures and replays), q's last row written after."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out = super().forward(q, k, v, layer, batch, save_kv_cache)
        if self.graph_md is not None:
            q[-1:].add_(1.0)
        return out


@pytest.mark.parametrize("form", ["contiguous", "fused_qkv"])
def test_a_write_in_graphs_is_seen_at_capture_and_replay(form):
    """The static inputs are judged after each capture (they held zeros) and each replay: the
    first replay names what its captures changed, and what it changed itself. The batch run
    eagerly is right: graph."""
    case = FUSED[DECODE].with_(inputs=form)
    r = run_case(f"{MODULE}:WritesLastRowInGraphs", case, Exec.GRAPH, torch.device("cpu"))
    assert (r.outcome, r.failure_class) == ("fail", "graph"), r.message
    assert r.message.startswith("replay 1/4 (bs=8 in bucket 8)"), r.message
    assert "output ok" in r.message and "eager on the same batch is right" in r.message, r.message
    first = (f"q passed to forward was changed in place: {HQ * D} of {8 * HQ * D} values differ, first in token "
             f"row 7 (layer 0, zeroed rows, at the capture of bucket 8)")
    assert first in r.message and "; and 5 more inputs changed" in r.message, r.message


def test_a_replay_is_judged_against_the_batch_and_zeroed_padding():
    """After a replay, the static inputs' real rows must hold the batch's inputs (the kit's own,
    no copy of the buffers) and its padded rows zeros, in every layer."""
    case = FUSED[DECODE]  # bs 3, in bucket 4
    fixtures = run_setup(case, Exec.GRAPH).fixtures
    fx = next(f for f in fixtures if f.case == case)
    harness = harness_for(_NoHooks(), fixtures)
    harness._load(fx, 4, 4, [4])
    assert check_inputs(read_back([harness._kept(fx, [3], [4])])).ok
    harness.steps[0].v[1][3, 1, 5] = 2.0
    harness.steps[0].q[0][1, 0, 0] += 1.0
    changed = check_inputs(read_back([harness._kept(fx, [3], [4])])).changed
    assert changed == [f"q passed to forward was changed in place: 1 of {3 * HQ * D} values differ, first in token "
                       f"row 1 (layer 0)",
                       f"v passed to forward was changed in place: 1 of {HKV * D} values differ, first in token "
                       f"row 3 (layer 1, padded rows)"], changed


def test_a_request_has_the_same_inputs_in_any_batch_at_any_position():
    """A request's queries, keys and values are drawn from its own seed (kit.engine.inputs): given
    the same seed and lengths in another batch (other neighbours, another position, another batch
    size), every layer's inputs for it are the same bit for bit, and its neighbours' are not."""
    alone = small_case("alone", EXTEND, (7,), (5,), request_seeds=(41,))
    crowded = small_case("crowded", EXTEND, (30, 2, 7, 11), (3, 9, 5, 1), request_seeds=(1, 2, 41, 3), page=4,
                         layout="shuffled_pages")
    a, b = make_fixture(alone), make_fixture(crowded)
    for x, y in zip(a.inputs, b.inputs):
        assert torch.equal(x.q, y.q[12:17]) and torch.equal(x.k_new, y.k_new[12:17])
        assert torch.equal(x.v_new, y.v_new[12:17])
        assert torch.equal(x.k_old, y.k_old[32:39]) and torch.equal(x.v_old, y.v_old[32:39])
        assert not torch.equal(x.q, y.q[:5])
    drawn_again = small_case("crowded_again", EXTEND, (30, 2, 7, 11), (3, 9, 5, 1), request_seeds=(5, 2, 41, 3))
    again = make_fixture(drawn_again)
    assert torch.equal(again.inputs[1].k_new[3:12], b.inputs[1].k_new[3:12])  # request 2's: the same seed
    assert not torch.equal(again.inputs[1].k_new[:3], b.inputs[1].k_new[:3])  # request 1's: another seed
