"""The log-sum-exp a backend returns beside its output (`returns_lse`, docs/contract.md 'The log-sum-exp'):
the reference's, from the golden's own pass; its check and the reason it gives; a backend's declaration
held to what forward() returns."""
import math

import pytest
import torch

from backends.torch_native import TorchNativeBackend
from kit.harness.capabilities import Capabilities
from kit.harness.checks import LSE_ABS, lse_figures, read_back
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from tests.helpers import make_fixture, small_case

MODULE = __name__
# A window, a soft cap that bites (cap 5 at scale 0.25, as the catalog's cap cases), a hybrid model's
# second layer and sinks: every term of the contract's LSE.
EVERYTHING = dict(prefix=(5, 40, 0), heads=(8, 2), window=6, hybrid=True, sinks=True, cap=5.0, scale=0.25)
EXTEND_CASE = small_case("lse_extend", ForwardMode.EXTEND, new=(3, 2, 4), **EVERYTHING)
DECODE_CASE = small_case("lse_decode", ForwardMode.DECODE, **EVERYTHING)


def _lse_by_definition(step, layer):
    """[T, Hq] float64: per new token and query head, log(sum over the keys it sees, within the window,
    of exp(cap * tanh(scale * q.k / cap)) + exp(sink)), a token and a key at a time."""
    x, group = step.inputs[layer.layer_id], layer.tp_q_head_num // layer.tp_k_head_num
    found, row = [], 0
    for r, (keys, _) in zip(step.plan.requests, step.logical_kv(layer.layer_id)):
        for i in range(r.n_new):
            q_pos = r.q_pos[i]
            seen = [j for j in range(r.total) if r.visible[i, j] and (
                layer.sliding_window_size < 0 or r.key_pos[j] >= q_pos - layer.sliding_window_size)]
            heads = []
            for h in range(layer.tp_q_head_num):
                terms = []
                for j in seen:
                    logit = float(x.q[row, h].double() @ keys[j, h // group].double()) * layer.scaling
                    if layer.logit_cap > 0:
                        logit = layer.logit_cap * math.tanh(logit / layer.logit_cap)
                    terms.append(logit)
                if layer.sinks:
                    terms.append(layer.sinks[h])
                top = max(terms)
                heads.append(top + math.log(sum(math.exp(t - top) for t in terms)))
            found.append(heads)
            row += 1
    return torch.tensor(found, dtype=torch.float64)


@pytest.mark.parametrize("case", [EXTEND_CASE, DECODE_CASE], ids=lambda c: c.name)
def test_the_reference_lse_is_the_contracts_of_every_layer(case):
    fx = make_fixture(case)
    assert any(layer.sliding_window_size >= 0 for layer in fx.layers) and all(layer.sinks for layer in fx.layers)
    for layer in fx.layers:
        lse, envelope = fx.step.lse(layer.layer_id)
        assert envelope is None
        assert torch.allclose(lse.cpu(), _lse_by_definition(fx.step, layer), rtol=0, atol=1e-12)


def test_the_reference_keeps_its_lse_beside_its_output_from_one_pass(monkeypatch):
    """The LSE costs no second reference: the golden's pass gives both (one logsumexp per group)."""
    import kit.engine.reference as reference
    fx = make_fixture(EXTEND_CASE.with_(name="lse_one_pass", seed=3))
    calls = []
    real = reference._attend
    monkeypatch.setattr(reference, "_attend", lambda *a, **k: calls.append(1) or real(*a, **k))
    step = fx.step
    step.references.clear()
    step.lse(0)
    step.reference(1)
    assert len(calls) == len(fx.layers)  # each layer's one group, once


def _judged(lses, fx):
    refs = [fx.step.lse(layer.layer_id) for layer in fx.layers]
    return read_back([lse_figures(lses, refs, [f"layer {layer.layer_id} " for layer in fx.layers])])[0]


def test_the_check_passes_the_reference_in_float32_and_names_what_is_wrong():
    fx = make_fixture(EXTEND_CASE)
    right = [fx.step.lse(layer.layer_id)[0].float() for layer in fx.layers]
    assert all(c.ok for c in _judged(right, fx))
    wrong = [right[0], right[1].clone()]
    wrong[1][4, 3] += 4 * LSE_ABS + 1e-2 * wrong[1][4, 3].abs()
    first, second = _judged(wrong, fx)
    assert first.ok and not second.ok and second.bad_rows == [4]
    text = second.describe()
    assert text.startswith("layer 1 lse wrong: max err ") and "> tol " in text and text.endswith("rows [4]"), text
    assert second.excess > 1 >= first.excess


def test_an_lse_of_the_wrong_form_is_not_compared():
    fx = make_fixture(EXTEND_CASE)
    right = [fx.step.lse(layer.layer_id)[0].float() for layer in fx.layers]
    checks = _judged([right[0].t(), right[1].to(torch.int32)], fx)
    assert not any(c.ok for c in checks)
    assert "lse not compared: shape (8, 9)" in checks[0].describe() and "dtype torch.int32" in checks[1].describe()


@pytest.mark.parametrize("mutant, why", [
    ("tests.mutants.lse:LseInLog2", "natural log"), ("tests.mutants.lse:LseWithoutSinks", "sinks")])
@pytest.mark.parametrize("case", [EXTEND_CASE, DECODE_CASE], ids=lambda c: c.name)
def test_a_wrong_lse_beside_a_right_output_fails_as_kernel_saying_so(mutant, why, case):
    assert run_case("torch_native", case, Exec.EAGER).outcome == "pass"
    r = run_case(mutant, case, Exec.EAGER)
    assert (r.outcome, r.failure_class) == ("fail", "kernel"), (why, r.message)
    assert "layer 0 output ok" in r.message and "layer 0 lse wrong: max err" in r.message, r.message
    assert max(r.margins) > 1, r.margins


class LseUndeclared(TorchNativeBackend):
    returns_lse = False


class LseNotReturned(TorchNativeBackend):
    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        return super().forward(q, k, v, layer, batch, save_kv_cache)[0]


@pytest.mark.parametrize("backend, says", [
    ("LseUndeclared", "forward returned (out, lse) though the backend does not declare returns_lse"),
    ("LseNotReturned", "forward returned no log-sum-exp though the backend declares returns_lse")])
def test_forward_returns_an_lse_exactly_where_the_backend_declares_one(backend, says):
    r = run_case(f"{MODULE}:{backend}", DECODE_CASE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == ("fail", "crash") and says in r.message, r.message


def test_returns_lse_is_a_flag():
    class Bad(TorchNativeBackend):
        returns_lse = "yes"
    with pytest.raises(TypeError, match="returns_lse must be True or False"):
        Capabilities.of(Bad)
    assert Capabilities.of(TorchNativeBackend).returns_lse
