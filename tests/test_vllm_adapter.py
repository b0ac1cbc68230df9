"""The vLLM adapter's own tests: what it maps (the config, the KV cache layout, the step description,
the layers' windows and scales), the environment it sets, its reasons for what it does not run
(vLLM's own declarations), and that it records which KV writer ran. Skipped, with the reason, only
where the pinned vllm is not installed (CI installs it)."""
import importlib.metadata
import os
import subprocess
import sys

import pytest
import torch

from backends.vllm import environment
from backends.vllm.adapter import (INSTALL, PINNED, PROFILE, VllmFlashAttnBackend, VllmFlashInferBackend,
                                   VllmFlexAttentionBackend, VllmTritonAttnBackend, model_of, vllm_problem)
from backends.vllm.mla import VllmFlashAttnMLABackend, VllmFlashMLABackend, VllmTritonMLABackend
from kit.engine.profile import NO_WRITE
from kit.harness.protocol import BackendContext
from kit.modes import ForwardMode
from kit.report.results import REPO
from kit.engine.case import DEEPSEEK_SCALE
from tests.helpers import run_setup, small_case, uncached_versions

pytestmark = pytest.mark.skipif(vllm_problem() is not None, reason=str(vllm_problem()))

ADAPTERS = (VllmTritonAttnBackend, VllmFlexAttentionBackend, VllmFlashAttnBackend, VllmFlashInferBackend,
            VllmTritonMLABackend, VllmFlashMLABackend, VllmFlashAttnMLABackend)
ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's reasons")
# A latent vLLM's MLA takes (DeepSeek's widths), few heads.
MLA_SHAPE = dict(heads=(4, 1), head_dim=576, kv_lora_rank=512, rope_dim=64, dtype="fp16", scale=DEEPSEEK_SCALE)


def _case(name, mode, prefix, new=1, **kw):
    """A small case vLLM's TRITON_ATTN takes (head sizes from 32, blocks of 16)."""
    return small_case(name, mode, prefix, new, **dict(dict(head_dim=64, page=16), **kw))


def _built(case, cls=VllmTritonAttnBackend):
    """The case's own eager batch, installed in a pool of vLLM's layout, and the backend built for it."""
    fx = run_setup(case, backend_cls=cls, device="cuda" if torch.cuda.is_available() else "cpu").case_fixture
    fx.install()
    return fx, cls(BackendContext.for_case(case, fx.pools, fx.pools.token_to_kv_pool.device))


