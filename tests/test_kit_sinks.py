"""Attention sinks (gpt-oss): the case feature, the model's sink logits, the reference, and who may run them."""
import math

import pytest
import torch

from backends.flashinfer import FlashInferBackend
from backends.sglang.adapter import SGLangFlashInferBackend, SGLangTorchNativeBackend
from backends.torch_native import TorchNativeBackend
from backends.triton import TritonBackend
from kit.engine.layer import SINK_HIGH, SINK_LOW, model_layers
from kit.engine.pools import CASE_LAYER_ID
from kit.engine.reference import attention
from kit.harness.capabilities import BadDeclaration, Capabilities
from kit.engine.profile import SGLANG
from kit.harness.protocol import AttentionBackend
from kit.harness.runner import run_case
from kit.harness.scope import unsupported_reason
from kit.engine.schedule import batches
from kit.modes import Exec, ForwardMode
from kit.report.record import PASS, UNSUPPORTED
from tests.helpers import make_fixture, small_case

DECODE, TARGET_VERIFY = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY


def _sinks_case(mode=DECODE, **kw):
    fields = dict(prefix=(5, 40, 0), new=1 if mode is DECODE else 3, heads=(8, 2), window=6, hybrid=True, sinks=True)
    fields.update(kw)
    return small_case("sinks", mode, **fields)


def test_a_sinks_case_names_its_feature():
    """(A bad sinks line: tests/test_kit_catalog.py's test_case_rejects_bad_lines.)"""
    assert _sinks_case().features == ("sinks",) and _sinks_case(sinks=False).features == ()


def test_every_layer_has_its_own_sinks_that_matter_exactly_in_bf16():
    case = _sinks_case(heads=(16, 2))
    layers = model_layers(case)
    assert all(len(layer.sinks) == 16 for layer in layers) and layers[0].sinks != layers[1].sinks
    for layer in layers:  # spread over the range: some take most of a short context's mass, some are negative
        assert min(layer.sinks) < 0 and max(layer.sinks) > math.log(8)
        assert all(SINK_LOW <= s <= SINK_HIGH for s in layer.sinks)
        exact = layer.sinks_tensor("cpu", torch.bfloat16).to(torch.float64)
        assert exact.tolist() == list(layer.sinks), "a bf16 sinks parameter holds the values exactly"
    assert all(not layer.sinks for layer in model_layers(case.with_(sinks=False)))


@pytest.mark.parametrize("exec_", list(Exec))
def test_every_batch_of_a_run_runs_the_same_sinks(exec_):
    """The backend is built once for the run's model (BackendContext: model_layers(case)); every batch's
    reference must use those sinks, though its case has another name, lengths and data seed."""
    case = _sinks_case()
    model = model_layers(case)
    assert all(model_layers(b) == model for b in batches(case, exec_, SGLANG))


def _naive(fx, layer_id=CASE_LAYER_ID):
    """Out of one layer, query by query and head in float64, from the definition: a sink term in the
    denominator, no value."""
    layer, x = fx.layers[layer_id], fx.inputs[layer_id]
    group = layer.tp_q_head_num // layer.tp_k_head_num
    out, row = torch.zeros(x.q.shape[:-1] + (layer.v_head_dim,), dtype=torch.float64), 0
    for r, (k, v) in zip(fx.plan.requests, fx.logical_kv(layer_id)):
        k, v = k.double(), v.double()
        for i in range(r.n_new):
            for h in range(layer.tp_q_head_num):
                s = (k[:, h // group] @ x.q[row, h].double()) * layer.scaling
                if layer.logit_cap > 0:
                    s = layer.logit_cap * torch.tanh(s / layer.logit_cap)
                seen = r.visible[i].clone()
                if layer.sliding_window_size >= 0:
                    kp = torch.tensor(r.key_pos)
                    seen &= kp >= r.q_pos[i] - layer.sliding_window_size
                e = torch.exp(s[seen])
                out[row, h] = (e[:, None] * v[seen, h // group]).sum(0) / (e.sum() + math.exp(layer.sinks[h]))
            row += 1
    return out


@pytest.mark.parametrize("mode", [DECODE, TARGET_VERIFY], ids=lambda m: m.value)
def test_the_reference_takes_the_sink_into_every_denominator(mode):
    fx = make_fixture(_sinks_case(mode, topk=2) if mode is TARGET_VERIFY else _sinks_case(mode))
    for layer_id in (0, 1):  # the hybrid's full-attention layer (capped) and its window layer
        golden = attention(fx, torch.float64, layer_id)
        torch.testing.assert_close(golden, _naive(fx, layer_id), rtol=1e-9, atol=1e-12)
        # and in the case's dtype, as the tolerance's same-dtype reference
        torch.testing.assert_close(attention(fx, torch.float32, layer_id), golden.float(), rtol=1e-4, atol=1e-5)
    plain = make_fixture(fx.case.with_(sinks=False))
    assert (attention(plain, torch.float64) - attention(fx, torch.float64)).abs().max() > 0.1, "sinks change the output"


class WrittenBeforeSinks(AttentionBackend):
    """A backend that declares no attention features: it would run a sinks case and ignore them."""

    profile = SGLANG

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        raise AssertionError("never called for a sinks case")


def test_a_backend_that_does_not_declare_sinks_reads_unsupported():
    case = _sinks_case()
    caps = Capabilities.of(WrittenBeforeSinks)
    reason = caps.feature_reason(case)
    assert "sinks" in reason and "attention_features" in reason
    assert caps.feature_reason(case.with_(sinks=False)) is None
    for exec_ in Exec:
        result = run_case("tests.test_kit_sinks:WrittenBeforeSinks", case, exec_)
        assert result.outcome == UNSUPPORTED and result.message.startswith("attention sinks")
    assert run_case("torch_native", case, Exec.EAGER).outcome == PASS


@pytest.mark.parametrize("backend", [SGLangFlashInferBackend, SGLangTorchNativeBackend], ids=lambda b: b.name)
def test_backends_without_sinks_say_why(backend):
    """Their own reason (what their library lacks), before the kit's generic one."""
    case = _sinks_case(dtype="fp16", head_dim=64, hybrid=False)
    reason = unsupported_reason(backend, Capabilities.of(backend), case, Exec.EAGER)
    assert reason.startswith("attention sinks:") and "attention_features" not in reason, reason


def test_the_in_box_backends_declare_sinks():
    assert all(Capabilities.of(b).feature_reason(_sinks_case()) is None
               for b in (TorchNativeBackend, TritonBackend, FlashInferBackend))


def test_flashinfer_says_its_sink_variant_takes_no_soft_cap_nor_tree_mask():
    """FlashInfer's AttentionSink variant applies neither a soft cap nor a custom mask: a tree
    verify would attend every draft, a chain runs causal."""
    flat = dict(dtype="fp16", head_dim=64, hybrid=False)
    case = _sinks_case(**flat)
    assert FlashInferBackend.supports(case.with_(cap=30.0)).startswith("attention sinks with a logit soft cap")
    tree = _sinks_case(TARGET_VERIFY, new=4, topk=2, **flat)
    assert FlashInferBackend.supports(tree).startswith("attention sinks in a tree verify")
    for runnable in (case, _sinks_case(TARGET_VERIFY, new=4, **flat)):
        assert "sinks" not in (FlashInferBackend.supports(runnable) or "")


def test_a_malformed_features_declaration_is_refused():
    class OneString(WrittenBeforeSinks):
        attention_features = "sinks"  # a string, not a tuple: "s", "i", ... would each be a feature

    with pytest.raises(BadDeclaration, match="attention_features must be a tuple"):
        Capabilities.of(OneString)
