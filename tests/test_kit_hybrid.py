"""Hybrid models (full-attention layers among linear ones, cases/linear.py's `layer_pattern`): the in-box
backend on every smoke case, eager and under a graph, how the step calls a backend, a graph's
padded-row bugs caught, which backends run them, the case lines' rules (the planted routing bugs of
tests/mutants/hybrid.py: tests/test_mutants.py)."""
from __future__ import annotations

import pytest
import torch

from backends.torch_native_hybrid import TorchNativeHybridBackend
from backends.torch_native_linear import TorchNativeLinearBackend
from cases.linear import FULL, SMOKE
from kit.engine.kinds.recurrent import FULL as FULL_LAYER, GRAPH_MODES, LINEAR, RecurrentCase
from kit.harness.capabilities import Capabilities
from kit.harness.recurrent import failures, padded_bucket, run_case
from kit.harness.scope import unsupported_reason
from kit.modes import Exec, ForwardMode
from tests.mutants.hybrid import (FullPaddedRowsUnwritten, FullVerifyMaskIgnored, LinearPaddedRowWrites,
                                  LinearRollbackOffByOne)

HYBRID = [c for c in SMOKE if c.layer_pattern]


def test_both_sets_have_a_hybrid_case_of_each_mode():
    for cases in (SMOKE, FULL):
        modes = {c.mode for c in cases if c.layer_pattern}
        assert modes == {ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY}


@pytest.mark.parametrize("case", HYBRID, ids=[c.name for c in HYBRID])
def test_in_box_backend_passes(case):
    assert failures(run_case(TorchNativeHybridBackend, case, Exec.EAGER)) is None


class Recording(TorchNativeHybridBackend):
    """The in-box backend, noting each call it gets."""

    calls: list = []

    def init_forward_metadata(self, batch):
        self.calls.append(("metadata", batch.full_attn_layers))
        super().init_forward_metadata(batch)

    def forward(self, *args):
        self.calls.append(("forward", args[-2].layer_id, len(args)))
        return super().forward(*args)


def test_one_metadata_call_then_every_layer_in_the_model_s_order_by_its_model_id():
    case = HYBRID[0]
    Recording.calls = []
    assert failures(run_case(Recording, case, Exec.EAGER)) is None
    gates = len(case.spec.gate_widths(case))
    assert Recording.calls == [("metadata", case.full_layers)] + [
        ("forward", i, 5 if kind == FULL_LAYER else 3 + gates) for i, kind in enumerate(case.layer_pattern)]


def test_a_verify_runs_the_step_after_it_through_both_halves_too():
    """The verify, then the decode each request continues from its kept drafts: each one metadata
    call, then every layer, full and linear, with the step's batch (its mode)."""
    case = next(c for c in HYBRID if c.mode == ForwardMode.TARGET_VERIFY)

    class Modes(Recording):
        def init_forward_metadata(self, batch):
            self.calls.append(("mode", batch.attention.forward_mode, batch.recurrent.forward_mode))
            super().init_forward_metadata(batch)

    Recording.calls = []
    verdicts = run_case(Modes, case, Exec.EAGER)
    assert failures(verdicts) is None
    gates = len(case.spec.gate_widths(case))
    layers = [("forward", i, 5 if kind == FULL_LAYER else 3 + gates) for i, kind in enumerate(case.layer_pattern)]
    assert Recording.calls == [call for mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DECODE) for call in
                               [("mode", mode, mode), ("metadata", case.full_layers)] + layers]
    after = f"the decode after the verify (accepted {list(case.accepted)})"
    assert [v.step for v in verdicts] == ["target_verify eager, full-attention layers 1, 3 (KV pool layers 0-1)",
                                          "target_verify eager", after + ", full-attention layers 1, 3 (KV pool "
                                          "layers 0-1)", after]


@pytest.mark.parametrize("mutant,says", [
    (FullVerifyMaskIgnored, "kernel: target_verify eager, full-attention layers 1, 3 (KV pool layers 0-1): layer 0 "
                            "output wrong"),
    (LinearRollbackOffByOne, "kv-write: target_verify eager: state pools wrong"),
])
def test_a_verify_only_bug_is_caught_in_the_verify_and_every_other_step_passes(mutant, says):
    """tests/mutants/hybrid.py's verify mutants: the full layers' verify mask ignored, the linear
    layers' drafts rolled back one too far."""
    for case in HYBRID:
        said = failures(run_case(mutant, case, Exec.EAGER))
        if case.mode == ForwardMode.TARGET_VERIFY:
            assert said is not None and said.startswith(says), said
        else:
            assert said is None, f"{case.name}: {said}"


def test_a_backend_of_linear_layers_alone_does_not_run_a_hybrid_and_the_hybrid_one_only_hybrids():
    hybrid, linear = HYBRID[0], next(c for c in SMOKE if not c.layer_pattern)
    said = unsupported_reason(TorchNativeLinearBackend, Capabilities.of(TorchNativeLinearBackend), hybrid, Exec.EAGER)
    assert "full_attention_layers" in said
    assert unsupported_reason(TorchNativeHybridBackend, Capabilities.of(TorchNativeHybridBackend), hybrid,
                              Exec.EAGER) is None
    assert "torch_native_linear runs it" in unsupported_reason(
        TorchNativeHybridBackend, Capabilities.of(TorchNativeHybridBackend), linear, Exec.EAGER)