def test_supports_says_how_to_install_when_vllm_is_missing(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    uncached_versions(monkeypatch)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    for cls in ADAPTERS:  # first, before any reason of the backend's own
        assert cls.supports(_case("c", ForwardMode.DECODE, (3,))) == f"vllm {PINNED} is not installed: {INSTALL}"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.34.0")
    assert "vllm 0.34.0 is installed" in VllmTritonAttnBackend.supports(_case("c", ForwardMode.DECODE, (3,)))


@ON_CPU
def test_supports_reasons_on_cpu():
    """vLLM's own refusals (validate_configuration), what its impls raise for, and the CPU's limits."""
    decode = _case("c", ForwardMode.DECODE, (3,))
    assert VllmTritonAttnBackend.supports(decode) is None
    for cls in (VllmFlashAttnBackend, VllmFlashInferBackend, VllmFlashMLABackend, VllmFlashAttnMLABackend):
        assert "no CUDA device here" in cls.supports(decode)
    assert "block_size not supported" in VllmTritonAttnBackend.supports(decode.with_(page=1))  # MultipleOf(16)
    assert "interpreter" in VllmTritonAttnBackend.supports(decode.with_(dtype="bf16"))
    assert "NotImplementedError" in VllmFlexAttentionBackend.supports(decode.with_(cap=5.0))
    assert "sinks not supported" in VllmFlexAttentionBackend.supports(decode.with_(sinks=True))
    assert "SM89" in VllmTritonAttnBackend.supports(decode.with_(kv_dtype="fp8_e4m3", dtype="fp16"))
    assert "no such mode" in VllmTritonAttnBackend.supports(_case("d", ForwardMode.DRAFT_EXTEND_V2, (3,), 2))
    assert "no tree attention" in VllmTritonAttnBackend.supports(
        _case("t", ForwardMode.TARGET_VERIFY, (3,), 4, topk=2))
    mla = _case("m", ForwardMode.DECODE, (3,), heads=(4, 1), head_dim=48, kv_lora_rank=32, rope_dim=16, dtype="fp16",
                scale=DEEPSEEK_SCALE)
    assert "[320, 512, 576]" in VllmTritonMLABackend.supports(mla)


def test_the_declared_kv_dtypes_are_vllms():
    """A backend's kv_dtypes are what vLLM's class lists (supported_kv_cache_dtypes), no more."""
    for cls in ADAPTERS:
        if cls.cuda_only and not torch.cuda.is_available():
            continue  # FLASH_ATTN_MLA's module imports only where FlashAttention is there
        assert set(cls.kv_dtypes) <= set(cls.backend_cls().supported_kv_cache_dtypes), cls.name


def test_graphs_follow_vllms_declared_cudagraph_support():
    """TRITON_ATTN declares ALWAYS: every mode's graphs; TRITON_MLA UNIFORM_BATCH: no graph of ragged
    (EXTEND) batches, the reason naming the declaration; and none past the largest capture size."""
    extend = _case("e", ForwardMode.EXTEND, (3, 5), (4, 2), dtype="fp16")
    assert VllmTritonAttnBackend.supports_graph(extend) is None
    mla = extend.with_(heads=(8, 1), head_dim=576, kv_lora_rank=512, rope_dim=64, scale=DEEPSEEK_SCALE)
    assert "AttentionCGSupport.UNIFORM_BATCH" in VllmTritonMLABackend.supports_graph(mla)
    assert VllmTritonMLABackend.supports_graph(mla.with_(mode=ForwardMode.DECODE, new=1)) is None
    assert "up to 512 tokens" in VllmTritonAttnBackend.supports_graph(extend.with_(new=(400, 300)))


def test_the_profile_is_vllms_runner():
    assert PROFILE.padded_slot == NO_WRITE and PROFILE.padded_seq_len == 0 and PROFILE.padded_query_len == 0
    assert PROFILE.pads_token_graph_requests and PROFILE.problem() is None
    assert PROFILE.batch_sizes[:5] == (1, 2, 4, 8, 16) and PROFILE.batch_sizes[-1] == 512


def test_the_pools_layout_is_vllms_kv_cache_view():
    """The KV cache the adapter binds to a layer is, stride for stride, the one vLLM's runner makes
    (create_kv_cache_views over one allocation, in the layout its backend resolves), and vLLM's own
    K/V split of it (the one its backends write through) reads what the kit stored."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views

    case = _case("c", ForwardMode.DECODE, (5, 20))
    fx, backend = _built(case)
    attn = backend.layers[fx.layers[1]]
    spec = backend.builders[0][0].kv_cache_spec
    pool = fx.pools.token_to_kv_pool
    page = spec.page_size_bytes
    raw = torch.zeros(page * pool.num_blocks, dtype=torch.int8)
    layout = get_supported_kv_cache_layouts([backend.backend_cls()])[0]
    (vllms,) = create_kv_cache_views(raw, spec, pool.num_blocks, layout, KVCacheTensor(
        size=raw.numel(), layers=[attn.layer_name], layer_stride=raw.numel(), block_stride=page))
    assert attn.kv_cache.shape == vllms.shape and attn.kv_cache.stride() == vllms.stride()
    slots = torch.tensor([17, 40])
    k, v = torch.randn(2, case.num_kv_heads, case.head_dim), torch.randn(2, case.num_kv_heads, case.head_dim)
    pool.write(1, slots, k, v)
    key_cache, value_cache = attn.kv_cache.transpose(1, 2).split(case.head_dim, dim=-1)  # flash_attn.py:1448
    assert torch.equal(key_cache[slots // 16, slots % 16], k) and torch.equal(value_cache[slots // 16, slots % 16], v)


def test_the_step_description_maps_field_for_field():
    """CommonAttentionMetadata is the kit's description itself: the same tensors (no copies), the
    token count the slot mapping's, the host bound on seq_lens the exact host copy."""
    case = _case("e", ForwardMode.EXTEND, (3, 17), (4, 2))
    fx, backend = _built(case)
    common = fx.batch.common
    m = backend.common_metadata(common)
    for mine, theirs in ((common.query_start_loc, m.query_start_loc), (common.seq_lens, m.seq_lens),
                         (common.block_table, m.block_table_tensor), (common.slot_mapping, m.slot_mapping),
                         (common.query_start_loc_cpu, m.query_start_loc_cpu), (common.seq_lens_cpu, m.seq_lens_cpu_upper_bound)):
        assert theirs is mine
    assert (m.num_reqs, m.num_actual_tokens, m.max_query_len, m.max_seq_len) == (2, 6, 4, 19)


def test_the_config_is_the_pools_and_the_layers_are_the_models():
    """The VllmConfig's block size, blocks, context and request limits are the pools'; a verify case
    configures speculative decoding of its drafts; each layer's window counts the query's own key
    (kit W: keys p-W..p, vLLM's W + 1) and its fp8 scales are the layer's."""
    case = _case("v", ForwardMode.TARGET_VERIFY, (3, 17), 4, window=5, hybrid=True)
    fx, backend = _built(case)
    config, pool = backend.vllm_config, fx.pools
    assert config.cache_config.block_size == 16 and config.cache_config.num_gpu_blocks == pool.token_to_kv_pool.num_blocks
    assert config.model_config.max_model_len == pool.req_to_token_pool.max_context_len
    assert config.scheduler_config.max_num_seqs == pool.req_to_token_pool.size
    assert config.speculative_config.num_speculative_tokens == 3
    windowed = next(layer for layer in fx.layers if layer.sliding_window_size >= 0)
    assert backend.layers[windowed].impl.sliding_window == (windowed.sliding_window_size, 0)  # triton_attn: (W' - 1, 0)
    assert len(backend.builders) == 2  # the window layer's KV spec is a SlidingWindowSpec: a group of its own
    assert model_of(case).num_speculative_tokens == 3


@pytest.mark.parametrize("cls, shape", [(VllmTritonAttnBackend, {}), (VllmTritonMLABackend, MLA_SHAPE)],
                         ids=["dense", "mla"])
def test_each_layer_reads_the_kit_layers_fp8_scales_once_built(cls, shape):
    """The scales vLLM's layer hands its kernels (its tensors and the floats its impls fold) are the kit
    layer's once the layer is built as a loaded model's, q's its k_scale (what the declared q_fp8 step
    takes): MLAAttention.process_weights_after_loading resets them to 1.0 where no quantization config
    loaded them (mla_attention.py:1357-1366)."""
    fx, backend = _built(_case("s", ForwardMode.DECODE, (3, 4), kv_dtype="fp8_e4m3", **shape), cls)
    for layer in fx.layers:
        attn = backend.layers[layer]
        read = (attn._k_scale.item(), attn._v_scale.item(), attn._q_scale.item(), attn._k_scale_float,
                attn._v_scale_float, attn._q_scale_float)
        assert read == (layer.k_scale, layer.v_scale, layer.k_scale) * 2, (layer.layer_id, read)


def test_the_kv_writer_that_ran_is_recorded():
    """TRITON_ATTN's own Triton writer everywhere; the others' compiled op, or where it does not
    load vLLM's equivalent, naming why."""
    assert VllmTritonAttnBackend.versions()["kv_write"].startswith("vllm triton_reshape_and_cache_flash (TritonAttention")
    flex = VllmFlexAttentionBackend.versions()
    assert flex["vllm"] == PINNED and "reshape_and_cache_flash" in flex["kv_write"]
    if not torch.cuda.is_available():
        assert flex["kv_write"].startswith("vllm triton_reshape_and_cache_flash (_C not loadable: ")
        assert "CPUMLAImpl.do_kv_cache_update" in VllmTritonMLABackend.versions()["kv_write"]


@ON_CPU
def test_the_capability_answer_is_scoped_and_leaves_cuda_devices_to_torch():
    real = torch.cuda.get_device_capability
    with environment.cuda_capability_answered():
        assert torch.cuda.get_device_capability(torch.device("cpu")) == environment.CPU_CAPABILITY
        with pytest.raises((AssertionError, RuntimeError)):
            torch.cuda.get_device_capability(torch.device("cuda", 0))
    assert torch.cuda.get_device_capability is real


@ON_CPU
def test_the_environment_is_set_only_for_vllms_own_import():
    """CUDA_VISIBLE_DEVICES is empty only while vllm.triton_utils imports (then Triton stays real);
    VLLM_TARGET_DEVICE=cpu is set where vllm is first imported, not when the backends load; a
    vllm.triton_utils imported before with the placeholder is named."""
    code = ("import os, sys\n"
            "import backends.vllm\n"
            "assert 'VLLM_TARGET_DEVICE' not in os.environ and 'CUDA_VISIBLE_DEVICES' not in os.environ\n"
            "from backends.vllm import environment\n"
            "assert environment.import_triton_utils().HAS_TRITON\n"
            "assert os.environ['VLLM_TARGET_DEVICE'] == 'cpu' and 'CUDA_VISIBLE_DEVICES' not in os.environ\n"
            "import vllm.platforms\n"
            "print(type(vllm.platforms.current_platform).__name__)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "VLLM_TARGET_DEVICE", "TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("CpuPlatform"), proc.stderr[-2000:]
    placeholder = ("import os\nos.environ.pop('CUDA_VISIBLE_DEVICES', None)\nimport vllm.triton_utils\n"
                   "from backends.vllm import environment\nenvironment.import_triton_utils()\n")
    proc = subprocess.run([sys.executable, "-c", placeholder], cwd=REPO, env=dict(env, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "placeholder" in proc.stderr, proc.stderr[-2000:]



def test_vllms_class_questions_are_asked_inside_the_served_config(monkeypatch):
    """validate_configuration and get_cudagraph_support are asked as vLLM asks them, with the
    engine's config current (FLASHINFER's read it there: outside, vLLM raises "Current vLLM config
    is not set"), and that config has its KV cache layout resolved for the backend."""
    from vllm.config import get_current_vllm_config

    cls = VllmTritonAttnBackend
    seen = []

    def validate(*args, **kwargs):
        seen.append(get_current_vllm_config().cache_config.kv_cache_layout)
        return []

    def cudagraph_support(config, spec):
        seen.append(get_current_vllm_config().cache_config.kv_cache_layout)
        return real_support(config, spec)

    builder = cls.backend_cls().get_builder_cls()
    real_support = builder.get_cudagraph_support
    monkeypatch.setattr(cls.backend_cls(), "validate_configuration", staticmethod(validate))
    monkeypatch.setattr(builder, "get_cudagraph_support", staticmethod(cudagraph_support))
    case = _case("c", ForwardMode.DECODE, (5, 20), dtype="fp16")
    assert cls._vllm_refuses(case) is None and cls.supports_graph(case) is None
    assert seen == ["LBNHC", "LBNHC"]


def test_a_kv_cache_layout_other_than_the_pools_is_refused(monkeypatch):
    """The pool is vLLM's LBNHC view; a backend whose kernels take another layout (FLASHINFER's
    TRT-LLM kernels on SM100: LBHNC) gets that layout from the engine, so the adapter refuses it
    rather than hand its kernels a cache in the wrong order."""
    from vllm.v1.attention.backend import KVCacheLayout

    head_major = type("HeadMajor", (VllmTritonAttnBackend.backend_cls(),),
                      {"supported_kv_cache_layouts": classmethod(lambda cls: (KVCacheLayout.LBHNC,))})
    monkeypatch.setattr(VllmTritonAttnBackend, "_vllm_backend", lambda self: head_major)
    with pytest.raises(ValueError, match="resolves the KV cache layout LBHNC"):
        _built(_case("c", ForwardMode.DECODE, (5, 20)))


def test_flex_may_recompile_per_model_and_keeps_static_shapes_without_cuda():
    """The kit's process runs many models through vLLM's compiled flex attention, each a recompile:
    past dynamo's default limit of 8 a fullgraph compile raises FailOnRecompileLimitHit. (The limit
    is set to that default first: SGLang's flex backend raises it process-wide when imported.)"""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=8):
        with environment.flex_compiles():
            assert torch._dynamo.config.recompile_limit == environment.RECOMPILES > 8
            assert torch._dynamo.config.automatic_dynamic_shapes is not environment.NO_CUDA
        assert torch._dynamo.config.recompile_limit == 8


def test_an_mla_model_dtype_no_prefill_backend_takes_is_unsupported_in_the_prefill_modes(monkeypatch):
    """vLLM's prefill selector refuses some dtypes whatever the head sizes (fp32 on Hopper: FLASH_ATTN
    takes fp16/bf16 only): MIXED and EXTEND read unsupported with the selector's reason, as vLLM
    would refuse to serve the model, rather than the selector's ValueError escaping supports();
    DECODE, which never reaches the prefill path, still runs."""
    from backends.vllm import runtime as rt

    def selector(config):
        raise ValueError(f"No valid MLA prefill backend found with {config}. Reasons: dtype not supported")

    monkeypatch.setattr(rt.current_platform, "get_mla_prefill_backend_cls", selector)
    for mode, new in ((ForwardMode.MIXED, (4, 1)), (ForwardMode.EXTEND, (2, 2))):
        reason = VllmTritonMLABackend._refused(_case("m", mode, (3, 4), new, **MLA_SHAPE))
        assert reason.startswith("MLA prefill rows in torch.float16: no MLA prefill backend") and "dtype not supported" in reason
    assert VllmTritonMLABackend._refused(_case("m", ForwardMode.DECODE, (3,), **MLA_SHAPE)) is None


def test_a_step_may_hand_more_tokens_than_one_requests_context():
    """A MIXED step of several requests hands more tokens than one request's context; vLLM sizes
    persistent buffers by max_num_batched_tokens (FLEX_ATTENTION's refuse a longer step), so the
    config takes the pool's slots, which bound every step's new tokens."""
    case = _case("m", ForwardMode.MIXED, (600, 590, 580), (400, 300, 1), dtype="fp16")
    fx, backend = _built(case)
    pool = fx.pools.token_to_kv_pool
    tokens = backend.vllm_config.scheduler_config.max_num_batched_tokens
    assert tokens >= pool.num_blocks * pool.page_size
