"""Standalone repro: SGLang triton, decode eager, case mha_bs1_window_p64_inter (attention conformance kit).
Imports only torch and SGLang.
Builds the batch with SGLang's own classes (ReqToTokenPool, MHATokenToKVPool, KVIndexTranslator,
the backend, RadixAttention, ForwardBatch) and calls them in the order its model runner does
(init_forward_metadata, then each layer's forward inside forward_context; the layer writes the new
tokens' KV itself).
Each layer's output is judged against an inline float64 reference: the error against the limit,
PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
import json, logging, os, sys, tempfile

import torch

SCENARIO = {'abs_floor': 0.0001,
 'case': 'mha_bs1_window_p64_inter',
 'dtype': 'float32',
 'layers': [{'cap': 0.0, 'head_dim': 64, 'heads': 2, 'kv_heads': 2, 'scale': 0.125, 'sinks': [], 'window': 8},
            {'cap': 0.0, 'head_dim': 64, 'heads': 2, 'kv_heads': 2, 'scale': 0.125, 'sinks': [], 'window': 8}],
 'max_model_len': 151,
 'max_num_seqs': 4,
 'mode': 'decode',
 'num_blocks': 512,
 'num_slots': 512,
 'page': 64,
 'ratio': 2.0,
 'requests': [{'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                           26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48,
                           49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70],
               'n_new': 1,
               'n_old': 70,
               'pages': [1, 2],
               'q_pos': [70],
               'row': 1,
               'seq_len': 71,
               'slots': [64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87,
                         88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108,
                         109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127,
                         128, 129, 130, 131, 132, 133, 134],
               'visible': ['11111111111111111111111111111111111111111111111111111111111111111111111']}],
 'seed': 3483896280}
S, L0, reqs = SCENARIO, SCENARIO["layers"][0], SCENARIO["requests"]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, S["dtype"])
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's Triton kernels in Triton's interpreter

# Per layer and request: q of its new tokens, K and V of all its tokens (cached, then new), drawn in
# float64 from the seed and rounded to the run's dtype (the reference reads the values the engine gets).
gen = torch.Generator().manual_seed(S["seed"])
inputs = []
for spec in S["layers"]:
    per_req = []
    for r in reqs:
        q = torch.randn(r["n_new"], spec["heads"], spec["head_dim"], generator=gen, dtype=torch.float64)
        k, v = (torch.randn(r["n_old"] + r["n_new"], spec["kv_heads"], spec["head_dim"], generator=gen,
                            dtype=torch.float64) for _ in "kv")
        per_req.append(tuple(x.to(dtype).to(torch.float64) for x in (q, k, v)))
    inputs.append(per_req)


def new_tokens(per_req, which):
    """The step's new tokens of input `which` (0 q, 1 k, 2 v), request after request, as the engine takes them."""
    return torch.cat([x[which][r["n_old"]:] if which else x[0] for x, r in zip(per_req, reqs)]).to(dtype).to(DEVICE)

import importlib.abc, importlib.machinery, importlib.util, types

BACKEND, MODE = 'triton', 'decode'
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
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend as AttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from transformers import PretrainedConfig

get_parallel().override_permanently(attn_tp_size=1, attn_dcp_rank=0)  # one process, no torch.distributed
no_graphs = PhaseConfig(backend=Backend.DISABLED)
get_context().override_server_args(
    attention_backend=BACKEND, page_size=S["page"], chunked_prefill_size=-1, dp_size=1, tp_size=1, pp_size=1,
    cuda_graph_config=CudaGraphConfig(decode=no_graphs, prefill=no_graphs), enable_deterministic_inference=False,
    kv_cache_dtype="auto", speculative_algorithm=None, device=DEVICE).install()


class ModelConfig:  # the fields of a dense model's config SGLang's attention backends read
    attention_arch = AttentionArch.MHA
    context_len = S["max_model_len"]
    num_attention_heads, num_key_value_heads = L0["heads"], L0["kv_heads"]
    head_dim = v_head_dim = swa_v_head_dim = L0["head_dim"]
    is_encoder_decoder = is_multimodal = False
    hf_config = hf_text_config = PretrainedConfig(architectures=["StandInForCausalLM"])
    linear_attn_registry_result = None

    def get_max_num_attention_heads(self):
        return self.num_attention_heads

    def get_num_kv_heads(self, tensor_parallel_size, dcp_size=1):
        return self.num_key_value_heads // (tensor_parallel_size // dcp_size)


class ModelRunner:  # the attributes of SGLang's ModelRunner its attention backends read
    device, gpu_id, dtype, kv_cache_dtype, page_size = DEVICE, 0, dtype, dtype, S["page"]
    model_config = ModelConfig()
    use_mla_backend = is_draft_worker = False
    windows = [spec["window"] for spec in S["layers"] if spec["window"] >= 0]
    sliding_window_size = max(windows) if windows else None
    spec_algorithm = SpeculativeAlgorithm.NONE
    prefill_attention_backend_str = decode_attention_backend_str = BACKEND
    server_args = get_context().server_args
    req_to_token_pool = ReqToTokenPool(S["max_num_seqs"], S["max_model_len"], DEVICE, enable_memory_saver=False)
    token_to_kv_pool = MHATokenToKVPool(S["num_slots"], S["page"], dtype, L0["kv_heads"], L0["head_dim"],
                                        len(S["layers"]), DEVICE, enable_memory_saver=False)
    token_to_kv_pool_allocator = TokenToKVPoolAllocator(S["num_slots"], dtype, DEVICE, token_to_kv_pool, False)
    kv_index_translator = KVIndexTranslator(
        req_to_token=req_to_token_pool.req_to_token, token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        token_to_kv_pool=token_to_kv_pool, page_size=S["page"], device=DEVICE)

    def decode_num_tokens_per_req(self, num_draft_tokens=None):
        return 1


