"""Declared numerics (kit.engine.numerics): the reference emulates the declared steps, a run is
judged under them and its record says so, and a backend that declares numerics it does not follow
(or follows numerics it does not declare) fails."""
from __future__ import annotations

import pytest
import torch

from kit.engine.numerics import (ALL, CONV_CAST, EXACT, NEW_AS_HANDED, P_CAST, P_FP8, P_HALF, Q_CAST, Q_FP8,
                                 ROPE_AS_HANDED, TF32, Numerics, composed, label)
from kit.engine.profile import SGLANG
from kit.engine.reference import declared, golden, lse_key
from kit.harness.capabilities import BadDeclaration, Capabilities
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from kit.report import known_failures
from kit.report.record import FAIL, KERNEL, PASS
from tests.helpers import make_fixture, small_case

TOYS = "tests.toys.numerics"


def _fp8(mode=ForwardMode.EXTEND, dtype="bf16", **shape):
    new = (3, 4, 1) if mode is ForwardMode.EXTEND else 1
    return small_case(f"fp8_{mode.value.lower()}", mode, prefix=(5, 0, 9), new=new, page=4, kv_dtype="fp8_e4m3",
                      dtype=dtype, **{"head_dim": 32, **shape})


MLA = dict(heads=(4, 1), head_dim=48, kv_lora_rank=32, rope_dim=16, scale=0.1)


def _fp32(mode=ForwardMode.EXTEND):
    return small_case(f"fp32_{mode.value.lower()}", mode, prefix=(5, 0, 9), new=(3, 4, 1), page=4, head_dim=32)


def test_steps_apply_where_their_precision_is_the_cases():
    n = Numerics(q_fp8=ALL, new_tokens_as_handed=("extend",), p_fp8=ALL, tf32_dots=ALL)
    shape = dict(grouped=True, latent=False)
    assert n.steps("extend", "bf16", "fp8_e4m3", "cuda", **shape) == (Q_FP8, NEW_AS_HANDED, P_FP8)
    assert n.steps("decode", "bf16", "fp8_e4m3", "cuda", **shape) == (Q_FP8, P_FP8)
    assert n.steps("decode", "bf16", None, "cuda", **shape) == ()
    assert n.steps("decode", "fp32", None, "cuda", **shape) == (TF32,)
    assert label(()) == EXACT and label((Q_FP8, TF32)) == "q fp8, tf32 dots"
    on_cuda = Numerics(q_fp8=ALL, tf32_dots=ALL, cuda_only=(Q_FP8, TF32))
    assert on_cuda.steps("decode", "fp32", "fp8_e4m3", "cpu", **shape) == ()
    assert on_cuda.steps("decode", "fp32", "fp8_e4m3", "cuda", **shape) == (Q_FP8, TF32)


def test_a_composed_backend_takes_every_step_of_each_part():
    full = Numerics(new_tokens_as_handed=("extend",), tf32_dots=ALL, grouped_only=("decode",), cuda_only=(TF32,))
    linear = Numerics(conv_cast=ALL, new_tokens_as_handed=("mixed",))
    both, grouped = composed(full, linear), dict(grouped=True, latent=False)
    assert both.steps("mixed", "fp32", "fp8_e4m3", "cuda", **grouped) == (NEW_AS_HANDED, TF32)
    assert both.steps("extend", "bf16", "fp8_e4m3", "cpu", **grouped) == (NEW_AS_HANDED, CONV_CAST)
    assert both.steps("decode", "fp32", None, "cpu", **grouped) == ()
    assert both.steps("decode", "fp32", None, "cuda", grouped=False, latent=False) == ()
    assert both.problem() == ""


def test_steps_apply_where_the_cases_heads_take_them():
    """grouped_only: in its modes nothing is taken where each query head has its own KV head;
    rope_as_handed: taken by MLA cases whose query is quantized."""
    n = Numerics(q_cast=ALL, p_cast=ALL, rope_as_handed=("decode",), tf32_dots=ALL, grouped_only=("decode",))
    assert n.steps("decode", "fp32", "fp8_e4m3", "cuda", grouped=False, latent=False) == ()
    assert n.steps("extend", "fp32", "fp8_e4m3", "cuda", grouped=False, latent=False) == (Q_CAST, P_CAST, TF32)
    assert n.steps("decode", "fp32", "fp8_e4m3", "cuda", grouped=True, latent=True) == (Q_CAST, ROPE_AS_HANDED,
                                                                                          P_CAST, TF32)
    assert n.steps("decode", "fp32", "fp8_e4m3", "cuda", grouped=True, latent=False) == (Q_CAST, P_CAST, TF32)
    assert n.steps("extend", "fp32", "fp8_e4m3", "cuda", grouped=True, latent=True) == (Q_CAST, P_CAST, TF32)
    mha, mla = _fp8(ForwardMode.DECODE, heads=(2, 2)), _fp8(ForwardMode.DECODE, **MLA)
    assert n.case_steps(mha, "cuda") == () and ROPE_AS_HANDED in n.case_steps(mla, "cuda")


