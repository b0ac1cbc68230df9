"""The SGLang recurrent adapters' rendering, on CPU (their prefill kernels run on CUDA GPUs only, see
their supports()): SGLang's own metadata code, run over the ForwardBatch the adapter builds, must
reach the kit's state slots and token starts (and, for Mamba2, which requests start from a saved
state), and the scheduler's clear must zero a new request's slot in every layer and nothing else. A
planted rendering bug (request rows one off) and a planted bug in SGLang's Mamba2 metadata are
caught. Skipped, with the reason, only where the pinned sglang is not installed (CI installs it)."""
import re
from pathlib import Path

import pytest
import torch

from backends.sglang.adapter import sglang_problem
from cases.linear import FULL, SMOKE
from kit.engine.depth import NUM_LAYERS
from kit.engine.recurrent_step import build
from kit.engine.state_pool import StatePool
from kit.harness.recurrent import RecurrentContext
from kit.harness.runner import default_device
from kit.modes import ForwardMode

pytestmark = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))
DEVICE = default_device()


def _case(name):
    return next(c for c in SMOKE if c.name == name)


def rendering_problems(backend_cls, case):
    """What SGLang's metadata, built over the adapter's ForwardBatch, gets wrong of the kit's batch."""
    fx = build(case, "cpu")
    pool = StatePool(fx.geometry, fx.torch_dtype, "cpu")
    pool.reset()
    fx.install(pool)
    before = {name: b.clone() for name, b in pool.buffers.items()}
    backend = backend_cls(RecurrentContext(torch.device("cpu"), fx.torch_dtype, pool, fx.layers, case.bs))
    batch, _ = fx.batch("cpu")
    backend.init_forward_metadata(batch)
    meta = backend.impl.linear_attn_backend.forward_metadata
    problems = []
    if not torch.equal(meta.mamba_cache_indices.cpu(), batch.state_indices):
        problems.append(f"state slots {meta.mamba_cache_indices.tolist()} != {batch.state_indices.tolist()}")
    if not torch.equal(meta.query_start_loc.cpu(), batch.query_start_loc):
        problems.append(f"token starts {meta.query_start_loc.tolist()} != {batch.query_start_loc.tolist()}")
    mixed = getattr(meta, "mixed_metadata", None)  # Mamba2's prefill metadata
    if mixed is not None:
        # MambaMixer2 loads saved states only where prep_initial_states holds, then where has_initial_states
        saved = mixed.has_initial_states.cpu() & bool(mixed.prep_initial_states)
        if not torch.equal(saved, batch.has_initial_state):
            problems.append(f"saved states read {saved.tolist()} != {batch.has_initial_state.tolist()}")
    new = {slot for slot, start in zip(fx.slots, fx.starts[0]) if not start.saved}
    for name in ("conv", "temporal"):
        for layer_id in range(NUM_LAYERS):
            for slot in range(pool.size):
                now, was = pool.layer(name, layer_id)[slot], before[name][layer_id, slot]
                if slot in new and bool(now.any()):
                    problems.append(f"{name} layer {layer_id} slot {slot} (a new request's) not cleared")
                if slot not in new and not torch.equal(now, was):
                    problems.append(f"{name} layer {layer_id} slot {slot} changed")
    return problems


def _backend(kind):
    from backends.sglang import SGLangGDNBackend, SGLangKDABackend, SGLangMamba2Backend

    return {"gdn": SGLangGDNBackend, "mamba2": SGLangMamba2Backend, "kda": SGLangKDABackend}[kind]


@pytest.mark.parametrize("name", ["gdn_mixed_fp32", "gdn_extend_chunks_fp32", "mamba2_mixed_fp32",
                                  "mamba2_extend_chunks_bf16", "kda_mixed_fp32"])
def test_sglangs_metadata_reaches_the_kits_slots(name):
    case = _case(name)
    assert rendering_problems(_backend(case.kind), case) == []


def test_a_mamba2_prefill_that_loads_saved_states_by_its_first_request_alone_is_caught():
    """tests/mutants/sglang_linear.py's mutant 120 (SGLang's own prepare_mixed, patched in a copy): behind a
    new request, a request with a saved state starts from zeros."""
    from tests.mutants.sglang_linear import Mamba2InitialStatesOfTheFirstRequest

    case = _case("mamba2_extend_chunks_bf16")
    assert case.prefix[0] == 0 and case.prefix[1] > 0
    problems = rendering_problems(Mamba2InitialStatesOfTheFirstRequest, case)
    assert any(p.startswith("saved states read") for p in problems), problems


