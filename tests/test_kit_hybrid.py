"""Hybrid models (full-attention layers among linear ones, cases/linear.py's `layer_pattern`): the in-box
backend on every smoke case, how the step calls a backend, which backends run them, the case lines'
rules (the planted routing bugs of tests/mutants/hybrid.py: tests/test_mutants.py)."""
from __future__ import annotations

import pytest

from backends.torch_native_hybrid import TorchNativeHybridBackend
from backends.torch_native_linear import TorchNativeLinearBackend
from cases.linear import FULL, SMOKE
from kit.engine.kinds.recurrent import FULL as FULL_LAYER, LINEAR, RecurrentCase
from kit.harness.capabilities import Capabilities
from kit.harness.recurrent import failures, run_case
from kit.harness.scope import unsupported_reason
from kit.modes import Exec, ForwardMode

HYBRID = [c for c in SMOKE if c.layer_pattern]


def test_both_sets_have_a_hybrid_case_of_each_mode():
    for cases in (SMOKE, FULL):
        modes = {c.mode for c in cases if c.layer_pattern}
        assert modes == {ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED}


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


def test_a_backend_of_linear_layers_alone_does_not_run_a_hybrid_and_the_hybrid_one_only_hybrids():
    hybrid, linear = HYBRID[0], next(c for c in SMOKE if not c.layer_pattern)
    said = unsupported_reason(TorchNativeLinearBackend, Capabilities.of(TorchNativeLinearBackend), hybrid, Exec.EAGER)
    assert "full_attention_layers" in said
    assert unsupported_reason(TorchNativeHybridBackend, Capabilities.of(TorchNativeHybridBackend), hybrid,
                              Exec.EAGER) is None
    assert "torch_native_linear runs it" in unsupported_reason(
        TorchNativeHybridBackend, Capabilities.of(TorchNativeHybridBackend), linear, Exec.EAGER)


def test_a_hybrid_graph_run_is_declined_with_its_reason():
    case = next(c for c in HYBRID if c.mode == ForwardMode.DECODE)
    said = unsupported_reason(TorchNativeHybridBackend, Capabilities.of(TorchNativeHybridBackend), case, Exec.GRAPH)
    assert "hybrid model's graphs" in said


@pytest.mark.parametrize("fields,says", [
    (dict(layer_pattern=(LINEAR, FULL_LAYER)), "the KV pool holds 2"),
    (dict(layer_pattern=(FULL_LAYER, FULL_LAYER)), "one 'linear' at least"),
    (dict(layer_pattern=(LINEAR, "mlp", FULL_LAYER, FULL_LAYER)), "'linear' or 'full' per layer"),
    (dict(layer_pattern=(LINEAR, FULL_LAYER, LINEAR, FULL_LAYER), attention_heads=(3, 2)), "kv dividing q"),
    (dict(layer_pattern=(LINEAR, FULL_LAYER, LINEAR, FULL_LAYER), mode=ForwardMode.TARGET_VERIFY, new=2,
          accepted=(1,)), "not target_verify"),
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