@pytest.mark.parametrize("bad", [Numerics(q_fp8="extend"), Numerics(tf32_dots=("prefill",)), "tf32",
                                 Numerics(q_cast=("extend",), rope_as_handed=("decode",)),
                                 Numerics(grouped_only="decode")])
def test_malformed_declaration_is_refused(bad):
    cls = type("Declared", (), {"supports": classmethod(lambda c, case: None), "numerics": bad, "profile": SGLANG})
    with pytest.raises(BadDeclaration, match="Declared.numerics must be"):
        Capabilities.of(cls)


def test_emulation_takes_each_declared_step():
    """q quantized with k_scale and the new tokens as handed each move the float64 reference; the
    exact steps leave no envelope, an envelope step (p fp8, tf32) makes one that differs."""
    fx = make_fixture(_fp8())
    step = fx.step
    exact = golden(step, 0)
    for steps in ((Q_FP8,), (NEW_AS_HANDED,)):
        emulated, envelope = declared(step, steps)[0]
        assert envelope is None and (emulated - exact).abs().max() > 1e-3
    emulated, envelope = declared(step, (Q_FP8, P_FP8))[0]
    assert torch.equal(emulated, declared(step, (Q_FP8,))[0][0]) and (envelope - emulated).abs().max() > 1e-4
    emulated, envelope = declared(step, (Q_CAST, P_CAST))[0]
    assert (emulated - exact).abs().max() > 1e-3  # (the kit's scales are powers of two: near Q_FP8's)
    assert (envelope - emulated).abs().max() > 1e-4
    fx32 = make_fixture(_fp32())
    emulated, envelope = declared(fx32.step, (TF32,))[0]
    assert torch.equal(emulated, golden(fx32.step, 0)) and 1e-7 < (envelope - emulated).abs().max() < 1e-2


def test_new_tokens_as_handed_meet_the_query_as_handed():
    """A quantized query meets the keys the cache holds; the new tokens' keys, attended as handed, meet
    it as handed: request 1 of the case has no cached tokens, so its rows are those of NEW_AS_HANDED alone."""
    step = make_fixture(_fp8()).step
    both = declared(step, (Q_CAST, NEW_AS_HANDED))[0][0]
    handed = declared(step, (NEW_AS_HANDED,))[0][0]
    rows = slice(3, 7)  # request 1's new tokens (new=(3, 4, 1))
    assert torch.equal(both[rows], handed[rows]) and (both[:3] - handed[:3]).abs().max() > 1e-3


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE], ids=lambda m: m.value)
def test_declared_and_followed_passes_under_its_numerics(mode):
    r = run_case(f"{TOYS}:QuantizesQ", _fp8(mode), Exec.EAGER, device="cpu")
    assert (r.outcome, r.numerics) == (PASS, Q_FP8), r.message
    assert len(r.margins) == 2 and all(0 < m <= 1 for m in r.margins)


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE], ids=lambda m: m.value)
@pytest.mark.parametrize("toy", ["DeclaresQButDoesNot", "QuantizesQUndeclared"])
def test_declared_numerics_not_followed_fail(toy, mode):
    """Declares q quantization but attends q exactly, and the reverse: each is caught, by a wide margin."""
    r = run_case(f"{TOYS}:{toy}", _fp8(mode), Exec.EAGER, device="cpu")
    assert (r.outcome, r.failure_class) == (FAIL, KERNEL), r.message
    assert r.numerics == (Q_FP8 if toy == "DeclaresQButDoesNot" else EXACT)
    assert max(r.margins) > 2, r.margins


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_q_quantized_where_heads_are_grouped_passes_as_declared(heads):
    r = run_case(f"{TOYS}:QuantizesGroupedQ", _fp8(ForwardMode.DECODE, heads=heads), Exec.EAGER, device="cpu")
    assert (r.outcome, r.numerics) == (PASS, Q_FP8 if heads[0] > heads[1] else EXACT), r.message


def test_declared_grouped_only_but_quantizing_every_query_fails():
    """Declares each query head with a KV head of its own attended exactly (grouped_only), quantizes it."""
    r = run_case(f"{TOYS}:DeclaresGroupedQButQuantizesEvery", _fp8(ForwardMode.DECODE, heads=(2, 2)), Exec.EAGER,
                 device="cpu")
    assert (r.outcome, r.failure_class, r.numerics) == (FAIL, KERNEL, EXACT), r.message
    assert max(r.margins) > 2, r.margins


def test_rope_as_handed_emulation_quantizes_the_latent_columns_only():
    step = make_fixture(_fp8(ForwardMode.DECODE, **MLA)).step
    whole, latent = (declared(step, steps)[0][0] for steps in ((Q_FP8,), (Q_FP8, ROPE_AS_HANDED)))
    exact = golden(step, 0)
    assert (latent - exact).abs().max() > 1e-3 and (latent - whole).abs().max() > 1e-3


@pytest.mark.parametrize("toy, passes", [("QuantizesLatentQ", True), ("DeclaresRopeAsHandedButQuantizesIt", False),
                                         ("QuantizesLatentQUndeclared", False)])