def test_a_request_row_rendered_one_off_is_caught():
    from backends.sglang.linear import SGLangGDNBackend

    class RowsOneOff(SGLangGDNBackend):
        def _forward_batch(self, batch):
            fb = super()._forward_batch(batch)
            fb.req_pool_indices = fb.req_pool_indices.roll(1)
            return fb

    problems = rendering_problems(RowsOneOff, _case("gdn_mixed_fp32"))
    assert any(p.startswith("state slots") for p in problems), problems


def test_the_reasons_name_sglangs_rules():
    from backends.sglang.linear import SGLangGDNBackend

    assert SGLangGDNBackend.supports(_case("gdn_verify_bf16")) is None
    assert "mamba_needs_clear" in SGLangGDNBackend.supports(_case("gdn_decode_fp32"))
    assert SGLangGDNBackend.supports(_case("gdn_decode_bf16_long")) is None
    assert "chunk_gated_delta_rule" in SGLangGDNBackend.supports(_case("gdn_mixed_fp32"))
    if torch.cuda.is_available():
        assert SGLangGDNBackend.supports(_case("gdn_extend_fp16")) is None
    else:
        assert "fla/l2norm.py:65" in SGLangGDNBackend.supports(_case("gdn_extend_fp16"))
    assert _case("gdn_verify_bf16").mode == ForwardMode.TARGET_VERIFY


# kind: (its prefill case, its prefill's CPU reason), each naming SGLang's line
REASONS = {"mamba2": ("mamba2_mixed_fp32", "ssd_state_passing.py:235"),
           "kda": ("kda_extend_chunks_bf16", "fla/l2norm.py:65")}


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_the_reasons_name_sglangs_lines(kind):
    backend, (prefill, cpu) = _backend(kind), REASONS[kind]
    assert "mamba_needs_clear" in backend.supports(_case(f"{kind}_verify_fp32"))  # a new request's verify
    assert backend.supports(_case(f"{kind}_verify_saved_bf16")) is None
    assert "mamba_needs_clear" in backend.supports(_case(f"{kind}_decode_fp32"))
    assert backend.supports(_case(f"{kind}_decode_bf16_long")) is None
    reason = backend.supports(_case(prefill))
    assert reason is None if torch.cuda.is_available() else cpu in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="what CPU lacks: on CUDA the autotuner benchmarks")
