"""Standalone repro: SGLang triton, draft_decode eager, case gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496 (attention conformance kit).
Imports only torch and SGLang.
Builds the batches with SGLang's own classes (ReqToTokenPool, MHATokenToKVPool, KVIndexTranslator,
the multi-step draft backend, RadixAttention, ForwardBatch) and calls them in the order its EAGLE draft
worker does (init_forward_metadata once for every step, then per step each layer's forward under that
step's backend, on the step's write slots and positions; each step reads the KV the earlier ones wrote).
Shrunk from gqa_chain3_fp8_e5m2_p1_fp32 (2 requests, 42 cached and 8 new tokens, kv_dtype) to gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496 (1 requests, 1 cached and 4 new tokens, kv_dtype); both fail [kernel] in the kit.
Each layer's output is judged against an inline float64 reference: the error against the limit,
PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
from __future__ import annotations

import json, logging, os, sys, tempfile
from typing import Optional

import torch

SCENARIO = {'abs_floor': 0.0001,
 'batches': [{'forwards': [[{'key_pos': [0, 1, 2, 3, 4],
                             'keys': [0, 1, 2, 3, 4],
                             'n_new': 1,
                             'n_old': 4,
                             'pages': [1, 2, 3, 4, 5, 6, 7],
                             'q_pos': [4],
                             'row': 4,
                             'seq_len': 4,
                             'slots': [1, 2, 3, 4, 5],
                             'visible': ['11111']},
                            {'key_pos': [0, 1, 2, 3, 4],
                             'keys': [0, 1, 2, 3, 4],
                             'n_new': 1,
                             'n_old': 4,
                             'pages': [9, 10, 11, 12, 13, 14, 15],
                             'q_pos': [4],
                             'row': 2,
                             'seq_len': 4,
                             'slots': [9, 10, 11, 12, 13],
                             'visible': ['11111']},
                            {'key_pos': [0, 1],
                             'keys': [0, 1],
                             'n_new': 1,
                             'n_old': 1,
                             'pages': [17, 18, 19, 20],
                             'q_pos': [1],
                             'row': 6,
                             'seq_len': 1,
                             'slots': [17, 18],
                             'visible': ['11']}],
                           [{'key_pos': [0, 1, 2, 3, 4, 5],
                             'keys': [0, 1, 2, 3, 4, 5],
                             'n_new': 1,
                             'n_old': 5,
                             'pages': [1, 2, 3, 4, 5, 6, 7],
                             'q_pos': [5],
                             'row': 4,
                             'seq_len': 4,
                             'slots': [1, 2, 3, 4, 5, 6],
                             'visible': ['111111']},
                            {'key_pos': [0, 1, 2, 3, 4, 5],
                             'keys': [0, 1, 2, 3, 4, 5],
                             'n_new': 1,
                             'n_old': 5,
                             'pages': [9, 10, 11, 12, 13, 14, 15],
                             'q_pos': [5],
                             'row': 2,
                             'seq_len': 4,
                             'slots': [9, 10, 11, 12, 13, 14],
                             'visible': ['111111']},
                            {'key_pos': [0, 1, 2],
                             'keys': [0, 1, 2],
                             'n_new': 1,
                             'n_old': 2,
                             'pages': [17, 18, 19, 20],
                             'q_pos': [2],
                             'row': 6,
                             'seq_len': 1,
                             'slots': [17, 18, 19],
                             'visible': ['111']}]],
              'mode': 'draft_decode',
              'name': 'gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496~step8',
              'requests': [{'key_pos': [0, 1, 2, 3, 4, 5, 6],
                            'keys': None,
                            'n_new': 3,
                            'n_old': 4,
                            'pages': [1, 2, 3, 4, 5, 6, 7],
                            'q_pos': [4, 5, 6],
                            'row': 4,
                            'seq_len': 4,
                            'slots': [1, 2, 3, 4, 5, 6, 7],
                            'visible': ['1111100', '1111110', '1111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6],
                            'keys': None,
                            'n_new': 3,
                            'n_old': 4,
                            'pages': [9, 10, 11, 12, 13, 14, 15],
                            'q_pos': [4, 5, 6],
                            'row': 2,
                            'seq_len': 4,
                            'slots': [9, 10, 11, 12, 13, 14, 15],
                            'visible': ['1111100', '1111110', '1111111']},
                           {'key_pos': [0, 1, 2, 3],
                            'keys': None,
                            'n_new': 3,
                            'n_old': 1,
                            'pages': [17, 18, 19, 20],
                            'q_pos': [1, 2, 3],
                            'row': 6,
                            'seq_len': 1,
                            'slots': [17, 18, 19, 20],
                            'visible': ['1100', '1110', '1111']}],
              'steps': {'cpu': ['q cast to fp8', 'p cast to fp8'],
                        'cuda': ['q cast to fp8', 'p cast to fp8', 'tf32 dots']}},
             {'forwards': [[{'key_pos': [0, 1, 2],
                             'keys': [0, 1, 2],
                             'n_new': 1,
                             'n_old': 2,
                             'pages': [1, 2, 3, 4, 5],
                             'q_pos': [2],
                             'row': 1,
                             'seq_len': 2,
                             'slots': [1, 2, 3],
                             'visible': ['111']}],
                           [{'key_pos': [0, 1, 2, 3],
                             'keys': [0, 1, 2, 3],
                             'n_new': 1,
                             'n_old': 3,
                             'pages': [1, 2, 3, 4, 5],
                             'q_pos': [3],
                             'row': 1,
                             'seq_len': 2,
                             'slots': [1, 2, 3, 4],
                             'visible': ['1111']}]],
              'mode': 'draft_decode',
              'name': 'gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496~step9',
              'requests': [{'key_pos': [0, 1, 2, 3, 4],
                            'keys': None,
                            'n_new': 3,
                            'n_old': 2,
                            'pages': [1, 2, 3, 4, 5],
                            'q_pos': [2, 3, 4],
                            'row': 1,
                            'seq_len': 2,
                            'slots': [1, 2, 3, 4, 5],
                            'visible': ['11100', '11110', '11111']}],
              'steps': {'cpu': ['q cast to fp8', 'p cast to fp8'],
                        'cuda': ['q cast to fp8', 'p cast to fp8', 'tf32 dots']}},
             {'forwards': [[{'key_pos': [0, 1],
                             'keys': [0, 1],
                             'n_new': 1,
                             'n_old': 1,
                             'pages': [1, 2, 3, 4],
                             'q_pos': [1],
                             'row': 2,
                             'seq_len': 1,
                             'slots': [1, 2],
                             'visible': ['11']}],
                           [{'key_pos': [0, 1, 2],
                             'keys': [0, 1, 2],
                             'n_new': 1,
                             'n_old': 2,
                             'pages': [1, 2, 3, 4],
                             'q_pos': [2],
                             'row': 2,
                             'seq_len': 1,
                             'slots': [1, 2, 3],
                             'visible': ['111']}]],
              'mode': 'draft_decode',
              'name': 'gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496',
              'requests': [{'key_pos': [0, 1, 2, 3],
                            'keys': None,
                            'n_new': 3,
                            'n_old': 1,
                            'pages': [1, 2, 3, 4],
                            'q_pos': [1, 2, 3],
                            'row': 2,
                            'seq_len': 1,
                            'slots': [1, 2, 3, 4],
                            'visible': ['1100', '1110', '1111']}],
              'steps': {'cpu': ['q cast to fp8', 'p cast to fp8'],
                        'cuda': ['q cast to fp8', 'p cast to fp8', 'tf32 dots']}}],
 'case': 'gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496',
 'context_len': 32,
 'draft': {'steps': 3, 'tokens': 4, 'topk': 1},
 'dtype': 'float32',
 'kv_dtype': 'float8_e5m2',
 'layers': [{'cap': 0.0,
             'head_dim': 64,
             'heads': 4,
             'k_scale': 2.0,
             'kv_heads': 2,
             'rank': 0,
             'rope': 0,
             'scale': 0.125,
             'sinks': [],
             'v_scale': 0.25,
             'window': -1},
            {'cap': 0.0,
             'head_dim': 64,
             'heads': 4,
             'k_scale': 0.5,
             'kv_heads': 2,
             'rank': 0,
             'rope': 0,
             'scale': 0.125,
             'sinks': [],
             'v_scale': 4.0,
             'window': -1}],
 'max_model_len': 32,
 'max_num_seqs': 8,
 'mode': 'draft_decode',
 'num_blocks': 32,
 'num_slots': 32,
 'origin': 'Shrunk from gqa_chain3_fp8_e5m2_p1_fp32 (2 requests, 42 cached and 8 new tokens, kv_dtype) to '
           'gqa_bs1_steps3_p1_fp32_fp8_e5m2_fzbda496 (1 requests, 1 cached and 4 new tokens, kv_dtype); both fail '
           '[kernel] in the kit.',
 'page': 1,
 'ratio': 2.0,
 'seed': 3550448577}
S, L0 = SCENARIO, SCENARIO["layers"][0]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, S["dtype"])
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's Triton kernels in Triton's interpreter
# A quantized (fp8) KV cache: what it stores of x is fp8(x / scale), read back as fp8 * scale (per layer, one
# scale for K and one for V).
KV_DTYPE = getattr(torch, S["kv_dtype"]) if S["kv_dtype"] else None

if DEVICE == "cpu" and KV_DTYPE is not None and os.environ.get("TRITON_INTERPRET") == "1":
    import triton.language as tl
    import triton.runtime.interpreter as interp

    def _fp8_rounded_to_nearest(fp_to_fp, tl, handle_cls):
        """float32/float16/bfloat16 -> fp8 e4m3 / e5m2 rounded to nearest even, saturating (NVIDIA's
        cvt.rn.satfinite), through torch's casts; other conversions, and other rounding modes, the
        interpreter's."""
        import numpy as np
        import torch

        from triton._C.libtriton import ir

        sources = {tl.float32: (np.int32, torch.float32), tl.float16: (np.int16, torch.float16),
                   tl.bfloat16: (np.int16, torch.bfloat16)}
        targets = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}

        def convert(self, src, dst_type, rounding_mode):
            source, target = sources.get(src.dtype.scalar), targets.get(dst_type.scalar)
            if source is None or target is None or rounding_mode != ir.ROUNDING_MODE.RTNE:
                return fp_to_fp(self, src, dst_type, rounding_mode)
            bits, dtype = source
            values = torch.from_numpy(np.ascontiguousarray(src.data).view(bits)).view(dtype)
            largest = torch.finfo(target).max
            stored = values.float().clamp(-largest, largest).to(target)  # float32 holds every source value
            return handle_cls(stored.view(torch.uint8).numpy(), dst_type.scalar)
        convert.__wrapped__ = fp_to_fp
        return convert
    interp.InterpreterBuilder.create_fp_to_fp = _fp8_rounded_to_nearest(interp.InterpreterBuilder.create_fp_to_fp, tl,
                                                                        interp.TensorHandle)

