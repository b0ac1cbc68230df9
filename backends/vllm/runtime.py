"""vLLM, imported and set up once per process the way the adapter needs it. Imported only when a
backend is asked about a case or built: vLLM's import chain takes seconds (its config pulls much of
its serving stack), and the kit loads every registered backend class at start-up.

Set up here, and nothing else:
- Triton kept (environment.import_triton_utils);
- a stand-in model class registered under KIT_ARCHITECTURE, so a ModelConfig is made from a small
  config.json with no weights, and its inspection (vLLM imports the model class for it) loads no
  model code;
- where vLLM's compiled ops (`_C_stable_libtorch`) do not load (no CUDA, or another torch than
  its pin's ABI), the two KV-write ops vLLM's backends call are defined, each by vLLM's own
  non-compiled equivalent: `reshape_and_cache_flash` by its Triton kernel of the same name and
  signature (triton_reshape_and_cache_flash, which TRITON_ATTN calls itself), `concat_and_cache_mla`
  by its CPU MLA backend's writer (CPUMLAImpl.do_kv_cache_update, plain PyTorch). KV_WRITE says
  which ran; a backend's `versions()` records it.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import tempfile
from pathlib import Path
from typing import Dict, Optional

import torch

from backends.vllm import environment

environment.import_triton_utils()

from vllm.config import (CacheConfig, CompilationConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, SpeculativeConfig, VllmConfig, set_current_vllm_config)
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention import Attention, MLAAttention  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend  # noqa: E402
from vllm.model_executor.models.registry import ModelRegistry  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla.prefill.base import MLADimensions  # noqa: E402
from vllm.v1.attention.backends.mla.prefill.selector import MLAPrefillSelectorConfig  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, get_kv_quant_mode  # noqa: E402
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype  # noqa: E402
from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized  # noqa: E402

KIT_ARCHITECTURE = "KitStandInForCausalLM"


class _StandInModel(torch.nn.Module):
    """What vLLM's model registry inspects of a text-generation model class; never built."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


ModelRegistry.register_model(KIT_ARCHITECTURE, _StandInModel)


def _compiled_problem() -> Optional[str]:
    """Why vLLM's compiled ops are not loaded in this process, or None where they are."""
    if hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash"):
        return None
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except Exception as exc:  # noqa: BLE001 - any load failure is the reason
        return (str(exc).splitlines() or [type(exc).__name__])[0]
    return None if hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash") else "its ops did not register"


COMPILED_PROBLEM = _compiled_problem()
_LIBRARY = None  # the stand-in ops' registration (kept: a dropped Library deregisters them)


def _define_kv_write_ops() -> Dict[str, str]:
    """kind -> the KV writer vLLM's backends run here: vLLM's compiled op, or its own equivalent
    defined under the compiled op's name where the compiled ops did not load."""
    if COMPILED_PROBLEM is None:
        return {"dense": "vllm _C reshape_and_cache_flash", "mla": "vllm _C concat_and_cache_mla"}
    global _LIBRARY
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLAImpl
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                       v_scale)

    def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False):
        # It reads nothing of its instance (cpu_mla.py:195-222): skips slots < 0, writes [kv_c | k_pe].
        CPUMLAImpl.do_kv_cache_update(None, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale)

    _LIBRARY = torch.library.Library("_C_cache_ops", "FRAGMENT")
    _LIBRARY.define("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
                    "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()")
    _LIBRARY.define("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
                    "str kv_cache_dtype, Tensor scale, bool skip_scale=False) -> ()")
    _LIBRARY.impl("reshape_and_cache_flash", reshape_and_cache_flash, "CompositeExplicitAutograd")
    _LIBRARY.impl("concat_and_cache_mla", concat_and_cache_mla, "CompositeExplicitAutograd")
    why = f"_C not loadable: {COMPILED_PROBLEM}"
    return {"dense": f"vllm triton_reshape_and_cache_flash ({why})",
            "mla": f"vllm CPUMLAImpl.do_kv_cache_update, PyTorch ({why})"}


KV_WRITE = _define_kv_write_ops()
KV_WRITE["sparse_mla"] = KV_WRITE["mla"]  # a sparse MLA layer writes its latent as an MLA layer does


