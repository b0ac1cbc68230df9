"""The SGLang recurrent adapters' rendering, on CPU (their prefill kernels run on CUDA GPUs only, see
their supports()): SGLang's own metadata code, run over the ForwardBatch the adapter builds, must
reach the kit's state slots and token starts (and, for Mamba2, which requests start from a saved
state), and the scheduler's clear must zero a new request's slot in every layer and nothing else. A
planted rendering bug (request rows one off) and a planted bug in SGLang's Mamba2 metadata are
caught. Skipped, with the reason, only where the pinned sglang is not installed (CI installs it)."""
import pytest
import torch

from backends.sglang.adapter import sglang_problem
from cases.linear import SMOKE
from kit.engine.pools import NUM_LAYERS
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

    verify = SGLangGDNBackend.supports(_case("gdn_verify_bf16"))
    assert "build_verify_intermediate_state_indices" in verify
    assert "mamba_needs_clear" in SGLangGDNBackend.supports(_case("gdn_decode_fp32"))
    assert SGLangGDNBackend.supports(_case("gdn_decode_bf16_long")) is None
    assert "chunk_gated_delta_rule" in SGLangGDNBackend.supports(_case("gdn_mixed_fp32"))
    if torch.cuda.is_available():
        assert SGLangGDNBackend.supports(_case("gdn_extend_fp16")) is None
    else:
        assert "torch.cpu.device" in SGLangGDNBackend.supports(_case("gdn_extend_fp16"))
    assert _case("gdn_verify_bf16").mode == ForwardMode.TARGET_VERIFY


def test_the_mamba2_reasons_name_sglangs_lines():
    from backends.sglang.mamba2 import SGLangMamba2Backend

    assert "mamba.py:664" in SGLangMamba2Backend.supports(_case("mamba2_verify_fp32"))
    mixed = SGLangMamba2Backend.supports(_case("mamba2_mixed_fp32"))
    decode = SGLangMamba2Backend.supports(_case("mamba2_decode_fp32").with_(prefix=(4, 3, 50)))
    if torch.cuda.is_available():
        assert mixed is None and decode is None
    else:
        assert "ssd_chunk_state.py:653" in mixed and "mamba_ssm.py:500" in decode


@pytest.mark.skipif(torch.cuda.is_available(), reason="what CPU lacks: CUDA has its device context")
def test_sglangs_mamba2_kernels_enter_a_device_context_cpu_torch_lacks():
    """Why sglang_mamba2 runs no mode on CPU: SGLang's selective_state_update (its decode) and
    mamba_chunk_scan_combined (its prefill) enter torch.get_device_module(device).device(index)
    before launching, and torch.cpu has no `device`."""
    from backends.sglang import runtime
    from sglang.kernels.ops.mamba import triton_ops

    runtime.install_server_args("triton", torch.device("cpu"), 1, None)
    triton_ops.initialize_mamba_selective_state_update_backend(runtime.get_context().server_args)
    selective_state_update, mamba_chunk_scan_combined = (triton_ops.selective_state_update,
                                                         triton_ops.mamba_chunk_scan_combined)

    heads, dim, n = 2, 4, 8
    state = torch.zeros(1, heads, dim, n)
    x = torch.zeros(1, heads, dim)
    with pytest.raises(AttributeError, match="torch.cpu.*device"):
        selective_state_update(state, x, x, -torch.ones(heads, dim, n), torch.zeros(1, 1, n), torch.zeros(1, 1, n),
                               state_batch_indices=torch.zeros(1, dtype=torch.int32), out=torch.zeros_like(x))
    tokens = torch.zeros(1, 4, heads, dim)
    with pytest.raises(AttributeError, match="torch.cpu.*device"):
        mamba_chunk_scan_combined(tokens, torch.zeros(1, 4, heads), -torch.ones(heads), torch.zeros(1, 4, 1, n),
                                  torch.zeros(1, 4, 1, n), chunk_size=16, out=torch.zeros_like(tokens))


def test_sglangs_bf16_conv_rounds_each_tap_product_to_bf16():
    """Why gdn_decode_bf16_long fails `kernel`: on the case's own batch, SGLang's causal_conv1d_update
    equals, bit for bit, a conv whose tap products x * w are rounded to bf16 before the float32 sum
    (its kernel multiplies two bf16 loads, which Triton computes in bf16), not the exact conv."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    from kit.harness import interpreter

    interpreter.install()  # on CPU: the interpreter computing bf16 as the GPU does
    case = _case("gdn_decode_bf16_long")
    fx = build(case, DEVICE)
    pool = StatePool(fx.geometry, fx.torch_dtype, DEVICE)
    pool.reset()
    fx.install(pool)
    batch, inputs = fx.batch(DEVICE)
    layer, rows = fx.layers[0], inputs[0].rows
    window = torch.cat([pool.conv(0)[batch.state_indices.long()], rows[:, :, None]], dim=2)
    conv = causal_conv1d_update(rows.clone(), pool.conv(0).clone(), layer.conv_weights, None, "silu",
                                conv_state_indices=batch.state_indices)

    def silu(acc):
        return acc / (1 + torch.exp(-acc))

    acc = torch.zeros(rows.shape, dtype=torch.float32, device=DEVICE)
    for tap in range(case.conv_width):
        acc = acc + (window[:, :, tap] * layer.conv_weights[:, tap]).float()
    exact = silu((window.double() * layer.conv_weights.double()).sum(-1))
    assert torch.equal(conv, silu(acc).to(conv.dtype))
    assert not torch.equal(conv, exact.to(conv.dtype))


def test_the_kda_reasons_name_sglangs_lines():
    from backends.sglang import SGLangKDABackend

    assert "build_verify_intermediate_state_indices" in SGLangKDABackend.supports(_case("kda_verify_fp32"))
    assert "mamba_needs_clear" in SGLangKDABackend.supports(_case("kda_decode_fp32"))
    assert SGLangKDABackend.supports(_case("kda_decode_bf16_long")) is None
    extend = SGLangKDABackend.supports(_case("kda_extend_chunks_bf16"))
    assert extend is None if torch.cuda.is_available() else "fla/l2norm.py:65" in extend


@pytest.mark.skipif(torch.cuda.is_available(), reason="what CPU lacks: on CUDA the kernel compiles")
def test_sglangs_kda_prefill_loads_through_block_pointers_the_interpreter_lacks():
    """Why sglang_kda runs no EXTEND or MIXED on CPU: its chunk_kda first L2-normalizes q and k with
    SGLang's l2norm_fwd, whose kernel loads through tl.make_block_ptr, which Triton's interpreter
    refuses."""
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.harness import interpreter
    from sglang.kernels.ops.attention.fla.l2norm import l2norm_fwd

    interpreter.install()
    with pytest.raises(Exception, match="Block pointers have been removed"):
        l2norm_fwd(torch.ones(1, 4, 2, 16, dtype=torch.bfloat16))