# Per batch, layer and request: q of its new tokens, K and V of all its tokens (cached, then new), drawn
# in float64 from the seed and rounded to the run's dtype (the reference reads the values the engine gets).
# MLA: K is each token's latent row (its first `rank` columns the compressed KV, the rest its rope key, one
# KV head), V the row's first `rank` columns: the latent cache holds one row a token.
gen = torch.Generator().manual_seed(S["seed"])


def draw_inputs(reqs):
    inputs = []
    for spec in S["layers"]:
        per_req = []
        for r in reqs:
            q = torch.randn(r["n_new"], spec["heads"], spec["head_dim"], generator=gen, dtype=torch.float64)
            k, v = (torch.randn(r["n_old"] + r["n_new"], spec["kv_heads"], spec["head_dim"], generator=gen,
                                dtype=torch.float64) for _ in "kv")
            if spec["rank"]:
                v = k[..., :spec["rank"]]
            per_req.append(tuple(x.to(dtype).to(torch.float64) for x in (q, k, v)))
        inputs.append(per_req)
    return inputs


def new_tokens(reqs, per_req, which):
    """The step's new tokens of input `which` (0 q, 1 k, 2 v), request after request, as the engine takes them."""
    return torch.cat([x[which][r["n_old"]:] if which else x[0] for x, r in zip(per_req, reqs)]).to(dtype).to(DEVICE)


