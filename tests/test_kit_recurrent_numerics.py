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
from kit.engine.numerics import ALL, CONV_CAST, CONV_PRODUCTS, PREFILL, QK_CAST, STATE_CAST, Numerics, label
from kit.engine.recurrent_reference import run_request, ssd_chunks
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


class ChunkedSsd(TorchNativeLinearBackend):
    """torch_native_linear with Mamba2 computed as the engines' chunked SSD kernels compute a prefill:
    chunk by chunk (kit.engine.recurrent_reference.ssd_chunks), each chunk's output the starting state
    rounded to the model's dtype dotted with C plus C B^T, scaled by decay and dt and rounded, dotted
    with x; the state passed on the chunk's x dotted with B, scaled and rounded (chunk_state), plus the
    decayed starting state. Only the final state is kept, as the kernels keep it."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.model_dtype = ctx.dtype

    def init_forward_metadata(self, batch) -> None:
        super().init_forward_metadata(batch)
        self.positions = [total - n for total, n in zip(batch.seq_lens_cpu, batch.extend_seq_lens_cpu)]

    def _mamba2(self, layer, c, b, x, gates, state):
        def rounded(t):
            return t.to(self.model_dtype).float()
        group = layer.num_v_heads // layer.num_k_heads
        c, b = c.repeat_interleave(group, dim=2), b.repeat_interleave(group, dim=2)
        dt = torch.nn.functional.softplus(gates[0] + layer.dt_bias.float())  # [bs, L, H]
        log_decay = -layer.A_log.float().exp() * dt
        out, finals = torch.zeros_like(x), []
        for i, (n, position) in enumerate(zip(self.lens, self.positions)):
            h = state[i]
            for start, end in ssd_chunks(position, n):
                cum = log_decay[i, start:end].cumsum(0)  # [L, H]
                since = (cum[:, None] - cum[None]).clamp_max(0).exp() * dt[i, None, start:end]  # [m, k, H]
                since = since * torch.ones(end - start, end - start).tril()[:, :, None]
                cb = torch.einsum("mhn,khn->mkh", c[i, start:end], b[i, start:end])
                xs = x[i, start:end]
                out[i, start:end] = (torch.einsum("mhn,hnp->mhp", c[i, start:end], rounded(h)) * cum.exp()[..., None]
                                     + torch.einsum("mkh,khp->mhp", rounded(cb * since), xs)
                                     + layer.D.float()[:, None] * xs)
                written = rounded(b[i, start:end] * since[-1][..., None])  # [k, H, N]
                h = h * cum[-1].exp()[:, None, None] + torch.einsum("khn,khp->hnp", written, xs)
            finals.append(h)
        return list(out.unbind(1)), [torch.stack(finals)] * max(self.lens)


class DeclaresChunkedSsd(ChunkedSsd):
    numerics = Numerics(state_cast=PREFILL)


# a saved request whose tokens cross a chunk's end, and a new one
CROSSING = dataclasses.replace(CASES["mamba2_extend_chunks_bf16"], prefix=(250, 0), new=(300, 40))
# fp16's narrower floor: the chunk state's rounding shows in a state (a saved request's), not in the outputs
SHORT_FP16 = dataclasses.replace(CASES["mamba2_mixed_short"], dtype="fp16")


def test_ssd_chunks_end_on_multiples_of_the_chunk_size():
    assert ssd_chunks(250, 300) == [(0, 6), (6, 262), (262, 300)]
    assert ssd_chunks(0, 97) == [(0, 97)]
    assert ssd_chunks(256, 256) == [(0, 256)]


def test_the_chunked_form_without_its_casts_is_the_token_scan():
    """The reference's chunked SSD (STATE_CAST of float64 rows rounds nothing) gives the token scan's
    outputs and states, across chunk ends."""
    fx = build(CROSSING, "cpu")
    x = fx.inputs[0]
    requests = zip(x.rows.split(CROSSING.new_lens), x.gates[0].split(CROSSING.new_lens), fx.starts[0], CROSSING.prefix)
    for rows, dt, start, position in requests:
        args = (fx.layers[0], rows.double(), [dt.double()], start.window, start.state)
        scan, chunked = run_request(*args, position=position), run_request(*args, casts=(STATE_CAST,), position=position)
        assert torch.allclose(scan.out, chunked.out, rtol=0, atol=1e-12)
        assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(scan.states, chunked.states))
        assert len(chunked.states) == len(scan.states)


@pytest.mark.parametrize("case", [CROSSING, CASES["mamba2_mixed_fresh_chunks"], SHORT_FP16], ids=lambda c: c.name + c.dtype)
def test_chunked_ssd_declared_and_taken_passes(case):
    assert failures(run_case(DeclaresChunkedSsd, case)) is None


def test_chunked_ssd_taken_but_undeclared_fails_outputs():
    message = failures(run_case(ChunkedSsd, CASES["mamba2_mixed_fresh_chunks"]))
    assert message and "output wrong" in message, message


def test_chunked_ssd_taken_but_undeclared_fails_states():
    message = failures(run_case(ChunkedSsd, SHORT_FP16))
    assert message and "state pools wrong" in message, message


def test_the_state_check_takes_the_declared_envelope(monkeypatch):
    """Without the envelope, the state pools' check fails a chunked kernel's states that the
    declaration covers."""
    import kit.harness.recurrent_rules as rules
    monkeypatch.setattr(rules, "_references", lambda fx: [[(g, s, None) for g, s in zip(*layer)]
                                                          for layer in zip(fx.golden, fx.same_dtype)])
    message = failures(run_case(DeclaresChunkedSsd, SHORT_FP16))
    assert message and "state pools wrong" in message and "output wrong" not in message, message