@dataclasses.dataclass(frozen=True)
class Model:
    """What a VllmConfig is made from: the kit's model and pools, in vLLM's terms."""

    dtype: torch.dtype
    heads: int
    kv_heads: int
    head_dim: int  # dense; MLA: kv_lora_rank + rope
    kv_lora_rank: int  # 0: dense
    rope_dim: int
    block_size: int
    cache_dtype: str  # vLLM's kv_cache_dtype: "auto", "fp8_e4m3", "fp8_e5m2"
    max_model_len: int
    max_num_seqs: int
    num_blocks: int
    num_speculative_tokens: int  # 0: no speculative decoding
    capture_sizes: tuple
    index_topk: int = 0  # sparse MLA (DeepSeek-V3.2): the indexer's top-k; 0: dense


_CONFIG_ROOT = tempfile.TemporaryDirectory(prefix="kit-vllm-")


@functools.lru_cache(maxsize=None)
def _config_dir(model: Model) -> str:
    """A model directory with only a config.json: a Llama (GQA) or DeepSeek-V2 (MLA) config of the
    kit's heads and widths, whose architecture is the stand-in. For MLA, qk_nope_head_dim and
    v_head_dim are the latent's rank (the adapter's identity up-projection, backends/vllm/mla.py)."""
    common = dict(architectures=[KIT_ARCHITECTURE], hidden_size=model.heads * model.head_dim, num_hidden_layers=2,
                  num_attention_heads=model.heads, vocab_size=128, intermediate_size=128,
                  max_position_embeddings=model.max_model_len, torch_dtype=str(model.dtype).replace("torch.", ""))
    if model.kv_lora_rank:
        config = dict(common, model_type="deepseek_v2", num_key_value_heads=model.heads, q_lora_rank=None,
                      kv_lora_rank=model.kv_lora_rank, qk_nope_head_dim=model.kv_lora_rank,
                      qk_rope_head_dim=model.rope_dim, v_head_dim=model.kv_lora_rank, n_routed_experts=4,
                      num_experts_per_tok=2, first_k_dense_replace=2, moe_intermediate_size=128)
        if model.index_topk:
            # DeepSeek-V3.2's config: its index_topk makes the model sparse (deepseek_v2.py:1439, is_v32)
            # and is the top-k sparse builders read (sparse_mla_attention.py, hf_text_config.index_topk).
            config["index_topk"] = model.index_topk
    else:
        config = dict(common, model_type="llama", num_key_value_heads=model.kv_heads, head_dim=model.head_dim)
    folder = Path(_CONFIG_ROOT.name) / f"model-{abs(hash(model))}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def vllm_config(model: Model) -> VllmConfig:
    """The VllmConfig of a server of `model` (graphs on where the platform captures them, as vLLM
    serves by default), its KV cache `num_blocks` blocks as a profiled engine sets it."""
    folder = _config_dir(model)
    model_config = ModelConfig(model=folder, tokenizer=folder, skip_tokenizer_init=True, dtype=model.dtype,
                               max_model_len=model.max_model_len)
    parallel = ParallelConfig()
    speculative = None
    if model.num_speculative_tokens:
        # An n-gram speculator needs no draft model; what the builders read is the count.
        speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=model.num_speculative_tokens,
                                        prompt_lookup_max=3, prompt_lookup_min=1, target_model_config=model_config,
                                        target_parallel_config=parallel)
    # vLLM's scheduler keeps a step within max_num_batched_tokens, and builders size persistent buffers by
    # it; every new token of a step the kit hands takes a KV slot, so the pool's slots bound them all.
    tokens = max(max(model.capture_sizes), model.max_model_len, model.max_num_seqs, model.num_blocks * model.block_size)
    config = VllmConfig(
        model_config=model_config, parallel_config=parallel, speculative_config=speculative,
        cache_config=CacheConfig(block_size=model.block_size, cache_dtype=model.cache_dtype),
        scheduler_config=SchedulerConfig(max_model_len=model.max_model_len, max_num_seqs=model.max_num_seqs,
                                         max_num_batched_tokens=tokens, is_encoder_decoder=False),
        compilation_config=CompilationConfig(cudagraph_capture_sizes=list(model.capture_sizes),
                                             max_cudagraph_capture_size=max(model.capture_sizes)))
    config.cache_config.num_gpu_blocks = model.num_blocks
    # vLLM's CPU platform sets every MLA model's block size to 16 for its own CPU MLA kernel
    # (platforms/cpu.py:253-298); the backends run here are the GPU ones (Triton's, in its
    # interpreter), whose blocks are the pool's pages as on a GPU. Elsewhere this changes nothing.
    config.cache_config.block_size = model.block_size
    return config