def forwards(batch, inputs):
    """Per forward of the batch, its requests and their inputs per layer: the batch itself, or each step of a
    multi-step program, whose rows take their q and keys from their request's draws (a draft lane's column
    that an earlier step wrote is the same token when a later step reads it)."""
    if not batch["forwards"]:
        return [(batch["requests"], inputs)]
    of = {r["row"]: i for i, r in enumerate(batch["requests"])}  # a row's request in the batch
    return [(reqs, [[gathered(per_req[of[r["row"]]], batch["requests"][of[r["row"]]], r) for r in reqs]
                    for per_req in inputs]) for reqs in batch["forwards"]]


def gathered(drawn, request, row):
    """A step's row's q, k and v out of its request's draws `drawn`: its new tokens' q, its keys' k and v."""
    q, k, v = drawn
    keys = row["keys"]
    return q[[t - request["n_old"] for t in keys[len(keys) - row["n_new"]:]]], k[keys], v[keys]


changed = []  # what the engine changed of the q, k and v it was handed (a model reuses them)


def handed(step, qkv):
    """`step()`'s outputs, and in `changed` each of `qkv` (per layer: q, k, v) that it changed in place."""
    kept = [[x.clone() for x in layer] for layer in qkv]
    outs = step()
    for i, (was, now) in enumerate(zip(kept, qkv)):
        for name, before, after in zip("qkv", was, now):
            differ = (before != after) & ~(before.isnan() & after.isnan())
            if differ.any():
                changed.append(f"layer {i}: {name} passed to forward was changed in place: {int(differ.sum())} of "
                               f"{after.numel()} values differ")
    return outs