runner = ModelRunner()
backend = AttnBackend(runner)
if getattr(backend, "device_core_count", 1) <= 0:  # no SMs without CUDA: an H100's count keeps its KV split planner
    backend.device_core_count = 132
pool = runner.token_to_kv_pool
for i, (spec, per_req) in enumerate(zip(S["layers"], inputs)):
    # NaN in every slot no request's cached token holds (a read past a request's keys shows).
    pool.k_buffer[i].fill_(float("nan"))
    pool.v_buffer[i].fill_(float("nan"))
    for r, (_, k, v) in zip(reqs, per_req):
        slots = torch.tensor(r["slots"][:r["n_old"]], dtype=torch.int64, device=DEVICE)
        pool.k_buffer[i][slots] = k[:r["n_old"]].to(dtype).to(DEVICE)
        pool.v_buffer[i][slots] = v[:r["n_old"]].to(dtype).to(DEVICE)
for r in reqs:
    runner.req_to_token_pool.req_to_token[r["row"], :len(r["slots"])] = torch.tensor(r["slots"], dtype=torch.int32)
layers = [RadixAttention(num_heads=spec["heads"], head_dim=spec["head_dim"], scaling=spec["scale"],
                         num_kv_heads=spec["kv_heads"], layer_id=i, logit_cap=spec["cap"],
                         sliding_window_size=spec["window"], v_head_dim=spec["head_dim"])
          for i, spec in enumerate(S["layers"])]


def device_ints(values, dtype_):
    return torch.tensor(values, dtype=dtype_, device=DEVICE)


new_lens, old_lens = [r["n_new"] for r in reqs], [r["n_old"] for r in reqs]
seq_lens = [r["seq_len"] for r in reqs]
extend = MODE != "decode"
fields = dict(
    forward_mode={"decode": ForwardMode.DECODE, "extend": ForwardMode.EXTEND, "mixed": ForwardMode.MIXED}[MODE],
    batch_size=len(reqs), input_ids=None, req_pool_indices=device_ints([r["row"] for r in reqs], torch.int32),
    seq_lens=device_ints(seq_lens, torch.int32), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
    seq_lens_sum=sum(seq_lens),
    out_cache_loc=device_ints([s for r in reqs for s in r["slots"][r["n_old"]:]], torch.int64),
    positions=device_ints([p for r in reqs for p in r["q_pos"]], torch.int64), spec_info=None)
if extend:
    fields.update(extend_num_tokens=sum(new_lens), extend_seq_lens=device_ints(new_lens, torch.int32),
                  extend_prefix_lens=device_ints(old_lens, torch.int32),
                  extend_start_loc=device_ints([sum(new_lens[:i]) for i in range(len(reqs))], torch.int32),
                  extend_seq_lens_cpu=new_lens, extend_prefix_lens_cpu=old_lens,
                  global_num_token_non_padded_cpu=sum(new_lens))


def forward_batch():
    """A new ForwardBatch of the step bound to its KV location plan, as the model runner makes one."""
    fb = ForwardBatch(**fields)
    runner.kv_index_translator.bind_own_plan(fb)
    return fb


backend.init_forward_metadata(forward_batch())
outs = []
with forward_context(ForwardContext(attn_backend=backend)):
    for spec, attn, per_req in zip(S["layers"], layers, inputs):
        q, k, v = (new_tokens(per_req, which) for which in range(3))
        t = q.shape[0]
        sinks = {"sinks": torch.tensor(spec["sinks"], dtype=torch.bfloat16, device=DEVICE)} if spec["sinks"] else {}
        outs.append(attn(q.reshape(t, -1), k, v, forward_batch(), **sinks).view(t, spec["heads"], spec["head_dim"]))


def reference(spec, per_req, precision):
    """Attention of every new token over its request's visible keys, computed in `precision`."""
    rows = []
    for r, (q, k, v) in zip(reqs, per_req):
        q, k, v = q.to(precision), k.to(precision), v.to(precision)
        group = spec["heads"] // spec["kv_heads"]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * spec["scale"]
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
        rows.append(torch.einsum("hqk,khd->qhd", probs, v).to(torch.float64))
    return torch.cat(rows)


failed = False
for i, (spec, out, per_req) in enumerate(zip(S["layers"], outs, inputs)):
    golden = reference(spec, per_req, torch.float64)
    # The limit: 2x the error of the same computation in the run's dtype, plus a floor (as FlashAttention's tests).
    limit = S["ratio"] * (reference(spec, per_req, dtype) - golden).abs().max().item() + S["abs_floor"]
    err = (out.double().cpu() - golden).abs().nan_to_num(nan=float("inf")).max().item()
    ok = err <= limit
    failed |= not ok
    print(f"layer {i}: max error {err:.3g} {'<=' if ok else '>'} limit {limit:.3g}: {'PASS' if ok else 'FAIL'}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