def test_sglangs_mamba2_prefill_autotunes_a_kernel_by_benchmark_the_interpreter_cannot_run():
    """Why sglang_mamba2 runs no EXTEND or MIXED on CPU: its chunked scan's _state_passing_fwd launches a
    kernel autotuned over several configs, whose benchmark asks Triton for a GPU driver."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.harness import interpreter
    from sglang.kernels.ops.mamba.triton_ops import mamba_chunk_scan_combined

    interpreter.install()
    heads, dim, n, tokens = 2, 4, 8, torch.zeros(1, 4, 2, 4)
    with pytest.raises(RuntimeError, match="0 active drivers"):
        mamba_chunk_scan_combined(tokens, torch.zeros(1, 4, heads), -torch.ones(heads), torch.zeros(1, 4, 1, n),
                                  torch.zeros(1, 4, 1, n), chunk_size=16, out=torch.zeros_like(tokens))


def test_the_cpus_device_context_switches_nothing():
    """What SGLang's kernel wrappers enter before a launch, on the CPU (backends/sglang/shims.py)."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up

    x = torch.ones(3)
    with torch.get_device_module(x.device).device(x.device.index):
        assert torch.equal(x + 1, torch.full((3,), 2.0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="what CPU lacks: on CUDA the kernel compiles")
def test_sglangs_gdn_and_kda_prefills_load_through_block_pointers_the_interpreter_lacks():
    """Why sglang_gdn and sglang_kda run no EXTEND or MIXED on CPU: their chunk_gated_delta_rule and
    chunk_kda first L2-normalize q and k with SGLang's l2norm_fwd, whose kernel loads through
    tl.make_block_ptr, which Triton's interpreter refuses."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.harness import interpreter
    from sglang.kernels.ops.attention.fla.l2norm import l2norm_fwd

    interpreter.install()
    with pytest.raises(Exception, match="Block pointers have been removed"):
        l2norm_fwd(torch.ones(1, 4, 2, 16, dtype=torch.bfloat16))


def test_sglangs_conv_update_leaves_a_padded_rows_output_unwritten():
    """Why sglang_mamba2's graph DECODE and every SGLang recurrent graph TARGET_VERIFY fail `kernel` with
    padded rows NaN (KF-74, KF-91): SGLang's
    causal_conv1d_update allocates its output with torch.empty_like and returns early for a row whose
    state slot is the pad slot (-1, as its graph replay sets padded rows), so the padded row's conv
    output is whatever memory held (NaN under the kit's fill), and MambaMixer2's decode computes the
    padded row's SSD output from it. A real row is written."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.harness import interpreter
    from kit.harness.nan_fill import nan_filled_allocations
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    interpreter.install()
    dim, width = 8, 4
    states = torch.zeros(3, dim, width - 1)
    with nan_filled_allocations():
        out = causal_conv1d_update(torch.zeros(2, dim), states, torch.ones(dim, width), None, "silu",
                                   conv_state_indices=torch.tensor([1, -1], dtype=torch.int32))
    assert torch.isfinite(out[0]).all()
    assert torch.isnan(out[1]).all()



def test_sglangs_conv_update_rounds_each_tap_product_as_declared():
    """Why SGLang's recurrent backends declare conv_products: its causal_conv1d_update (the decode
    and verify conv, Triton on every platform) multiplies two bf16 loads, which Triton rounds to
    bf16 before the float32 sum. The kit's emulation of the declared casts gives the kernel's
    output bit for bit; the exact conv, rounded once, does not."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.engine.numerics import CONV_CAST, CONV_PRODUCTS
    from kit.engine.recurrent_reference import causal_conv
    from kit.harness import interpreter
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    interpreter.install()
    gen = torch.Generator().manual_seed(7)
    bs, dim, width = 4, 256, 4
    x = torch.randn(bs, dim, generator=gen).to(torch.bfloat16)
    weights = torch.randn(dim, width, generator=gen).to(torch.bfloat16)
    states = torch.randn(bs, dim, width - 1, generator=gen).to(torch.bfloat16)
    windows = states.clone()
    out = causal_conv1d_update(x, states, weights, None, "silu",
                               conv_state_indices=torch.arange(bs, dtype=torch.int32))
    emulated = torch.stack([causal_conv(windows[i], x[i:i + 1], weights, casts=(CONV_PRODUCTS, CONV_CAST))[0]
                            for i in range(bs)])
    exact = torch.stack([causal_conv(windows[i], x[i:i + 1], weights, casts=(CONV_CAST,))[0] for i in range(bs)])
    assert torch.equal(out.double(), emulated)
    assert float((out.double() != exact).double().mean()) > 0.1

# The SGLang files each kind's backend runs (its own, and HybridLinearAttnBackend's and the mamba
# layers' shared ones), under sglang/srt/layers/attention/.
SHARED_READERS = ("hybrid_linear_attn_backend.py", "linear/utils.py", "mamba/*.py")
KIND_READERS = {"gdn": ("linear/gdn_backend.py",), "kda": ("linear/kda_backend.py",), "mamba2": ()}
RUNNER_READ = re.compile(r"(?:self\._model_runner|(?<![\w.])model_runner)((?:\.\w+)+)")
# kind: the chunk its prefill takes from the model config (Mamba2-2.7B's and Nemotron-H's 256; Qwen3-Next
# and Kimi Linear set none: HybridLinearAttnBackend's default, 64)
CHUNK = {"gdn": 64, "kda": 64, "mamba2": 256}


def runner_reads(kind):
    """Every attribute path SGLang's code of the kind reads of its model runner (model_runner.a.b)."""
    import sglang

    root = Path(sglang.__file__).parent / "srt" / "layers" / "attention"
    paths = [p for pattern in SHARED_READERS + KIND_READERS[kind] for p in sorted(root.glob(pattern))]
    assert paths and all(p.exists() for p in paths)
    return {m.lstrip(".") for p in paths for m in RUNNER_READ.findall(p.read_text())}


def missing_reads(runner, reads):
    """The paths of `reads` the runner does not hold (a path ending at None is held: SGLang checks it)."""
    missing = []
    for path in sorted(reads):
        obj = runner
        for depth, name in enumerate(path.split(".")):
            if obj is None:
                break
            if not hasattr(obj, name):
                missing.append(".".join(path.split(".")[:depth + 1]))
                break
            obj = getattr(obj, name)
    return missing


def _built(kind):
    case = next(c for c in SMOKE if c.kind == kind and c.mode == ForwardMode.EXTEND)
    fx = build(case, "cpu")
    pool = StatePool(fx.geometry, fx.torch_dtype, "cpu")
    return _backend(kind)(RecurrentContext(torch.device("cpu"), fx.torch_dtype, pool, fx.layers, case.bs))


@pytest.mark.parametrize("kind", sorted(KIND_READERS))
def test_the_model_runner_holds_all_sglang_reads_of_it(kind):
    reads = runner_reads(kind)
    assert {"device", "server_args", "model_config.hf_text_config"} <= reads  # the scan sees SGLang's reads
    linear = _built(kind).impl.linear_attn_backend
    assert missing_reads(linear._model_runner, reads) == []
    assert linear.mamba_chunk_size == CHUNK[kind]  # the prefill's read, walked


def test_sglang_takes_the_gdn_model_runner_s_config_for_a_gdn_hybrid():
    """What flashinfer_gdn_prefill_default reads on Hopper and Blackwell (hybrid_gdn_config): the config
    is SGLang's Qwen3-Next class, with the kit layer's heads."""
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config

    backend = _built("gdn")
    config = hybrid_gdn_config(backend.impl.linear_attn_backend._model_runner.model_config)
    layer = next(iter(backend.layers.values()))  # its RadixLinearAttention, of the kit layer
    assert config is not None and config.linear_key_head_dim == layer.head_k_dim
    assert config.linear_num_value_heads == layer.num_v_heads


def test_a_model_runner_without_the_model_config_is_caught():
    """The stand-in as it was when SGLang's GDN prefill raised AttributeError on a GPU."""
    runner = _built("gdn").impl.linear_attn_backend._model_runner
    del runner.model_config
    assert missing_reads(runner, runner_reads("gdn")) == ["model_config", "model_config"]


def test_sglangs_gdn_prefill_on_hopper_is_the_one_its_server_picks(monkeypatch):
    """flashinfer_gdn_prefill_default under the adapter's server args, as on an H100 or H200 where
    FlashInfer's GDN prefill loads, for Qwen3-Next's 128-wide heads: FlashInfer's kernel, as SGLang's
    server picks it at the chunked prefill it sets for such a GPU; with chunked prefill off (-1) SGLang
    would run its Triton kernel, which it does not run there."""
    import importlib

    case = next(c for c in FULL if c.name == "gdn_decode_saved")
    fx = build(case, "cpu")
    backend = _backend("gdn")(RecurrentContext(torch.device("cpu"), fx.torch_dtype,
                                               StatePool(fx.geometry, fx.torch_dtype, "cpu"), fx.layers, case.bs))
    gdn = importlib.import_module("sglang.srt.layers.attention.linear.gdn_backend")
    kernels = importlib.import_module("sglang.srt.layers.attention.linear.kernels.gdn_flashinfer")
    monkeypatch.setattr(gdn, "is_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(kernels, "is_flashinfer_gdn_prefill_available", lambda: True)
    assert gdn.flashinfer_gdn_prefill_default(backend.impl.linear_attn_backend._model_runner) == "flashinfer"


@pytest.mark.parametrize("kind, name", [("gdn", "gdn_verify_bf16"), ("kda", "kda_verify_saved_bf16"),
                                        ("mamba2", "mamba2_verify_saved_bf16")])
def test_sglangs_verify_and_the_decode_after_it_pass(kind, name):
    """SGLang writes request i's drafts to intermediate row i and the step after continues from the
    kept draft (on CPU in Triton's interpreter, the copy the kit's; on CUDA SGLang's own)."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.harness import interpreter
    from kit.harness.recurrent import run_case

    interpreter.install()

    verdicts = run_case(_backend(kind), _case(name), device=default_device())
    assert [v.ok for v in verdicts] == [True, True], [v.text for v in verdicts]
