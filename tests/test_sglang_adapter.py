"""The SGLang adapter's own tests: what it maps (context, pools, batch, layers), which modes and
hooks it exposes, its reasons for what it does not run, and the real-code mutant loader.
Skipped, with the reason, only where the pinned sglang is not installed (CI installs it)."""
import importlib
import importlib.metadata
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from backends.sglang.adapter import (INSTALL, PINNED, SGLangBackend, SGLangFlashInferBackend, SGLangFlexAttentionBackend,
                                     SGLangTorchNativeBackend, SGLangTritonBackend, sglang_problem)
from kit.modes import ForwardMode
from kit.harness.capabilities import Capabilities
from kit.harness.protocol import BackendContext
from kit.report.results import REPO
from kit.harness.runner import default_device
from tests.helpers import make_fixture, small_case, uncached_versions

pytestmark = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))

DEVICE = default_device()
ADAPTERS = (SGLangTritonBackend, SGLangTorchNativeBackend, SGLangFlashInferBackend, SGLangFlexAttentionBackend)


def _built(case, cls=SGLangTritonBackend):
    fx = make_fixture(case, DEVICE)
    return fx, cls(BackendContext.for_case(case, fx.pools, DEVICE))


def test_supports_says_how_to_install_when_sglang_is_missing(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    uncached_versions(monkeypatch)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    for case in (small_case("c", ForwardMode.DECODE, (3,)), small_case("v", ForwardMode.TARGET_VERIFY, (3,), 2,
                                                                        dtype="bf16")):
        for cls in ADAPTERS:  # first, before any reason of the backend's own
            assert cls.supports(case) == f"sglang {PINNED} is not installed: {INSTALL}"


def test_supports_names_another_installed_version(monkeypatch):
    uncached_versions(monkeypatch)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.99")
    reason = SGLangTorchNativeBackend.supports(small_case("c", ForwardMode.DECODE, (3,)))
    assert "sglang 0.5.99 is installed" in reason and PINNED in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reasons")
def test_supports_reasons_on_cpu():
    decode = small_case("c", ForwardMode.DECODE, (3,))
    assert "CUDA" in SGLangFlashInferBackend.supports(decode)
    assert "interpreter" in SGLangTritonBackend.supports(decode.with_(dtype="bf16"))
    assert SGLangTorchNativeBackend.supports(decode.with_(dtype="bf16")) is None  # no Triton in it
    assert "no verify path" in SGLangTorchNativeBackend.supports(small_case("v", ForwardMode.TARGET_VERIFY, (3,), 2))
    assert "sinks" in SGLangFlexAttentionBackend.supports(decode.with_(sinks=True))
    assert Capabilities.of(SGLangFlexAttentionBackend).modes == {"decode", "extend"}  # no verify path


def test_flashinfer_adapter_names_a_flashinfer_that_cannot_load(monkeypatch):
    """On a GPU without a loadable FlashInfer, SGLang's FlashInfer backend is `unsupported` with the
    reason, as the in-box one is, rather than a crash in every run."""
    import backends.flashinfer as fi

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fi, "UNAVAILABLE", "flashinfer-python cannot be imported here (planted)")
    assert SGLangFlashInferBackend.supports(small_case("c", ForwardMode.DECODE, (3,))) == fi.UNAVAILABLE


def test_sglang_flashinfer_refuses_fp32_which_flashinfer_has_no_kernels_for(monkeypatch):
    """FlashInferAttnBackend plans in the model's dtype: with fp32, FlashInfer's JIT raises
    KeyError (seen on an H100); the adapter says `unsupported` with the reason, as ours does."""
    import backends.flashinfer as fi

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fi, "UNAVAILABLE", None)
    fp32 = small_case("c", ForwardMode.DECODE, (3,), dtype="fp32")
    assert "no fp32 kernels" in SGLangFlashInferBackend.supports(fp32)
    assert SGLangFlashInferBackend.supports(fp32.with_(dtype="bf16")) is None


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.name)
def test_graph_hooks_exactly_where_the_sglang_backend_has_them(cls):
    """The kit reads `no capture hooks` from the class: the adapter has the two-phase hooks iff
    the SGLang class overrides them (its base defines them as no-ops / NotImplementedError)."""
    from backends.sglang import runtime as sg

    module, _, attr = cls.sglang_class.partition(":")
    wrapped = getattr(__import__(module, fromlist=[attr]), attr)
    own = all(getattr(wrapped, h) is not getattr(sg.AttentionBackend, h)
              for h in ("init_cuda_graph_state", "init_forward_metadata_out_graph"))
    assert Capabilities.of(cls).has_graph_hooks == own


