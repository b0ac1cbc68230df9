"""SGLang, imported and set up once per process the way the adapter needs it: shims for what cannot be installed, attention TP 1
without torch.distributed, and the server args SGLang's backends read through its
runtime context. Imported only when a backend is built: sglang's import chain
takes seconds, and the kit loads every registered backend class at start-up."""
from __future__ import annotations

import importlib.util
import warnings

import torch

from backends import engine_process
from backends.sglang import shims
from kit import caches

engine_process.prepare()  # before SGLang's chain imports triton and vllm

# torchvision: no CPU wheel on the index (a plain install pulls CUDA torch);
# sgl_kernel: CUDA-only, 373 MB, pins torch 2.14.1. Shimmed only where absent.
shims.install([name for name in ("torchvision", "sgl_kernel") if importlib.util.find_spec(name) is None])
shims.cpu_device_context()  # Triton's interpreter runs SGLang's kernels on the CPU: their device context

# Importing sglang points the compilers' caches (FlashInfer's, Triton's, inductor's) at its own folder
# for the whole process where they are unnamed (sglang/__init__.py:14, srt/environ.py:2308). Named
# first, they stay where the process's other backends, the warmup and its archive look.
caches.pin()

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # import-time deprecation chatter of the serving stack
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import UnquantizedKVCacheMethod
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, unwrap_write_loc
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import enable_breakable_cuda_graph
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleDraftInput, EagleVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from transformers import PretrainedConfig

# Attention TP 1 without a launcher: the widths follow from tp_size=1 in the server args,
# but the ranks are written only by process-group setup, and Triton reads attn_dcp_rank
# (triton_backend.py:264). Permanent: `override()` is a generator that undoes itself when
# collected (runtime_context.py:408, :430).
get_parallel().override_permanently(attn_tp_size=1, attn_dcp_rank=0)


def install_server_args(attention_backend: str, device: torch.device, page_size: int, speculative,
                        **fields) -> None:
    """Publish the server args a backend reads at construction (and its kernels after), through
    SGLang's own test hook (runtime_context.py:1177). Graphs are driven by the kit, so SGLang's
    own CUDA-graph runners are off; the page size is the pool's (the multi-step draft backends
    read it here, get_schedule().page_size); speculative fields come from the kit's config;
    `fields`, a backend's own."""
    args = dict(
        attention_backend=attention_backend,
        page_size=page_size,
        chunked_prefill_size=-1,
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend=Backend.DISABLED),
                                          prefill=PhaseConfig(backend=Backend.DISABLED)),
        dp_size=1, tp_size=1, pp_size=1,
        enable_deterministic_inference=False,
        kv_cache_dtype="auto",
        speculative_algorithm=speculative.algorithm if speculative else None,
        speculative_eagle_topk=speculative.topk if speculative else 1,
        speculative_num_draft_tokens=speculative.num_draft_tokens if speculative else 1,
        speculative_num_steps=speculative.num_steps if speculative else 0,
        device=device.type,
    )
    get_context().override_server_args(**{**args, **fields}).install()  # a backend's fields over the defaults


# The kit's modes as SGLang's: the draft decode is DECODE on a multi-step draft backend
# (eagle_worker_common.py prepare_for_draft).
MODES = {"decode": ForwardMode.DECODE, "extend": ForwardMode.EXTEND, "mixed": ForwardMode.MIXED,
         "target_verify": ForwardMode.TARGET_VERIFY, "draft_extend_v2": ForwardMode.DRAFT_EXTEND_V2,
         "draft_decode": ForwardMode.DECODE}

__all__ = ["AttentionArch", "AttentionBackend", "CaptureHiddenMode", "EagleDraftExtendInput", "EagleDraftInput",
           "EagleVerifyInput", "ForwardBatch", "ForwardContext", "KVIndexTranslator", "MHATokenToKVPool",
           "MLATokenToKVPool", "MODES", "PretrainedConfig", "RadixAttention", "SpeculativeAlgorithm",
           "UnquantizedKVCacheMethod", "enable_breakable_cuda_graph", "forward_context", "install_server_args",
           "unwrap_write_loc"]