def test_rope_as_handed_declared_and_followed_passes_and_else_fails(toy, passes):
    r = run_case(f"{TOYS}:{toy}", _fp8(ForwardMode.DECODE, dtype="fp32", **MLA), Exec.EAGER, device="cpu")
    if passes:
        assert (r.outcome, r.numerics) == (PASS, label((Q_FP8, ROPE_AS_HANDED))), r.message
    else:
        assert (r.outcome, r.failure_class) == (FAIL, KERNEL), r.message
        assert max(r.margins) > 2, r.margins


def test_tf32_declared_passes_within_its_envelope_and_undeclared_fails():
    declared_run = run_case(f"{TOYS}:TruncatesToTF32", _fp32(), Exec.EAGER, device="cpu")
    assert (declared_run.outcome, declared_run.numerics) == (PASS, TF32), declared_run.message
    undeclared = run_case(f"{TOYS}:TruncatesToTF32Undeclared", _fp32(), Exec.EAGER, device="cpu")
    assert (undeclared.outcome, undeclared.failure_class, undeclared.numerics) == (FAIL, KERNEL, EXACT)


def _long_bf16():
    """Many rows and heads whose first keys are few: where rounding each exp(s - max) to bf16 moves a
    row's log-sum-exp past its limit (as on FlashInfer's long prefills)."""
    return small_case("p_half_long", ForwardMode.EXTEND, prefix=(0, 0, 0, 0), new=(64, 64, 64, 64), page=16,
                      dtype="bf16", head_dim=32, heads=(32, 4))


def test_p_half_emulation_moves_the_lse_by_the_rounded_sum():
    step = make_fixture(_long_bf16()).step
    (exact, none), (emulated, envelope) = declared(step, ())[lse_key(0)], declared(step, (P_HALF,))[lse_key(0)]
    assert none is None and torch.equal(emulated, exact)
    assert 1e-4 < (envelope - exact).abs().max() < 2.0 ** -7


@pytest.mark.parametrize("toy, outcome", [("SumsRoundedProbs", PASS), ("SumsRoundedProbsUndeclared", FAIL),
                                          ("SumsRoundedProbsLseInLog2", FAIL)])
def test_p_half_declared_passes_and_undeclared_or_a_second_bug_fails(toy, outcome):
    """A backend that sums its probabilities rounded to bf16 passes under p_half; declared exact, its LSE
    fails (by the small margin FlashInfer's prefills showed); and p_half's envelope hides no LSE bug."""
    r = run_case(f"{TOYS}:{toy}", _long_bf16(), Exec.EAGER, device="cpu")
    assert r.outcome == outcome, r.message
    if outcome == FAIL:
        assert r.failure_class == KERNEL and "lse wrong" in r.message and "output wrong" not in r.message, r.message
    assert r.numerics == (EXACT if toy.endswith("Undeclared") else P_HALF)


def test_exact_backend_records_exact_numerics_and_margins():
    r = run_case("torch_native", _fp8(), Exec.EAGER, device="cpu")
    assert (r.outcome, r.numerics) == (PASS, EXACT) and len(r.margins) == 2


def _entry(cls_cell: str, backend: str):
    text = (f"<!-- known-failures:begin -->\n| KF-1 | {backend} | * | * | * | * | {cls_cell} | xfail | why | x.md |\n"
            f"<!-- known-failures:end -->\n")
    return known_failures.parse(text)[0]


def test_class_cell_pins_a_band_or_a_message():
    band = _entry("kernel 1.5-40x", "b")
    assert (band.failure_class, band.band, band.text, band.pinned) == (KERNEL, (1.5, 40.0), "", True)
    crash = _entry('crash "illegal memory access"', "b")
    assert (crash.failure_class, crash.band, crash.text) == ("crash", None, "illegal memory access")
    assert not _entry("kernel", "b").pinned
    per_layer = _entry("kernel 1200-16000x/0-1x", "b")
    assert (per_layer.band, per_layer.layer_bands, per_layer.pinned) == (None, ((1200.0, 16000.0), (0.0, 1.0)), True)
    assert "layer 0 1200-16000x, layer 1 0-1x" in per_layer.expects
    with pytest.raises(known_failures.KnownFailuresError, match="band 5-2x is empty"):
        _entry("kernel 5-2x", "b")


def test_a_second_bug_under_a_banded_known_failure_is_reported():
    """The known failure (q quantized, declared exact: 3-5x its limit) is expected within its band; a
    second bug in the same runs (V's scale applied twice) leaves the band and is reported."""
    entry = _entry("kernel 2-8x", "b")
    first = run_case(f"{TOYS}:QuantizesQUndeclared", _fp8(), Exec.EAGER, device="cpu")
    assert known_failures.is_expected(entry, first), (first.margins, first.message)
    second = run_case(f"{TOYS}:VScaleTwiceToo", _fp8(), Exec.EAGER, device="cpu")
    assert (second.outcome, second.failure_class) == (FAIL, KERNEL)
    assert not known_failures.is_expected(entry, second)
    assert known_failures.against(entry, second).startswith("not the known failure: KF-1")
    assert "expects [kernel] at 2-8x its limit" in known_failures.against(entry, second)
    assert known_failures.is_expected(_entry("kernel", "b"), second)  # an unpinned entry would hide it