def served_config(model: Model, backend) -> VllmConfig:
    """vllm_config(model) as an engine serving it with `backend` alone has it: its KV cache layout
    resolved from what the backend supports (the engine core's resolve_kv_cache_layout,
    v1/engine/core.py:286), which builders and impls read."""
    config = vllm_config(model)
    names = [layout.name for layout in get_supported_kv_cache_layouts([backend])]
    resolve_kv_cache_layout(config, [names], [kv_cache_spec(config)])
    return config


def kv_cache_spec(config: VllmConfig):
    """The KV cache spec of the config's (full-attention) layers, as their get_kv_cache_spec gives
    it (attention.py:611, mla_attention.py get_kv_cache_spec), for the builders' class-level questions."""
    model, cache = config.model_config, config.cache_config
    fields = dict(block_size=cache.block_size, dtype=kv_cache_dtype_str_to_dtype(cache.cache_dtype, model),
                  kv_quant_mode=get_kv_quant_mode(cache.cache_dtype))
    if model.use_mla:
        return MLAAttentionSpec(num_kv_heads=1, head_size=model.get_head_size(), cache_dtype_str=cache.cache_dtype,
                                **fields)
    return FullAttentionSpec(num_kv_heads=model.get_num_kv_heads(config.parallel_config),
                             head_size=model.get_head_size(), **fields)


# DeepSeek-V2/V3's prefill head sizes, which every platform's MLA prefill backends take.
DEEPSEEK_PREFILL = MLADimensions(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


@functools.lru_cache(maxsize=None)
def mla_prefill(model: Model):
    """(the MLA prefill backend class the layer is built with, why prefill rows cannot run or None):
    the platform's choice for the latent's head sizes (nope = v = rank, backends/vllm/mla.py), else
    its choice for DeepSeek's, with the selector's refusal as the reason."""
    latent = MLADimensions(qk_nope_head_dim=model.kv_lora_rank, qk_rope_head_dim=model.rope_dim,
                           v_head_dim=model.kv_lora_rank)
    try:
        return current_platform.get_mla_prefill_backend_cls(MLAPrefillSelectorConfig(model.dtype, latent)), None
    except ValueError as exc:
        why = (f"MLA prefill rows (ragged query lengths): vLLM attends them over keys and values decompressed by "
               f"kv_b_proj, which under the kit's latent contract are the latent itself ({latent}); no MLA prefill "
               f"backend of this platform takes that: {exc}")
    try:
        return current_platform.get_mla_prefill_backend_cls(MLAPrefillSelectorConfig(model.dtype, DEEPSEEK_PREFILL)), why
    except ValueError as exc:  # the model's dtype itself: no head sizes would do (e.g. fp32 on Hopper)
        return None, f"MLA prefill rows in {model.dtype}: no MLA prefill backend of this platform takes it: {exc}"


@functools.lru_cache(maxsize=None)
def single_rank() -> None:
    """vLLM's process groups for one rank, as its worker makes them before building a model: layers
    that ask for the tensor-parallel size when they are built (the recurrent layers' parallel
    linear layers, sparse MLA's impls) find it. Called inside the served config
    (initialize_model_parallel reads it)."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{tempfile.mktemp(prefix='kit-vllm-dist-')}")
    initialize_model_parallel(1, 1)


def backend_class(name: str):
    """vLLM's attention backend class of an AttentionBackendEnum name."""
    return AttentionBackendEnum[name].get_class()


__all__ = ["Attention", "AttentionCGSupport", "CommonAttentionMetadata", "KV_WRITE", "MLAAttention", "MLACommonBackend",
           "Model", "backend_class", "current_platform", "init_workspace_manager", "is_workspace_manager_initialized",
           "kv_cache_spec", "mla_prefill", "set_current_vllm_config", "served_config", "set_forward_context",
           "single_rank", "vllm_config"]