def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(x: torch.Tensor, scale: Optional[float], dtype: torch.dtype) -> torch.Tensor:
    """What a pool of `dtype` stores for x (a new tensor; x is left as it was). Unquantized
    pools store x cast to their dtype."""
    if not is_quantized(dtype):
        return x.to(dtype)
    return (x.to(torch.float32) / scale).to(dtype)


def dequantize(stored: torch.Tensor, scale: Optional[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values a backend reads from stored ones, in `dtype` (exact: fp8 times a power of two)."""
    if not is_quantized(stored.dtype):
        return stored.to(dtype)
    return (stored.to(torch.float32) * scale).to(dtype)


def as_stored(x: torch.Tensor, scale: Optional[float], dtype: torch.dtype) -> torch.Tensor:
    """x as a backend reads it back from a pool of `dtype` (float32 where quantized; else x)."""
    return dequantize(quantize(x, scale, dtype), scale) if is_quantized(dtype) else x

import importlib.abc, importlib.machinery, importlib.util, types

BACKEND = 'triton'
# Where SGLang's CUDA-only kernel package (or torchvision) is not installed, its import chain still
# names them: placeholders that fail when used, served to sglang's imports only.
MISSING = [name for name in ("sgl_kernel", "torchvision") if importlib.util.find_spec(name) is None]


class Placeholder:
    def __init__(self, name):
        self.name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return Placeholder(f"{self.name}.{item}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name} is not installed here")

    def __mro_entries__(self, bases):
        return (object,)


class PlaceholderModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return Placeholder(f"{self.__name__}.{item}")


class PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        caller = sys._getframe(1)
        while caller and caller.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
            caller = caller.f_back
        if fullname.split(".")[0] in MISSING and caller and caller.f_globals.get("__name__", "").startswith("sglang"):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = PlaceholderModule(spec.name)
        module.__path__ = []
        if spec.name == "sgl_kernel.utils":
            module.is_arch_support_pdl = lambda: False
        return module

    def exec_module(self, module):
        pass


if MISSING:
    if "torchvision" in MISSING:  # transformers caches whether torchvision is there: asked before the placeholder
        from transformers.utils import import_utils
        import_utils.is_torchvision_available()
    sys.meta_path.append(PlaceholderFinder())
from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend as AttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from transformers import PretrainedConfig

get_parallel().override_permanently(attn_tp_size=1, attn_dcp_rank=0)  # one process, no torch.distributed
no_graphs = PhaseConfig(backend=Backend.DISABLED)
KV_CACHE_DTYPE = {None: "auto", torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}[KV_DTYPE]
cache_dtype = KV_DTYPE or dtype  # SGLang's pool stores an fp8 cache as bytes and reads them as this
DRAFT = S["draft"]  # a multi-step draft's lanes (topk), steps and draft tokens: the draft worker's server args
SPECULATIVE = dict(speculative_algorithm="EAGLE", speculative_eagle_topk=DRAFT["topk"],
                   speculative_num_steps=DRAFT["steps"], speculative_num_draft_tokens=DRAFT["tokens"]) if DRAFT else     dict(speculative_algorithm=None)
get_context().override_server_args(
    attention_backend=BACKEND, page_size=S["page"], chunked_prefill_size=-1, dp_size=1, tp_size=1, pp_size=1,
    cuda_graph_config=CudaGraphConfig(decode=no_graphs, prefill=no_graphs), enable_deterministic_inference=False,
    kv_cache_dtype=KV_CACHE_DTYPE, device=DEVICE, **SPECULATIVE).install()


MLA = L0["rank"] > 0  # latent attention: one latent row a token (its first `rank` columns V), DeepSeek's


class ModelConfig:  # the fields of a model's config SGLang's attention backends read
    attention_arch = AttentionArch.MLA if MLA else AttentionArch.MHA
    context_len = S["context_len"]
    num_attention_heads, num_key_value_heads = L0["heads"], L0["heads"] if MLA else L0["kv_heads"]
    head_dim = v_head_dim = swa_v_head_dim = L0["head_dim"]
    if MLA:  # what SGLang's ModelConfig derives for an MLA model (configs/model_config.py)
        kv_lora_rank, qk_rope_head_dim, scaling = L0["rank"], L0["rope"], L0["scale"]
        qk_nope_head_dim = v_head_dim = swa_v_head_dim = 128  # its normal path's, unused here
        head_dim = 256
    is_encoder_decoder = is_multimodal = False
    hf_config = hf_text_config = PretrainedConfig(architectures=["StandInForCausalLM"])
    linear_attn_registry_result = None

    def get_max_num_attention_heads(self):
        return self.num_attention_heads

    def get_num_kv_heads(self, tensor_parallel_size, dcp_size=1):
        return self.num_key_value_heads // (tensor_parallel_size // dcp_size)


class ModelRunner:  # the attributes of SGLang's ModelRunner its attention backends read
    device, gpu_id, dtype, kv_cache_dtype, page_size = DEVICE, 0, dtype, cache_dtype, S["page"]
    model_config = ModelConfig()
    use_mla_backend, is_draft_worker = MLA, DRAFT is not None
    windows = [spec["window"] for spec in S["layers"] if spec["window"] >= 0]
    sliding_window_size = max(windows) if windows else None
    spec_algorithm = SpeculativeAlgorithm.EAGLE if DRAFT else SpeculativeAlgorithm.NONE
    prefill_attention_backend_str = decode_attention_backend_str = BACKEND
    server_args = get_context().server_args
    req_to_token_pool = ReqToTokenPool(S["max_num_seqs"], S["max_model_len"], DEVICE, enable_memory_saver=False)
    token_to_kv_pool = MLATokenToKVPool(S["num_slots"], S["page"], cache_dtype, L0["rank"], L0["rope"],
                                        len(S["layers"]), DEVICE, enable_memory_saver=False) if MLA else         MHATokenToKVPool(S["num_slots"], S["page"], cache_dtype, L0["kv_heads"], L0["head_dim"], len(S["layers"]),
                         DEVICE, enable_memory_saver=False)
    token_to_kv_pool_allocator = TokenToKVPoolAllocator(S["num_slots"], cache_dtype, DEVICE, token_to_kv_pool, False)
    kv_index_translator = KVIndexTranslator(
        req_to_token=req_to_token_pool.req_to_token, token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        token_to_kv_pool=token_to_kv_pool, page_size=S["page"], device=DEVICE, is_draft_worker=DRAFT is not None)

    def decode_num_tokens_per_req(self, num_draft_tokens=None):
        return 1


runner = ModelRunner()
backend = AttnBackend(runner, DRAFT["topk"], DRAFT["steps"]) if DRAFT else AttnBackend(runner)
for each in getattr(backend, "attn_backends", [backend]):  # a multi-step draft's: one backend a step
    if getattr(each, "device_core_count", 1) <= 0:  # no SMs without CUDA: an H100's count keeps its KV split planner
        each.device_core_count = 132
pool = runner.token_to_kv_pool
layers = [RadixAttention(num_heads=spec["heads"], head_dim=spec["head_dim"], scaling=spec["scale"],
                         num_kv_heads=spec["kv_heads"], layer_id=i, logit_cap=spec["cap"],
                         sliding_window_size=spec["window"], v_head_dim=spec["rank"] or spec["head_dim"])
          for i, spec in enumerate(S["layers"])]
for attn, spec in zip(layers, S["layers"]):
    if spec["k_scale"] is not None:  # an fp8 cache's scales, as a model's load (quantization/kv_cache.py)
        attn.k_scale, attn.v_scale = (torch.tensor(spec[s], dtype=torch.float32, device=DEVICE)
                                      for s in ("k_scale", "v_scale"))
        attn.k_scale_float, attn.v_scale_float = spec["k_scale"], spec["v_scale"]
sinks = [{"sinks": torch.tensor(spec["sinks"], dtype=torch.bfloat16, device=DEVICE)} if spec["sinks"] else {}
         for spec in S["layers"]]
MODES = {"decode": ForwardMode.DECODE, "extend": ForwardMode.EXTEND, "mixed": ForwardMode.MIXED}


def device_ints(values, dtype_):
    return torch.tensor(values, dtype=dtype_, device=DEVICE)


def load(reqs, inputs):
    """The batch's cached tokens written into SGLang's pool as it stores them (an fp8 cache: quantized with
    the layer's scales; MLA: each token's latent row), NaN in every other slot (a read past a request's keys
    shows); its requests' slots into req_to_token."""
    for i, (spec, per_req) in enumerate(zip(S["layers"], inputs)):
        buffers = [(pool.kv_buffer[i], 1, spec["k_scale"])] if MLA else [
            (pool.k_buffer[i], 1, spec["k_scale"]), (pool.v_buffer[i], 2, spec["v_scale"])]
        for buffer, which, scale in buffers:
            buffer.view(cache_dtype).fill_(float("nan"))
            for r, x in zip(reqs, per_req):
                slots = torch.tensor(r["slots"][:r["n_old"]], dtype=torch.int64, device=DEVICE)
                stored = quantize(x[which][:r["n_old"]].to(dtype), scale, cache_dtype)
                buffer[slots] = stored.view(buffer.dtype).to(DEVICE)
    for r in reqs:
        runner.req_to_token_pool.req_to_token[r["row"], :len(r["slots"])] = torch.tensor(r["slots"], dtype=torch.int32)


def batch_fields(mode, reqs):
    """The ForwardBatch fields of a batch of `reqs` in `mode`, as the scheduler hands them."""
    new_lens, old_lens, seq_lens = ([r[f] for r in reqs] for f in ("n_new", "n_old", "seq_len"))
    fields = dict(
        forward_mode=MODES[mode], batch_size=len(reqs), input_ids=None,
        req_pool_indices=device_ints([r["row"] for r in reqs], torch.int32),
        seq_lens=device_ints(seq_lens, torch.int32), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        seq_lens_sum=sum(seq_lens), out_cache_loc=device_ints([s for r in reqs for s in r["slots"][r["n_old"]:]],
                                                              torch.int64),
        positions=device_ints([p for r in reqs for p in r["q_pos"]], torch.int64), spec_info=None)
    if mode != "decode":
        fields.update(extend_num_tokens=sum(new_lens), extend_seq_lens=device_ints(new_lens, torch.int32),
                      extend_prefix_lens=device_ints(old_lens, torch.int32),
                      extend_start_loc=device_ints([sum(new_lens[:i]) for i in range(len(reqs))], torch.int32),
                      extend_seq_lens_cpu=new_lens, extend_prefix_lens_cpu=old_lens,
                      global_num_token_non_padded_cpu=sum(new_lens))
    return fields


def forward_batch(fields, in_capture=False):
    """A new ForwardBatch bound to its KV location plan, as the model runner makes one (a graph's capture
    batch over the runner's buffers binds those)."""
    fb = ForwardBatch(**fields)
    (runner.kv_index_translator.bind_runner_slots if in_capture else runner.kv_index_translator.bind_own_plan)(fb)
    return fb


def forward(fields, qkv, attn_backend=backend):
    """Each layer's forward inside `attn_backend`'s forward context (a draft step's: its own), on `qkv` (per layer:
    q, k, v of the step)."""
    outs = []
    with forward_context(ForwardContext(attn_backend=attn_backend)):
        for spec, attn, extra, (q, k, v) in zip(S["layers"], layers, sinks, qkv):
            t = q.shape[0]
            outs.append(attn(q.reshape(t, -1), k, v, forward_batch(fields), **extra).view(
                t, spec["heads"], spec["rank"] or spec["head_dim"]))
    return outs


def draft_fields(reqs):
    """The batch the draft's metadata is built on, as prepare_for_draft makes it: seq_lens the committed lengths,
    every lane's columns as write slots in (request, lane, column) order, one position (seq_len) a lane."""
    fields = batch_fields("decode", reqs)
    fields.update(positions=device_ints([r["seq_len"] for r in reqs for _ in range(DRAFT["topk"])], torch.int64),
                  spec_info=EagleDraftInput())
    return fields


def step_fields(fields, step):
    """Step `step`'s batch, as draft_forward makes it: column `step` of every lane's slots, positions + step."""
    loc = fields["out_cache_loc"].view(fields["batch_size"], DRAFT["topk"], DRAFT["steps"])[:, :, step]
    return dict(fields, out_cache_loc=loc.reshape(-1), positions=fields["positions"] + step,
                spec_info=EagleDraftInput())


def run(batch, inputs):
    """The draft's steps: the wrapper's init_forward_metadata once, then per step each layer's forward under
    the step's backend. Returns per layer every step's outputs, step after step."""
    reqs = batch["requests"]
    load(reqs, inputs)
    fields = draft_fields(reqs)
    backend.init_forward_metadata(forward_batch(fields))
    outs = []
    for step, (step_reqs, per_layer) in enumerate(forwards(batch, inputs)):
        qkv = [[new_tokens(step_reqs, per_req, which) for which in range(3)] for per_req in per_layer]
        outs.append(handed(lambda: forward(step_fields(fields, step), qkv, backend.attn_backends[step]), qkv))
    return [torch.cat(per_step) for per_step in zip(*outs)]


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x (float64) as a tensor core takes a float32 operand of a TF32 dot: its mantissa truncated to
    10 bits. Triton hands tl.dot's float32 operands to the tensor cores unrounded (rounding them
    first is an option of later Triton, triton-lang/triton#9295), and truncation's error leans one
    way, which a rounded emulation's envelope does not cover."""
    bits = x.to(torch.float32).view(torch.int32)
    return (bits & ~0x1FFF).view(torch.float32).to(x.dtype)


def _p_fp8(probs: torch.Tensor) -> torch.Tensor:
    """Probabilities as an fp8 PV product takes them (FA3, vLLM's Triton kernel): each row's
    exp(s - max) (here, the row's largest probability is 1) scaled by 2^8 into fp8 e4m3's range and
    quantized, the row's sum unrounded."""
    top = probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return (probs / top * 256).to(torch.float8_e4m3fn).to(probs.dtype) / 256 * top


def _p_cast(probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Probabilities cast to the cache's fp8 `dtype` with no scale (SGLang's p.to(v.dtype)): each row's
    exp(s - max) rounded, small ones flushed, the row's sum unrounded."""
    top = probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return (probs / top).to(dtype).to(probs.dtype) * top


def _p_half(probs: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Probabilities as FlashInfer's prefill kernels keep them: each row's exp(s - max) rounded to the
    model's `dtype`, and the row's sum taken over the rounded values (a sink's share, what the row's
    probabilities leave of 1, unrounded). Returns (the rounded values over that sum, the sum as a share
    of the exact denominator: the log-sum-exp grows by its log)."""
    top = probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    rounded = (probs / top).to(dtype).to(probs.dtype) * top
    total = rounded.sum(dim=-1, keepdim=True) + (1 - probs.sum(dim=-1, keepdim=True))
    return rounded / total, total.squeeze(-1)


ENVELOPE = ['p fp8', 'p cast to fp8', "p and its sum in the model's dtype", 'tf32 dots', 'state cast at the output']  # declared steps that round inside the kernel's tiles: they widen the limit by their cost


def reference(spec, reqs, per_req, precision, steps=()):
    """Attention of every new token over its request's visible keys, computed in `precision`: K and V as the
    cache holds them (an fp8 cache: quantized with the layer's scales and read back), under the declared
    numerics' `steps` (the query quantized or cast to fp8 where it meets a key the cache holds, the step's new
    tokens attended as handed, the probabilities in fp8, TF32 dots)."""
    rows = []
    tf32 = _tf32 if 'tf32 dots' in steps else (lambda x: x)
    for r, (q, k, v) in zip(reqs, per_req):
        new = (torch.arange(k.shape[0]) >= r["n_old"])[:, None, None]
        q_read = q
        if KV_DTYPE is not None:
            as_read = [as_stored(x, spec[scale], KV_DTYPE).to(torch.float64) for x, scale in ((k, "k_scale"),
                                                                                             (v, "v_scale"))]
            if 'new tokens as handed' in steps:
                as_read = [torch.where(new, x, x_read) for x, x_read in zip((k, v), as_read)]
            k, v = as_read
            if 'q fp8' in steps or 'q cast to fp8' in steps:
                q_read = as_stored(q, spec["k_scale"] if 'q fp8' in steps else 1.0, KV_DTYPE).to(torch.float64)
                if 'rope as handed' in steps:  # an MLA query's rope columns as handed, its latent ones quantized
                    q_read[..., spec["rank"]:] = q[..., spec["rank"]:].to(torch.float64)
        q, q_read, k, v = (tf32(x.to(precision)) for x in (q, q_read, k, v))
        group = spec["heads"] // spec["kv_heads"]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q_read, k)
        if 'new tokens as handed' in steps:  # the step's new keys meet the query as handed
            scores = torch.where(new[:, 0, 0], torch.einsum("qhd,khd->hqk", q, k), scores)
        scores = scores * spec["scale"]
        if spec["cap"] > 0:
            scores = spec["cap"] * torch.tanh(scores / spec["cap"])
        seen = torch.tensor([[c == "1" for c in row] for row in r["visible"]])
        if spec["window"] >= 0:  # a query at p sees keys p-W..p
            qp, kp = torch.tensor(r["q_pos"])[:, None], torch.tensor(r["key_pos"])[None, :]
            seen &= (kp >= qp - spec["window"]) & (kp <= qp)
        scores = scores.masked_fill(~seen, float("-inf"))
        if spec["sinks"]:  # one more logit per head in the softmax's denominator
            sink = torch.tensor(spec["sinks"], dtype=precision)[:, None, None].expand(-1, r["n_new"], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        if 'p fp8' in steps:
            probs = _p_fp8(probs)
        elif 'p cast to fp8' in steps:
            probs = _p_cast(probs, KV_DTYPE)
        elif "p and its sum in the model's dtype" in steps:
            probs = _p_half(probs, dtype)[0]
        rows.append(torch.einsum("hqk,khd->qhd", tf32(probs), v).to(torch.float64))
    return torch.cat(rows)


def judged(label, spec, out, reqs, per_req, steps):
    """Whether one layer's output of one forward lies within its limit; prints the line that says so."""
    exact_steps = [s for s in steps if s not in ENVELOPE]
    exact = reference(spec, reqs, per_req, torch.float64)
    golden = reference(spec, reqs, per_req, torch.float64, exact_steps)  # under the declared numerics
    envelope = (reference(spec, reqs, per_req, torch.float64, steps) - golden).abs().max().item()         if exact_steps != steps else 0.0
    # The limit: 2x the error of the same computation in the run's dtype (and of the declared steps that round
    # inside the kernel's tiles), plus a floor (as FlashAttention's tests).
    limit = S["ratio"] * ((reference(spec, reqs, per_req, dtype) - exact).abs().max().item() + envelope)         + S["abs_floor"]
    err = (out.double().cpu() - golden).abs().nan_to_num(nan=float("inf")).max().item()
    ok = err <= limit
    print(f"{label}: max error {err:.3g} {'<=' if ok else '>'} limit {limit:.3g}"
          f"{' under ' + ', '.join(steps) if steps else ''}: {'PASS' if ok else 'FAIL'}")
    return ok


failed = False
for b, batch in enumerate(S["batches"]):
    steps = batch["steps"][torch.device(DEVICE).type]
    inputs = draw_inputs(batch["requests"])
    outs = run(batch, inputs)  # per layer, every forward's outputs in order
    parts, done = forwards(batch, inputs), 0
    for f, (reqs, per_layer) in enumerate(parts):
        rows = sum(r["n_new"] for r in reqs)
        step = f", step {f + 1}/{len(parts)}" if len(parts) > 1 else ""
        for i, (spec, out, per_req) in enumerate(zip(S["layers"], outs, per_layer)):
            label = f"batch {b + 1}/{len(S['batches'])} ({batch['name']}{step}) layer {i}"
            failed |= not judged(label, spec, out[done:done + rows], reqs, per_req, steps)
        done += rows
for problem in changed:
    print(f"inputs: {problem}: FAIL")
failed |= bool(changed)
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