def test_context_maps_to_the_model_runner_and_pools():
    case = small_case("c", ForwardMode.DECODE, (5, 9), page=4, window=6, hybrid=True)
    fx, backend = _built(case)
    runner = backend.runner
    assert runner.page_size == 4 and runner.sliding_window_size == 6
    assert runner.model_config.num_attention_heads == 4 and runner.model_config.get_num_kv_heads(1) == 2
    assert runner.model_config.context_len == fx.pools.req_to_token_pool.max_context_len
    assert runner.req_to_token_pool is fx.pools.req_to_token_pool
    assert backend.impl.token_to_kv_pool.get_key_buffer(1) is fx.pools.token_to_kv_pool.k_buffer[1]
    assert backend.impl.device_core_count > 0  # the real KV-split planner runs


def test_set_kv_buffer_takes_sglangs_write_location():
    fx, backend = _built(small_case("c", ForwardMode.DECODE, (5,)))
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    pool = backend.runner.token_to_kv_pool
    layer = backend.layers[fx.layers[1]]
    k = torch.randn(2, 2, 16, device=DEVICE)
    # FlashInfer's backend passes the layer's (unquantized: None) scales too.
    pool.set_kv_buffer(layer, KVWriteLoc(torch.tensor([3, 7], device=DEVICE), physical=True), k, -k, None, None)
    assert torch.equal(fx.pools.token_to_kv_pool.k_buffer[1][[3, 7]], k)
    assert torch.equal(fx.pools.token_to_kv_pool.v_buffer[1][[3, 7]], -k)
    assert pool.get_kv_cache_quant_method().name == "unquantized"
    with pytest.raises(ValueError, match="quantized"):
        pool.set_kv_buffer(layer, torch.tensor([3], device=DEVICE), k[:1], k[:1], 0.5, 0.5)


def test_one_radix_attention_per_layer_config():
    fx, backend = _built(small_case("c", ForwardMode.DECODE, (5,), cap=3.0, hybrid=True))
    for layer in fx.layers:
        radix = backend.layers[layer]
        assert (radix.layer_id, radix.scaling, radix.logit_cap, radix.sliding_window_size) == (
            layer.layer_id, layer.scaling, layer.logit_cap, layer.sliding_window_size)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY,
                                  ForwardMode.DRAFT_EXTEND_V2], ids=lambda m: m.value)
def test_batch_maps_to_sglangs_forward_batch_over_the_kits_tensors(mode):
    from backends.sglang.runtime import EagleDraftExtendInput, EagleVerifyInput  # after sglang's set-up

    new = (2, 3) if mode is ForwardMode.EXTEND else (1 if mode is ForwardMode.DECODE else 3)
    case = small_case("c", mode, (5, 9), new, topk=2 if mode is ForwardMode.TARGET_VERIFY else 1)
    fx, backend = _built(case)
    b = fx.batch
    fb = backend._forward_batch(b)
    assert fb.forward_mode.name == mode.name and fb.batch_size == b.batch_size
    for field in ("req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc", "positions",
                  "extend_seq_lens", "extend_prefix_lens", "extend_start_loc"):
        assert getattr(fb, field) is getattr(b, field), field  # views over the kit's buffers, never copies
    assert fb.seq_lens_sum == b.seq_lens_sum and fb.kv_loc_plan is not None and fb.out_cache_loc_is_physical
    assert fb.global_num_token_non_padded_cpu == b.extend_num_tokens
    if mode is ForwardMode.TARGET_VERIFY:
        assert isinstance(fb.spec_info, EagleVerifyInput)
        assert fb.spec_info.custom_mask is b.spec_info.custom_mask
        assert (fb.spec_info.draft_token_num, fb.spec_info.topk, fb.spec_info.num_tokens_per_req) == (3, 2, 3)
    elif mode is ForwardMode.DRAFT_EXTEND_V2:
        assert isinstance(fb.spec_info, EagleDraftExtendInput)
        assert fb.spec_info.extend_seq_lens_tensor is b.spec_info.extend_seq_lens_tensor
        # The host counts as the kit's batch carries them: never read back from the device (a capture
        # forbids it); every draft accepted.
        assert fb.spec_info.extend_seq_lens_cpu is b.spec_info.extend_seq_lens_cpu
        assert fb.spec_info.num_accept_tokens is b.spec_info.extend_seq_lens_tensor
        assert fb.spec_info.num_tokens_per_req == 3 and fb.extend_prefix_lens_cpu == [5, 9]
    else:
        assert fb.spec_info is None