GRAPHED = [c for c in HYBRID if c.mode in GRAPH_MODES]


@pytest.mark.parametrize("case", GRAPHED, ids=[c.name for c in GRAPHED])
def test_in_box_backend_passes_under_a_graph(case):
    assert failures(run_case(TorchNativeHybridBackend, case, Exec.GRAPH)) is None


def test_a_hybrid_graph_holds_every_layer_of_the_step_padded_to_the_engine_s_bucket():
    """Emulated (CPU): the capture's calls, then the replay's, each one metadata call and every
    layer's forward in the model's order, both halves' batches of the bucket's rows."""
    case = GRAPHED[0]
    Recording.calls = []

    class Sizes(Recording):
        def init_forward_metadata(self, batch):
            self.calls.append(("rows", batch.attention.batch_size, batch.recurrent.batch_size))
            super().init_forward_metadata(batch)

    assert failures(run_case(Sizes, case, Exec.GRAPH)) is None
    rows = padded_bucket(case.bs, TorchNativeHybridBackend.profile)
    gates = len(case.spec.gate_widths(case))
    step = [("rows", rows, rows), ("metadata", case.full_layers)] + [
        ("forward", i, 5 if kind == FULL_LAYER else 3 + gates) for i, kind in enumerate(case.layer_pattern)]
    assert rows > case.bs and Recording.calls == step * 2


def test_a_verify_graph_hands_the_full_layers_the_real_requests_mask_and_the_padded_ones_the_rules():
    """A backend that reads the verify's custom mask (SGLang's Triton) sees each real request's,
    as eager, at the replay; a padded request's attends its drafts' keys alone (TargetVerify's pad)."""
    case = next(c for c in GRAPHED if c.mode == ForwardMode.TARGET_VERIFY)
    masks = []

    class Masks(TorchNativeHybridBackend):
        def init_forward_metadata(self, batch):
            spec = batch.attention.spec_info  # None in the decode after the verify
            masks.append(None if spec is None else spec.custom_mask.clone())
            super().init_forward_metadata(batch)

    assert failures(run_case(Masks, case, Exec.EAGER)) is None
    eager = masks[0]
    masks.clear()
    assert failures(run_case(Masks, case, Exec.GRAPH)) is None
    replayed = masks[1]  # capture, replay, then the decode after the verify
    assert torch.equal(replayed[:eager.numel()], eager) and not eager.all()
    assert replayed[eager.numel():].all() and replayed.numel() > eager.numel()


@pytest.mark.parametrize("mutant,says", [
    (LinearPaddedRowWrites, "kv-write: decode graph: state pools wrong"),
    (FullPaddedRowsUnwritten, "graph: decode graph, full-attention layers 1, 3 (KV pool layers 0-1): padded rows"),
])
def test_a_graph_only_bug_is_caught_in_the_graph_run_and_the_eager_run_passes(mutant, says):
    """tests/mutants/hybrid.py's padded-row mutants: a padded row's state slot written, the full
    layers' padded rows left unwritten."""
    case = GRAPHED[0]
    assert failures(run_case(mutant, case, Exec.EAGER)) is None
    said = failures(run_case(mutant, case, Exec.GRAPH))
    assert said is not None and said.startswith(says), said


def test_a_hybrid_graph_run_of_a_mode_the_engines_do_not_capture_is_declined_with_its_reason():
    case = next(c for c in HYBRID if c.mode == ForwardMode.EXTEND)
    said = unsupported_reason(TorchNativeHybridBackend, Capabilities.of(TorchNativeHybridBackend), case, Exec.GRAPH)
    assert "extend of a recurrent layer is not captured in graphs" in said


@pytest.mark.parametrize("fields,says", [
    (dict(layer_pattern=(LINEAR, FULL_LAYER)), "the KV pool holds 2"),
    (dict(layer_pattern=(FULL_LAYER, FULL_LAYER)), "one 'linear' at least"),
    (dict(layer_pattern=(LINEAR, "mlp", FULL_LAYER, FULL_LAYER)), "'linear' or 'full' per layer"),
    (dict(layer_pattern=(LINEAR, FULL_LAYER, LINEAR, FULL_LAYER), attention_heads=(3, 2)), "kv dividing q"),
])
def test_a_wrong_pattern_is_refused_naming_the_fix(fields, says):
    fields = dict(dict(mode=ForwardMode.DECODE), **fields)
    with pytest.raises(ValueError, match=says):
        RecurrentCase("h", prefix=(3,), **fields)


def test_the_pools_hold_each_sort_of_layer_alone():
    """The state pools have a layer per linear layer and the KV pool one per full layer: Qwen3-Next's
    eight layers give six linear layers of state."""
    from kit.engine.recurrent_step import build

    case = next(c for c in FULL if c.layer_pattern).with_(heads=(1, 2), head_k_dim=8, head_v_dim=8, prefix=(1,))
    fx = build(case, "cpu")
    assert fx.geometry.layers == 6 and [layer.layer_id for layer in fx.layers] == [0, 1, 2, 4, 5, 6]
