"""Evidence for the SGLang findings in KNOWN_FAILURES.md: for each, a reference that follows
the convention SGLang follows instead of the kit's reproduces what SGLang computes, on the
failing run's own batch. Skipped, with the reason, only where the pinned sglang is not installed."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends.sglang.adapter import (SGLangFlashInferBackend, SGLangFlexAttentionBackend, SGLangTorchNativeBackend,
                                     SGLangTritonBackend, SGLangTritonDraftBackend, sglang_problem)
from kit.engine.catalog import load_catalog
from kit.modes import Exec, ForwardMode
from kit.engine.reference import attention, declared
from kit.harness.guard import Guard
from kit.harness.runner import default_device, run_case
from kit.report import known_failures
from kit.report.record import read_results_file
from tests.mutants.sglang import _TritonMutant, patched_module
from tests.helpers import run_setup

pytestmark = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))

DEVICE = default_device()
# fp32 cases: SGLang's error against the reference it follows. On NVIDIA GPUs SGLang's Triton
# kernels compute fp32 tl.dot in TF32 (10-bit mantissa, unit roundoff 2**-11): a few of its units.
TIGHT = 1e-4 if DEVICE.type == "cpu" else 5e-3


def _sglang_run(mode, case_name, backend_cls=SGLangTritonBackend):
    """(fixture, SGLang's per-layer outputs, the backend) on the case's own batch (its batch in an eager run)."""
    case = load_catalog().find_case(mode, case_name)
    setup = run_setup(case, Exec.EAGER, DEVICE, backend_cls)
    fx = setup.case_fixture
    fx.install()
    backend = setup.new_backend()
    backend.init_forward_metadata(fx.batch)
    # Copies of k and v: SGLang's fp8 write divides them by the layer's scales in place (KF-24).
    return fx, [backend.forward(x.q, x.k_new.clone(), x.v_new.clone(), layer, fx.batch).double()
                for layer, x in zip(fx.layers, fx.inputs)], backend


def _sglang_outputs(mode, case_name, backend_cls=SGLangTritonBackend):
    """SGLang's per-layer outputs on the case's own batch (its batch in an eager run)."""
    return _sglang_run(mode, case_name, backend_cls)[:2]


def _err(a, b):
    return (a - b).abs().max().item()


def test_kf1_triton_decode_window_attends_one_key_fewer():
    """Decode with window W attends W keys (p-W+1..p), extend W+1 (p-W..p): the kit's reference
    with window W-1 is what SGLang's decode computes."""
    fx, outs = _sglang_outputs(ForwardMode.DECODE, "mha_bs1_window_p64_inter")
    layer_id = 1
    one_fewer = dataclasses.replace(fx, layers=tuple(
        dataclasses.replace(layer, sliding_window_size=layer.sliding_window_size - 1) for layer in fx.layers))
    assert _err(outs[layer_id], attention(fx, layer_id=layer_id)) > 0.1
    assert _err(outs[layer_id], attention(one_fewer, layer_id=layer_id)) < TIGHT


@pytest.mark.parametrize("case_name", ["gqa_hybrid_tree4_p16_fp32", "gqa_tree8_window4_p16_inter"])
def test_kf2_triton_tree_verify_windows_drafts_by_index_not_position(case_name):
    """In a verify tree a draft at depth d < its index i has position seq_len + d; SGLang's extend
    kernel windows it as if at seq_len + i (extend_attention.py:563-568): the kit's reference
    with draft positions = index is what SGLang computes."""
    fx, outs = _sglang_outputs(ForwardMode.TARGET_VERIFY, case_name)
    layer_id = next(i for i, layer in enumerate(fx.layers) if layer.sliding_window_size >= 0)
    by_index = dataclasses.replace(fx, plan=dataclasses.replace(fx.plan, requests=[
        dataclasses.replace(r, q_pos=[r.n_old + i for i in range(r.n_new)]) for r in fx.plan.requests]))
    assert _err(outs[layer_id], attention(fx, layer_id=layer_id)) > 0.1
    assert _err(outs[layer_id], attention(by_index, layer_id=layer_id)) < TIGHT


def test_kf5_torch_native_ignores_logit_cap():
    """TorchNativeAttnBackend attends without the layer's soft cap: the kit's reference with the cap
    off is what it computes."""
    case = load_catalog().find_case(ForwardMode.DECODE, "gqa_bs8_cap_p1_nonmono")
    setup = run_setup(case, Exec.EAGER, DEVICE, SGLangTorchNativeBackend)
    fx = setup.case_fixture
    fx.install()
    backend = setup.new_backend()
    backend.init_forward_metadata(fx.batch)
    layer, x = fx.layers[1], fx.inputs[1]
    out = backend.forward(x.q, x.k_new, x.v_new, layer, fx.batch).double()
    uncapped = dataclasses.replace(fx, layers=tuple(dataclasses.replace(l, logit_cap=0.0) for l in fx.layers))
    assert _err(out, attention(fx, layer_id=1)) > 1e-3
    assert _err(out, attention(uncapped, layer_id=1)) < TIGHT


class ScaleTwice(SGLangTorchNativeBackend):
    """A second bug under KF-6: TorchNativeAttnBackend's decode scales the logits twice (torch_native_backend.py:268),
    in every layer, the capped one (which KF-6's dropped cap already fails) included."""

    def _impl_class(self):
        return patched_module("sglang.srt.layers.attention.torch_native_backend", 268, "scale=scaling,",
                              "scale=scaling * 2,").TorchNativeAttnBackend


def test_kf6_a_second_bug_in_its_region_is_not_the_known_failure():
    """KF-6 (KNOWN_FAILURES.md as committed) covers the committed CPU record of this run; the same run with a
    second bug planted fails [kernel] too, its capped layer within KF-6's band, and is reported: the entry
    pins each layer's band, and the uncapped layer must pass."""
    entries = known_failures.load_or_default()
    record = next(r for r in read_results_file(Path(__file__).parents[1] / "results" / "cpu.json").records
                  if r.test_id == "sglang_torch_native-decode-eager-gqa_hybrid_p16_fp32")
    entry = known_failures.covering(entries, record)
    assert entry is not None and entry.id == "KF-6", known_failures.against(entry, record)
    case = load_catalog().find_case(ForwardMode.DECODE, "gqa_hybrid_p16_fp32")
    planted = run_case(f"{__name__}:ScaleTwice", case, Exec.EAGER, torch.device("cpu"))  # as the record ran
    assert (planted.outcome, planted.failure_class) == ("fail", "kernel"), planted.message
    assert entry.layer_bands[0][0] <= planted.margins[0] <= entry.layer_bands[0][1], planted.margins
    assert not known_failures.is_expected(entry, planted)
    assert known_failures.against(entry, planted).startswith("not the known failure: KF-6")


@pytest.mark.parametrize("mode, case_name, off", [
    (ForwardMode.DECODE, "mha_bs1_window_p64_inter", dict(sliding_window_size=-1)),
    (ForwardMode.EXTEND, "gqa_bs8_cap_p1_nonmono", dict(logit_cap=0.0))])
def test_kf28_kf29_flex_ignores_the_window_and_the_logit_cap(mode, case_name, off):
    """TorchFlexAttnBackend builds causal (EXTEND) or full (DECODE) block masks and calls flex
    attention without a score modifier: the kit's reference with the layer's window or cap off is
    what it computes."""
    fx, outs = _sglang_outputs(mode, case_name, SGLangFlexAttentionBackend)
    without = dataclasses.replace(fx, layers=tuple(dataclasses.replace(layer, **off) for layer in fx.layers))
    assert _err(outs[1], attention(fx, layer_id=1)) > 1e-3
    assert _err(outs[1], attention(without, layer_id=1)) < TIGHT


def _rel(out, ref):
    """The error's RMS relative to the reference's (the kit's magnitude measure)."""
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashInferAttnBackend runs on CUDA GPUs only")
BF16_CLOSE = 0.01  # bf16 cases: a few of bf16's units (2**-8) of relative RMS


@on_cuda
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY],
                         ids=lambda m: m.value)