def test_server_args_carry_the_speculative_config():
    from sglang.srt.runtime_context import get_spec

    _built(small_case("v", ForwardMode.TARGET_VERIFY, (5,), 5, topk=2))
    assert (get_spec().speculative_num_draft_tokens, get_spec().speculative_eagle_topk) == (5, 2)


def test_extend_graph_metadata_is_sglangs_eager_one(monkeypatch):
    """SGLang's prefill graphs prepare attention with init_forward_metadata; its out_graph
    handles decode-shaped modes only."""
    fx, backend = _built(small_case("e", ForwardMode.EXTEND, (5,), (3,)))
    called = []
    monkeypatch.setattr(backend.impl, "init_forward_metadata", lambda fb: called.append(fb.forward_mode))
    backend.init_forward_metadata_out_graph(fx.batch)
    assert [m.name for m in called] == ["EXTEND"]


def test_a_prefill_graph_reaches_sglang_with_the_request_tensors_of_its_batch(monkeypatch):
    """The kit's token graphs hand full-capacity request tensors every second replay; SGLang's prefill
    graph runner hands the scheduler's, the batch's rows alone, and its Triton EXTEND metadata cumsums
    them whole into a bs + 1 kv_indptr (triton_backend.py:526). The adapter hands SGLang what its runner
    does: the metadata of a full-capacity view is the exact batch's; handed whole, it crashes."""
    import dataclasses

    from backends.sglang import adapter

    fx, backend = _built(small_case("e", ForwardMode.EXTEND, (5, 9), (2, 3)))
    b = fx.batch
    full = dataclasses.replace(b, **{name: torch.cat([getattr(b, name), getattr(b, name).flip(0)])
                                     for name in adapter.REQUEST_FIELDS if torch.is_tensor(getattr(b, name))})

    def metadata(batch):
        backend.init_forward_metadata_out_graph(batch)
        m = backend.impl.forward_metadata
        return m.kv_indptr.tolist(), m.qo_indptr.tolist(), m.kv_indices[:int(m.kv_indptr[-1])].tolist()

    assert metadata(full) == metadata(b)
    monkeypatch.setattr(adapter, "prefill_runner_view", lambda batch: batch)
    with pytest.raises(RuntimeError, match="must match the existing size"):
        backend.init_forward_metadata_out_graph(full)


def test_forward_runs_through_radix_attention_on_the_real_rows_of_a_padded_extend():
    """A token-padded EXTEND batch reaches the backend narrowed to its real tokens by SGLang's layer."""
    import dataclasses

    fx, backend = _built(small_case("e", ForwardMode.EXTEND, (5,), (3,)), SGLangTorchNativeBackend)
    b, x, layer = fx.batch, fx.inputs[1], fx.layers[1]
    pad = lambda t: torch.cat([t, t.new_zeros((2,) + tuple(t.shape[1:]))])  # noqa: E731
    padded = dataclasses.replace(b, out_cache_loc=pad(b.out_cache_loc), positions=pad(b.positions))
    seen = []
    real_forward = backend.impl.forward
    backend.impl.forward = lambda q, *a, **k: seen.append(q.shape[0]) or real_forward(q, *a, **k)
    backend.init_forward_metadata(b)
    out = backend.forward(pad(x.q), pad(x.k_new), pad(x.v_new), layer, padded)
    assert seen == [3] and out.shape[0] == 5 and torch.all(out[3:] == 0)


def test_mutant_loader_patches_a_copy_never_the_installed_module():
    import backends.sglang.runtime  # noqa: F401  (sglang's set-up, as the adapter makes it, before its module)
    from tests.mutants.sglang import TRITON, ReplayBsFromBuffer, patched_module

    original = importlib.import_module(TRITON)
    text = open(original.__file__).read()
    copy = patched_module(TRITON, *ReplayBsFromBuffer.patch)
    assert copy is not original and sys.modules[TRITON] is original
    assert open(original.__file__).read() == text
    src = inspect.getsource(copy.TritonAttnBackend._init_forward_metadata_out_graph)
    assert "bs = len(forward_batch.req_pool_indices)" in src
    assert "bs = len(forward_batch.req_pool_indices)" not in inspect.getsource(
        original.TritonAttnBackend._init_forward_metadata_out_graph)
    with pytest.raises(ValueError, match="another version of sglang"):
        patched_module(TRITON, 759, "not this line", "x = 1")


def test_the_readme_names_the_install_command():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert INSTALL in readme and "requirements-cpu.txt" in readme
    assert issubclass(SGLangTritonBackend, SGLangBackend)


