"""A recurrent backend's declared numerics (kit.engine.numerics: conv_products, conv_cast, qk_cast, state_cast):
a backend that declares a cast and takes it passes, one that declares it and does not take it fails,
as does one that takes a cast it does not declare."""
import dataclasses
import types

import pytest
import torch

import backends.torch_native_linear as native
from backends.torch_native_linear import TorchNativeLinearBackend
from cases.linear import FULL, SMOKE
from kit.engine.numerics import ALL, CONV_CAST, CONV_PRODUCTS, QK_CAST, STATE_CAST, Numerics, label
from kit.engine.recurrent_step import build
from kit.harness.recurrent import declared_casts, failures, record_run, run_case
from kit.modes import Exec
from kit.report.record import RunResult

CASES = {c.name: c for c in SMOKE + FULL}
CASE = CASES["gdn_extend_fresh_chunk_bf16"]


class DeclaresConvCast(TorchNativeLinearBackend):
    numerics = Numerics(conv_cast=ALL)


@pytest.fixture
def conv_output_in_bf16(monkeypatch):
    """torch_native_linear with its conv's SiLU output stored in bf16, as the engines' conv kernels store it."""
    silu = torch.nn.functional.silu
    functions = {n: getattr(torch.nn.functional, n) for n in dir(torch.nn.functional) if not n.startswith("_")}
    functions["silu"] = lambda x: silu(x).to(torch.bfloat16).to(x.dtype)
    monkeypatch.setattr(native, "F", types.SimpleNamespace(**functions))


def test_declared_and_taken_passes(conv_output_in_bf16):
    assert failures(run_case(DeclaresConvCast, CASE)) is None


def test_taken_but_undeclared_fails(conv_output_in_bf16):
    message = failures(run_case(TorchNativeLinearBackend, CASE))
    assert message and "output wrong" in message, message


def test_declared_but_not_taken_fails():
    message = failures(run_case(DeclaresConvCast, CASE))
    assert message and "output wrong" in message, message


def test_casts_apply_to_half_precision_only_and_are_recorded():
    assert declared_casts(DeclaresConvCast, CASE, "cpu") == ((CONV_CAST,),) * CASE.bs
    assert declared_casts(DeclaresConvCast, dataclasses.replace(CASE, dtype="fp32"), "cpu") == ((),) * CASE.bs
    result = RunResult("b", CASE.mode.value, Exec.EAGER.value, CASE.name, CASE.dtype, "pass")
    record_run(DeclaresConvCast, CASE, Exec.EAGER, "cpu", result)
    assert result.numerics == label((CONV_CAST,))


class DeclaresConvProducts(TorchNativeLinearBackend):
    numerics = Numerics(conv_products=ALL, conv_cast=ALL)


@pytest.fixture
def conv_products_in_bf16(conv_output_in_bf16, monkeypatch):
    """...and each conv tap's product rounded to bf16 before the sum, as Triton's `acc += x * w` on
    bf16 loads rounds it (both engines' causal_conv1d kernels)."""
    einsum = torch.einsum

    def products_rounded(equation, *operands):
        if equation != "bclw,cw->blc":
            return einsum(equation, *operands)
        taps, weights = operands
        return (taps * weights[:, None, :]).to(torch.bfloat16).float().sum(-1).transpose(1, 2)
    monkeypatch.setattr(torch, "einsum", products_rounded)


@pytest.mark.parametrize("case", ["gdn_decode_bf16_long", "gdn_extend_fresh_chunk_bf16"])
def test_conv_products_declared_and_taken_passes(conv_products_in_bf16, case):
    assert failures(run_case(DeclaresConvProducts, CASES[case])) is None


@pytest.mark.parametrize("case", ["gdn_decode_bf16_long"])
def test_conv_products_taken_but_undeclared_fails(conv_products_in_bf16, case):
    message = failures(run_case(DeclaresConvCast, CASES[case]))
    assert message and "output wrong" in message, message


def test_conv_products_declared_but_not_taken_fails(conv_output_in_bf16):
    message = failures(run_case(DeclaresConvProducts, CASES["gdn_decode_bf16_long"]))
    assert message and "output wrong" in message, message


def test_a_backend_that_splits_a_step_declares_each_requests_casts():
    """vLLM runs a prefilling request (new, or more than one token outside a verify) in the chunked
    prefill kernels whatever the step's mode, the others in the decode kernels: a DECODE step's new
    request takes the prefill casts, a MIXED step's decode rows do not."""
    from backends.vllm.gdn import VllmGdnBackend

    decode = CASES["gdn_decode_fresh"]
    assert set(decode.prefix) == {0}
    assert all(QK_CAST in c and STATE_CAST in c for c in declared_casts(VllmGdnBackend, decode, "cuda"))
    mixed = CASES["gdn_mixed"]
    casts = declared_casts(VllmGdnBackend, mixed, "cuda")
    for p, n, c in zip(mixed.prefix, mixed.new_lens, casts):
        assert (QK_CAST in c) == (p == 0 or n > 1), (p, n, c)
        assert CONV_PRODUCTS in c and CONV_CAST in c


def test_the_references_take_each_requests_casts():
    """A cast declared for one request rounds that request's reference only."""
    case = CASES["gdn_decode_ragged"]
    exact = build(case, "cpu")
    some = build(case, "cpu", casts=[(QK_CAST,) if i == 0 else () for i in range(case.bs)])
    for i, (e, s) in enumerate(zip(exact.golden[0], some.golden[0])):
        assert torch.equal(e.out, s.out) == (i != 0), i