def test_kf12_flashinfer_plans_without_the_logit_cap(mode):
    """FlashInfer fixes the soft cap at plan(); SGLang passes it only at forward (flashinfer_backend.py
    :1370-1570, no plan call has it), so the kernel runs uncapped: the reference without the cap is what
    SGLang computes."""
    name = "gqa_cap_tree6_p16" if mode is ForwardMode.TARGET_VERIFY else "gqa_cap_p1"
    fx, outs = _sglang_outputs(mode, name, SGLangFlashInferBackend)
    uncapped = dataclasses.replace(fx, layers=tuple(dataclasses.replace(l, logit_cap=0.0) for l in fx.layers))
    for layer_id, out in enumerate(outs):
        assert _rel(out, attention(fx, layer_id=layer_id)) > 0.1
        assert _rel(out, attention(uncapped, layer_id=layer_id)) < BF16_CLOSE


@on_cuda
def test_kf13_flashinfer_extend_leaves_the_window_off_the_new_tokens():
    """SGLang's FlashInfer EXTEND attends the cached prefix through a windowed paged pass and the new
    tokens through a ragged pass planned without window_left (flashinfer_backend.py:1460-1503): a new
    token sees every earlier new token. The reference whose window applies to prefix keys only is what
    SGLang computes."""
    fx, outs = _sglang_outputs(ForwardMode.EXTEND, "gqa_window_p16", SGLangFlashInferBackend)
    requests = []
    for r in fx.plan.requests:
        q_pos, key_pos = torch.tensor(r.q_pos).unsqueeze(1), torch.tensor(r.key_pos).unsqueeze(0)
        new_key = torch.arange(r.total).unsqueeze(0) >= r.n_old
        window = fx.layers[0].sliding_window_size
        requests.append(dataclasses.replace(r, visible=r.visible & (new_key | (key_pos >= q_pos - window))))
    prefix_window_only = dataclasses.replace(
        fx, plan=dataclasses.replace(fx.plan, requests=requests),
        layers=tuple(dataclasses.replace(l, sliding_window_size=-1) for l in fx.layers))
    for layer_id, out in enumerate(outs):
        assert _rel(out, attention(fx, layer_id=layer_id)) > 0.1
        assert _rel(out, attention(prefix_window_only, layer_id=layer_id)) < BF16_CLOSE


