"""The SGLang adapter's MLA side, on CPU: the model config it derives, SGLang's own MLATokenToKVPool
code over the kit's latent buffers (the bytes it writes), the DeepSeek model's absorbed call per
backend, and the reasons it gives. Skipped, with the reason, only where the pinned sglang is not
installed (CI installs it)."""
import inspect

import pytest
import torch

from backends.sglang import mla
from backends.sglang.adapter import SGLangFlashInferMLABackend, SGLangTritonBackend, sglang_problem
from kit.engine.case import Case
from kit.harness.protocol import BackendContext
from kit.harness.capabilities import Capabilities
from kit.harness.runner import default_device
from kit.harness.scope import unsupported_reason
from kit.modes import Exec, ForwardMode
from tests.helpers import make_fixture

pytestmark = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))

DEVICE = default_device()
RANK, ROPE = 48, 16  # a latent width SGLang's Triton decode kernel tiles (mla.triton_decode_width_problem)


def mla_case(mode=ForwardMode.DECODE, prefix=(5, 9), new=1, rank=RANK, rope=ROPE, **kw):
    kw = {"dtype": "fp32", **kw}
    return Case(name="mla", mode=mode, prefix=prefix, new=new, heads=(4, 1), head_dim=rank + rope, kv_lora_rank=rank,
                rope_dim=rope, scale=0.15, **kw)


def _built(case, cls=SGLangTritonBackend):
    fx = make_fixture(case, DEVICE)
    return fx, cls(BackendContext.for_case(case, fx.pools, DEVICE))


def test_the_pool_runs_sglangs_own_mla_pool_code():
    """Every method and flag the backends reach is MLATokenToKVPool's own object, not a copy."""
    from backends.sglang.runtime import MLATokenToKVPool  # after sglang's set-up (its shims)

    _, backend = _built(mla_case())
    pool = type(backend.runner.token_to_kv_pool)
    for name in mla.POOL_CODE:
        assert inspect.getattr_static(pool, name) is inspect.getattr_static(MLATokenToKVPool, name), name


def test_sglangs_latent_writes_land_exactly_in_the_kits_buffer():
    """Both of SGLang's MLA writers, over the kit's latent: the whole row (TritonAttnBackend's
    set_kv_buffer) and its two parts (FlashInferMLAAttnBackend's set_mla_kv_buffer) land in the
    case's layer at the given slots, byte for byte, and nothing else changes."""
    fx, backend = _built(mla_case())
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    kit_pool, pool = fx.pools.token_to_kv_pool, backend.runner.token_to_kv_pool
    layer = backend.layers[fx.layers[1]]
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    rows = torch.randn(2, 1, RANK + ROPE, generator=gen, device=DEVICE)
    for write, loc in ((lambda loc: pool.set_kv_buffer(layer, loc, rows, rows[..., :RANK]), [3, 7]),
                       (lambda loc: pool.set_mla_kv_buffer(layer, loc, rows[..., :RANK], rows[..., RANK:]), [5, 2])):
        expected = kit_pool.layers.clone()
        expected[1, loc] = rows
        write(KVWriteLoc(torch.tensor(loc, device=DEVICE), physical=True))
        assert torch.equal(kit_pool.layers, expected)


def test_the_pools_readers_are_views_of_the_kits_latent():
    fx, backend = _built(mla_case())
    latent, pool = fx.pools.token_to_kv_pool.k_buffer[1], backend.runner.token_to_kv_pool
    assert pool.get_key_buffer(1) is latent
    value = pool.get_value_buffer(1)
    assert value.shape[-1] == RANK and value.data_ptr() == latent.data_ptr() and value.stride() == latent.stride()
    assert backend.impl.v_head_dim == RANK  # TritonAttnBackend reads its V width off that view


def test_the_model_config_is_sglangs_for_an_mla_model():
    from backends.sglang.runtime import AttentionArch

    fx, backend = _built(mla_case())
    config, layer = backend.runner.model_config, fx.layers[1]
    assert config.attention_arch is AttentionArch.MLA and backend.impl.use_mla
    assert (config.kv_lora_rank, config.qk_rope_head_dim) == (RANK, ROPE)
    assert config.scaling == layer.scaling  # FlashInferMLAAttnBackend plans with it
    assert config.get_num_kv_heads(1) == config.num_attention_heads == 4  # DeepSeek's config.json
    radix = backend.layers[layer]
    assert (radix.qk_head_dim, radix.v_head_dim, radix.tp_k_head_num) == (RANK + ROPE, RANK, 1)


def test_the_absorbed_call_is_the_deepseek_models_per_backend():
    """Backends in SGLang's FORWARD_ABSORB_CORE list get latent and rope parts apart (q_rope=,
    k_rope=), the others the whole rows and the latent as v; views of the kit's tensors."""
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    assert set(mla.SPLIT_CALL_BACKENDS) <= set(FORWARD_ABSORB_CORE_ATTENTION_BACKENDS)
    q, k = torch.randn(3, 4, RANK + ROPE), torch.randn(3, 1, RANK + ROPE)
    v = k[..., :RANK]
    q2, k2, v2, parts = mla.absorbed_call("flashinfer", q, k, v, RANK)
    assert torch.equal(torch.cat([q2, parts["q_rope"]], -1), q) and torch.equal(torch.cat([k2, parts["k_rope"]], -1), k)
    assert q2.data_ptr() == q.data_ptr() and v2.data_ptr() == k.data_ptr()
    assert mla.absorbed_call("triton", q, k, v, RANK) == (q, k, v, {})


def test_a_width_the_triton_decode_rule_declines_fails_in_sglangs_kernel():
    """The reason is SGLang's kernel's, not a guess: a declined width does not run there."""
    case = mla_case(rank=32, rope=16)
    assert "Triton grouped decode" in SGLangTritonBackend.supports(case)
    assert mla.triton_decode_width_problem(mla_case(rank=512, rope=64)) is None
    assert mla.triton_decode_width_problem(mla_case(mode=ForwardMode.EXTEND, new=(2, 1), rank=32)) is None
    fx, backend = _built(case)
    backend.init_forward_metadata(fx.batch)
    x = fx.inputs[0]
    with pytest.raises(Exception, match="incompatible dimensions|shape"):
        backend.forward(x.q, x.k_new, x.v_new, fx.layers[0], fx.batch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reasons")
def test_flashinfer_mla_reasons_on_cpu():
    from backends.flashinfer_mla import FlashInferMLABackend

    deepseek = mla_case(rank=512, rope=64, dtype="bf16")
    for cls in (FlashInferMLABackend, SGLangFlashInferMLABackend):
        assert "CUDA" in cls.supports(deepseek) or "flashinfer-python" in cls.supports(deepseek)
        assert "multiple of 128" in cls.supports(mla_case(dtype="bf16"))
        assert "fp16/bf16" in cls.supports(mla_case())
        tree = mla_case(ForwardMode.TARGET_VERIFY, new=4, rank=512, rope=64, dtype="bf16", topk=2)
        assert "custom mask" in cls.supports(tree)
        dense = Case(name="d", mode=ForwardMode.DECODE, prefix=(3,), heads=(4, 1), head_dim=64, dtype="bf16")
        reason = unsupported_reason(cls, Capabilities.of(cls), dense, Exec.EAGER)
        assert "'mla'" in reason or "dense" in reason