def test_importing_sglang_leaves_the_compilers_caches_where_they_were(tmp_path):
    """sglang's import points FlashInfer's, Triton's and inductor's caches at its own folder for the
    whole process where they are unnamed. A run's first call into an adapter (its versions(), before
    anything is built) imports nothing of SGLang, and after the adapter's set-up (which imports it)
    each cache is where a process that never imported sglang finds it (the process's other
    backends, the warmup's builds and its archive)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR",
                                                            "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR",
                                                            "SGLANG_CACHE_DIR")}
    env["HOME"] = str(tmp_path)
    where = "import json; from kit import caches; print(json.dumps({k: str(v) for k, v in caches.where().items()}))"
    code = ("import sys; from backends.sglang import SGLangTritonBackend; v = SGLangTritonBackend.versions(); "
            "print('sglang' in sys.modules); print(v['sglang']); import backends.sglang.runtime; " + where)

    def run(source):
        proc = subprocess.run([sys.executable, "-c", source], cwd=REPO, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.splitlines()

    imported, version, moved = run(code)[-3:]
    assert imported == "False" and version == importlib.metadata.version("sglang")
    assert json.loads(moved) == json.loads(run(where)[-1])


def test_an_fp8_cache_is_written_by_sglangs_own_pool_code():
    """A dense fp8 case's pool is SGLang's MHATokenToKVPool code (its readers and its quantizing
    writer) over the kit's buffers: the layer's scales on its RadixAttention as a model loads them,
    and what the writer stores passes the kit's KV check, byte for byte."""
    from backends.sglang.adapter import MHA_POOL_CODE
    from backends.sglang.runtime import MHATokenToKVPool
    from kit.harness.checks import KVState, check_kv

    case = small_case("fp8", ForwardMode.EXTEND, (3, 5), (2, 4), dtype="fp16", page=4, kv_dtype="fp8_e4m3")
    fx, backend = _built(case)
    pool, kit_pool = backend.runner.token_to_kv_pool, fx.pools.token_to_kv_pool
    for name in MHA_POOL_CODE:
        assert inspect.getattr_static(type(pool), name) is inspect.getattr_static(MHATokenToKVPool, name), name
    layer, x = fx.layers[1], fx.inputs[1]
    attn = backend.layers[layer]
    assert (attn.k_scale_float, attn.v_scale_float) == (layer.k_scale, layer.v_scale)
    assert pool.get_key_buffer(1).dtype == torch.float8_e4m3fn
    assert pool.get_key_buffer(1).data_ptr() == kit_pool.k_buffer[1].data_ptr()
    loc = fx.batch.out_cache_loc
    pool.set_kv_buffer(attn, loc, x.k_new.clone(), x.v_new.clone(), attn.k_scale, attn.v_scale)
    assert check_kv(kit_pool, KVState(fx.old_slots(), fx.installed_kv(), loc, {1: (x.k_new, x.v_new)})).ok


class _Deterministic(SGLangTritonBackend):
    server_fields = {"enable_deterministic_inference": True}


def test_a_backends_own_server_fields_override_the_defaults():
    """SGLang's deterministic mode is one server field of a subclass (docs/sglang.md): the backend built
    reads it (fixed 256-key decode split tiles), where the plain one keeps its batch-sized planner."""
    case = small_case("det", ForwardMode.DECODE, (5, 30))
    _, deterministic = _built(case, _Deterministic)
    _, plain = _built(case)
    assert deterministic.impl.enable_deterministic and deterministic.impl.split_tile_size == 256
    assert not plain.impl.enable_deterministic


def test_flashinfers_draft_declines_window_models_with_the_line_that_asserts(monkeypatch):
    """FlashInferMultiStepDraftBackend hands each step's FlashInferAttnBackend one kv_indptr buffer,
    which asserts a single wrapper (flashinfer_backend.py:482): a window model, which plans two,
    cannot be built, so the adapter declines it with that line (on a GPU; the CPU's own reason
    comes first here, so FlashInfer's single-step answer is taken as a GPU's)."""
    from backends.sglang.adapter import SGLangFlashInferDraftBackend

    monkeypatch.setattr(SGLangFlashInferBackend, "supports", classmethod(lambda cls, case: None))
    chain = small_case("draft", ForwardMode.DRAFT_DECODE, (20, 33), new=3, dtype="fp16")
    assert SGLangFlashInferDraftBackend.supports(chain) is None
    for windowed in (chain.with_(window=8), chain.with_(hybrid=True)):
        assert "flashinfer_backend.py:482" in SGLangFlashInferDraftBackend.supports(windowed)