def test_kf24_fp8_write_divides_the_callers_k_and_v_in_place():
    """MHATokenToKVPool.set_kv_buffer with an fp8 cache and scales: `cache_k.div_(k_scale)` and
    `cache_v.div_(v_scale)` (memory_pool.py L2926-L2930) change the k and v the caller handed,
    which the model goes on to use; the kit's inputs check names them in every fp8 run."""
    from tests.test_sglang_adapter import _built, small_case
    case = small_case("fp8", ForwardMode.EXTEND, (3, 5), (2, 4), dtype="fp16", page=4, kv_dtype="fp8_e4m3")
    fx, backend = _built(case)
    layer, x = fx.layers[1], fx.inputs[1]
    attn = backend.layers[layer]
    k, v = x.k_new.clone(), x.v_new.clone()
    backend.runner.token_to_kv_pool.set_kv_buffer(attn, fx.batch.out_cache_loc, k, v, attn.k_scale, attn.v_scale)
    assert attn.k_scale != 1 and attn.v_scale != 1
    assert torch.equal(k, x.k_new / attn.k_scale) and torch.equal(v, x.v_new / attn.v_scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a GPU's: Triton's CPU interpreter computes fp32")
def test_sglang_triton_fp32_dots_are_tf32_on_nvidia_gpus_and_pass_as_declared(tmp_path):
    """SGLang's Triton kernels leave tl.dot's input precision to Triton, whose default on a GPU with
    tensor cores is TF32: the run is judged under its declared tf32 dots (the reference's operands
    truncated as the tensor cores take them) and passes, as does the same run with Triton's fp32
    default set to IEEE (and a kernel cache of its own), judged the same way."""
    def run(**env):
        cmd = [sys.executable, "-m", "kit", "run", "--backend", "sglang_triton", "--mode", "decode", "--exec", "eager",
               "--case", "gqa_fp32_ragged_p16", "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env))
        return json.loads(proc.stdout.strip().splitlines()[-1])

    tf32 = run()
    ieee = run(TRITON_F32_DEFAULT="ieee", TRITON_CACHE_DIR=str(tmp_path / "triton-ieee"))
    assert (tf32["outcome"], tf32["numerics"]) == ("pass", "tf32 dots"), tf32["message"]
    assert ieee["outcome"] == "pass", ieee["message"]


def test_kf34_triton_draft_window_attends_one_key_fewer():
    """TritonMultiStepDraftBackend's window rail (generate_draft_decode_window_kv_indices,
    kernels/ops/speculative/cache_locs.py) gives step i's window layers the last
    min(seq_len + i + 1, W) keys: W keys, KF-1's count, where the kit takes W + 1. The kit's reference
    with window W - 1 is what every step computes."""
    case = load_catalog().find_case(ForwardMode.DRAFT_DECODE, "mha_bs1_chain4_window_p64_inter")
    setup = run_setup(case, Exec.EAGER, DEVICE, SGLangTritonDraftBackend)
    fx = setup.case_fixture
    fx.install()
    backend = setup.new_backend()
    backend.init_forward_metadata(fx.batch)
    for step in fx.steps:
        one_fewer = dataclasses.replace(step, layers=tuple(
            dataclasses.replace(layer, sliding_window_size=layer.sliding_window_size - 1) for layer in step.layers))
        for layer, x in zip(step.layers, step.inputs):
            out = backend.forward(x.q, x.k_new, x.v_new, layer, step.batch).double()
            assert _err(out, attention(step, layer_id=layer.layer_id)) > 0.1
            assert _err(out, attention(one_fewer, layer_id=layer.layer_id)) < TIGHT


def test_kf37_triton_draft_kv_indices_rows_sized_by_the_model_context_length():
    """TritonMultiStepDraftBackend sizes each step's kv_indices row by bs * topk * model_config.context_len
    (draft_kv_indices_buffer_width with max_context_len = context_len, triton_backend.py:2538, :2717),
    while a lane of a request near that length reads up to `steps` keys past it, in the req_to_token
    row's headroom (sgl-project/sglang#29695): the steps' key lists run past their rows (kv_indptr past
    each row's length), and the last row past the buffer's end, which the kit's guard sees. Its decode
    kernel then reads indices past the rows (the suite's run of it faults the process: quarantined)."""
    from kit.harness.guard import Guard

    case = load_catalog().find_case(ForwardMode.DRAFT_DECODE, "gqa_context_edge_chain6_p1_fp32")
    setup = run_setup(case, Exec.EAGER, DEVICE, SGLangTritonDraftBackend)
    fx = setup.fixtures[0]  # the eager sequence's first batch: every request within `steps` of the longest
    fx.install()
    backend = setup.new_backend()
    row = fx.batch.batch_size * case.topk * backend.ctx.context_len
    assert backend.ctx.context_len < backend.ctx.max_context_len
    guard = Guard()
    with guard.watching():
        backend.init_forward_metadata(fx.batch)
    ends = [int(step.forward_metadata.kv_indptr[-1]) for step in backend.impl.attn_backends]
    assert all(step.forward_metadata.kv_indices.numel() <= row for step in backend.impl.attn_backends)
    assert max(ends) > row, (ends, row)
    assert "wrote past the end" in guard.check().describe()


def _judged(fx, outs, case, backend_cls):
    """Each layer's output as the kit judges it on CPU: against the reference of the backend's declared
    numerics (kit.engine.reference.declared), within their envelope."""
    from kit.harness.checks import output_figures, read_back

    steps = backend_cls.numerics.case_steps(case, "cpu")
    refs = declared(fx, steps)
    layer_ids = range(len(outs))
    same_dtype = [attention(fx, case.torch_dtype, layer_id=i) for i in layer_ids]
    goldens = [attention(fx, layer_id=i) for i in layer_ids]
    return read_back([output_figures(outs, goldens, same_dtype, case.torch_dtype, [f"layer {i} " for i in layer_ids],
                                     [refs[i] for i in layer_ids])])[0]


@pytest.mark.skipif(DEVICE.type != "cpu", reason="on CPU SGLang's Triton kernels run in Triton's interpreter")
@pytest.mark.parametrize("mode, case_name", [(ForwardMode.DECODE, "gqa_fp8_e4m3_p16_fp16"),
                                             (ForwardMode.EXTEND, "gqa_fp8_e5m2_prefix_p16_fp16")],
                         ids=lambda v: getattr(v, "value", v))
def test_kf24_kf25_cpu_fp8_outputs_were_off_by_the_interpreters_fp8_cast(monkeypatch, mode, case_name):
    """SGLang's Triton kernels cast q and p to an fp8 cache's dtype (decode_attention.py:661, :762;
    extend_attention.py:619, :712). Triton's interpreter rounds that cast's ties up and loses a carry out of
    the mantissa at an odd exponent (1.97 -> 1.0 in e4m3); the kit's interpreter rounds it as a GPU does
    (kit.harness.interpreter). So cast, SGLang's outputs are within the declared numerics (q and p cast
    to fp8) of the kit's reference; with the interpreter's own cast, each layer fails by a head's error of
    a quarter of its RMS: the 20-35% of KF-24/KF-25 on CPU, not SGLang's."""
    from kit.harness import interpreter
    from triton.runtime import interpreter as triton_interpreter

    interpreter.install()
    case = load_catalog().find_case(mode, case_name)
    fx, outs = _sglang_outputs(mode, case_name)
    assert all(c.ok for c in _judged(fx, outs, case, SGLangTritonBackend)), [c.describe() for c in _judged(
        fx, outs, case, SGLangTritonBackend)]
    builder = triton_interpreter.InterpreterBuilder
    monkeypatch.setattr(builder, "create_fp_to_fp", builder.create_fp_to_fp.__wrapped__)
    fx, outs = _sglang_outputs(mode, case_name)
    checks = _judged(fx, outs, case, SGLangTritonBackend)
    assert all(not c.ok and c.max_rel > 0.15 for c in checks), [c.describe() for c in checks]


def _split_p_cast(fx, layer_id: int, splits, block: int, steps) -> torch.Tensor:
    """A decode's float64 output with q as `steps` take it and p cast to the cache's fp8 type as SGLang's split-KV
    decode casts it: each request's keys in `splits` of whole 32-key units (kv_len_per_split), each split in
    tiles of `block` keys, a tile's p = exp(s - the split's running maximum through that tile), rounded; the
    softmax's sum unrounded (decode_attention.py:630-640, :754-770)."""
    from kit.engine.reference import _queries, as_read, logical_kv

    layer, kv_dtype = fx.layers[layer_id], fx.case.kv_torch_dtype
    x = as_read(fx, layer_id)
    queries = _queries(x.q, layer, kv_dtype, steps).double()
    rows = []
    for q, r, (k, v), count in zip(queries, fx.plan.requests, logical_kv(fx.plan, x), splits):
        group = q.shape[0] // k.shape[1]
        s = torch.einsum("hd,khd->hk", q, k.double().repeat_interleave(group, 1)) * layer.scaling
        split = -(-r.total // count)
        split = -(-split // 32) * 32  # kv_len_per_split: whole MIN_BLOCK_KV units
        running = torch.empty_like(s)
        for start in range(0, r.total, split):
            top = torch.full(s.shape[:1], -float("inf"), dtype=s.dtype)
            for tile in range(start, min(start + split, r.total), block):
                end = min(tile + block, start + split, r.total)
                top = torch.maximum(top, s[:, tile:end].amax(-1))
                running[:, tile:end] = top[:, None]
        row_max = s.amax(-1, keepdim=True)
        p = torch.exp(s - running).to(kv_dtype).double() * torch.exp(running - row_max)
        p = p / torch.exp(s - row_max).sum(-1, keepdim=True)
        rows.append(torch.einsum("hk,khd->hd", p, v.double().repeat_interleave(group, 1)))
    return torch.stack(rows)


def _rms_error(out, ref, golden) -> float:
    """The worst head's max error over its golden output's RMS."""
    return ((out - ref).abs().amax(-1) / golden.pow(2).mean(-1).sqrt()).max().item()


@pytest.mark.skipif(DEVICE.type != "cpu", reason="on CPU SGLang's Triton kernels run in Triton's interpreter")
@pytest.mark.parametrize("case_name", ["mha_fp8_e4m3_long_p1_fp16", "mla_h16_fp32_fp8_e5m2_p64_nonmono"])
def test_kf82_kf85_sglangs_triton_decode_takes_its_declared_numerics(case_name):
    """SGLang's decode over an fp8 cache, kernel against emulation. One query head per KV head (MHA) goes to a
    kernel of float32 sums that casts neither q nor p: its outputs are the exact reference's, and q cast to fp8,
    as the kit once declared it, sat at the limit's edge (KF-82). MLA's grouped decode casts q's latent columns
    and leaves its rope columns as handed (KF-85: the kit cast them); it casts p against each KV split's running
    maximum, tile by tile, with the splits SGLang's get_num_kv_splits picks (132 SMs here, an H100's or H200's):
    emulated so, the kernel's output is matched to 1e-6-1e-4 of its RMS (its float32 scores flip a cast near a
    tie); emulated against the row's maximum (what P_CAST's envelope costs) it is off by as much as the cast
    itself. Judged under the declared numerics, each layer passes."""
    from kit.engine.numerics import P_CAST, Q_CAST
    from kit.harness import interpreter

    interpreter.install()
    case = load_catalog().find_case(ForwardMode.DECODE, case_name)
    fx, outs, backend = _sglang_run(ForwardMode.DECODE, case_name)
    steps = SGLangTritonBackend.numerics.case_steps(case, "cpu")
    assert all(c.ok for c in _judged(fx, outs, case, SGLangTritonBackend)), [
        c.describe() for c in _judged(fx, outs, case, SGLangTritonBackend)]
    splits = backend.impl.forward_metadata.num_kv_splits.tolist()
    for layer_id, out in enumerate(outs):
        golden = attention(fx, layer_id=layer_id)
        q_cast = declared(fx, (Q_CAST,))[layer_id][0]
        if not case.is_mla:
            assert steps == () and _rms_error(out, golden, golden) < 0.1 * _rms_error(out, q_cast, golden)
            continue
        as_declared = _split_p_cast(fx, layer_id, splits, 32, steps)
        row_max = declared(fx, steps)[layer_id][1]
        assert P_CAST in steps and _rms_error(out, as_declared, golden) < 1e-3, _rms_error(out, as_declared, golden)
        assert _rms_error(out, row_max, golden) > 0.02 and _rms_error(out, _split_p_cast(fx, layer_id, splits, 32, (
            Q_CAST,)), golden) > 0.02


@pytest.mark.skipif(DEVICE.type != "cpu", reason="on CPU SGLang's Triton kernels run in Triton's interpreter")
def test_kf1_in_the_window_layer_of_a_capped_hybrid_fp8_case():
    """A capped case's hybrid model puts the window in layer 0 and the cap in layer 1 (kit/engine/layer.py,
    HYBRID_WINDOW): the DECODE of gqa_fp8_e5m2_cap_hybrid_p16_shuf fails in its uncapped window layer under
    the declared numerics (q and p cast to fp8), and the kit's reference with that layer's window W - 1
    (KF-1: SGLang's decode attends W keys) brings every layer within its limit."""
    from kit.harness import interpreter

    interpreter.install()
    mode, case_name = ForwardMode.DECODE, "gqa_fp8_e5m2_cap_hybrid_p16_shuf"
    case = load_catalog().find_case(mode, case_name)
    fx, outs = _sglang_outputs(mode, case_name)
    window, capped = fx.layers
    assert window.sliding_window_size > 0 and window.logit_cap == 0 and capped.logit_cap > 0
    checks = _judged(fx, outs, case, SGLangTritonBackend)
    assert not checks[0].ok and checks[1].ok, [c.describe() for c in checks]
    one_fewer = dataclasses.replace(fx, layers=(
        dataclasses.replace(window, sliding_window_size=window.sliding_window_size - 1), capped))
    checks = _judged(one_fewer, outs, case, SGLangTritonBackend)
    assert all(c.ok for c in checks), [c.describe() for c in checks]


class DecodeDropsKScale(_TritonMutant):
    """A read-side fp8 bug under KF-24: the decode reads the cached keys without their scale
    (k_descale 1.0 for the layer's k_scale_float, triton_backend.py:2369)."""

    patch = (2369, "k_descale = layer.k_scale_float", "k_descale = 1.0")


def test_kf24_a_read_side_fp8_bug_is_not_the_known_failure():
    """KF-24 pins its band (the outputs within their limits; the run fails on the inputs its write
    changes): the same DECODE with the keys' scale dropped fails [kernel] too, and is reported."""
    from kit.harness.environment import device_name

    entries = known_failures.load_or_default()
    case = load_catalog().find_case(ForwardMode.DECODE, "gqa_fp8_e4m3_p16_fp16")
    plain = run_case("sglang_triton", case, Exec.EAGER, torch.device("cpu"))
    entry = known_failures.match(entries, "sglang_triton", "decode", "eager", case.name, device_name(), case.dtype)
    assert entry is not None and entry.id == "KF-24" and known_failures.is_expected(entry, plain), plain.message
    planted = run_case(f"{__name__}:DecodeDropsKScale", case, Exec.EAGER, torch.device("cpu"))
    assert (planted.outcome, planted.failure_class) == ("fail", "kernel"), planted.message
    assert not known_failures.is_expected(entry, planted), planted.margins
    assert known_failures.against(entry, planted).startswith("not the known failure: KF-24")
