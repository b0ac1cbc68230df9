"""Standalone repro: vLLM FLEX_ATTENTION, decode eager, case mha_bs1_window_p64_inter (attention conformance kit).
Imports only torch and vLLM.
Builds the batch with vLLM's own classes (VllmConfig, Attention, the backend's metadata builder,
CommonAttentionMetadata) and calls them in the order vLLM's runner does (build, then each layer's
forward inside set_forward_context; the layer writes the new tokens' KV itself).
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
 'num_blocks': 8,
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

BACKEND = 'FLEX_ATTENTION'
if DEVICE == "cpu":  # vLLM's CPU platform
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vLLM keeps real Triton (not its placeholder) without a driver
    import vllm.triton_utils  # noqa: F401
    del os.environ["CUDA_VISIBLE_DEVICES"]
    _capability = torch.cuda.get_device_capability  # its KV writer asks it a tile size; CPU torch refuses
    torch.cuda.get_device_capability = lambda device=None: (
        (9, 0) if device is None or torch.device(device).type != "cuda" else _capability(device))
logging.getLogger("vllm").setLevel(logging.ERROR)

from vllm.config import (CacheConfig, CompilationConfig, ModelConfig, SchedulerConfig, VllmConfig,
                         set_current_vllm_config)
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.registry import ModelRegistry
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.registry import AttentionBackendEnum

if DEVICE == "cpu" and not hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash"):
    # vLLM's compiled ops do not load without CUDA: its own Triton KV writer under the op's name.
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash
    LIB = torch.library.Library("_C_cache_ops", "FRAGMENT")
    LIB.define("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
               "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()")
    LIB.impl("reshape_and_cache_flash", triton_reshape_and_cache_flash, "CompositeExplicitAutograd")


class StandIn(torch.nn.Module):
    """The methods vLLM's model registry looks for in a text-generation model class; never built."""
    def __init__(self, *, vllm_config, prefix=""): super().__init__()  # noqa: E704
    def embed_input_ids(self, input_ids): ...  # noqa: E704
    def forward(self, input_ids, positions): ...  # noqa: E704
    def compute_logits(self, hidden_states): ...  # noqa: E704


ModelRegistry.register_model("StandInForCausalLM", StandIn)
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(dict(architectures=["StandInForCausalLM"], model_type="llama", hidden_size=L0["heads"] * L0["head_dim"],
                   num_hidden_layers=len(S["layers"]), num_attention_heads=L0["heads"],
                   num_key_value_heads=L0["kv_heads"],
                   head_dim=L0["head_dim"], vocab_size=128, intermediate_size=128,
                   max_position_embeddings=S["max_model_len"], torch_dtype=S["dtype"]), f)
model_config = ModelConfig(model=folder, tokenizer=folder, skip_tokenizer_init=True, dtype=dtype,
                           max_model_len=S["max_model_len"])
tokens = max(S["max_model_len"], S["max_num_seqs"], S["num_blocks"] * S["page"], 512)
config = VllmConfig(model_config=model_config, cache_config=CacheConfig(block_size=S["page"], cache_dtype="auto"),
                    scheduler_config=SchedulerConfig(max_model_len=S["max_model_len"], max_num_seqs=S["max_num_seqs"],
                                                     max_num_batched_tokens=tokens, is_encoder_decoder=False),
                    compilation_config=CompilationConfig(max_cudagraph_capture_size=512))
config.cache_config.num_gpu_blocks = S["num_blocks"]
config.cache_config.block_size = S["page"]  # vLLM's CPU platform would set its own
backend = AttentionBackendEnum[BACKEND].get_class()

layers = []
with set_current_vllm_config(config):
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # vLLM's layers take the activation dtype from it
    for i, spec in enumerate(S["layers"]):
        extra = {"sinks": torch.tensor(spec["sinks"], dtype=dtype, device=DEVICE)} if spec["sinks"] else {}
        # vLLM's window counts the query's own key: a query at p seeing keys p-W..p is a window of W + 1.
        layers.append(Attention(spec["heads"], spec["head_dim"], spec["scale"], num_kv_heads=spec["kv_heads"],
                                cache_config=config.cache_config, logits_soft_cap=spec["cap"] or None,
                                per_layer_sliding_window=spec["window"] + 1 if spec["window"] >= 0 else None,
                                prefix=f"model.layers.{i}.self_attn.attn", attn_backend=backend, **extra).to(DEVICE))
    torch.set_default_dtype(default)
    builder = backend.get_builder_cls()(layers[0].get_kv_cache_spec(config), [a.layer_name for a in layers], config,
                                       torch.device(DEVICE))
for spec, attn, per_req in zip(S["layers"], layers, inputs):
    d = spec["head_dim"]
    # vLLM's physical cache [blocks, block, kv heads, K|V], NaN where no token is (a read past a
    # request's keys shows), bound as the [blocks, kv heads, block, 2 * d] view its runner hands.
    cache = torch.full((S["num_blocks"], S["page"], spec["kv_heads"], 2 * d), float("nan"), dtype=dtype, device=DEVICE)
    for r, (_, k, v) in zip(reqs, per_req):
        for t, slot in enumerate(r["slots"][:r["n_old"]]):
            cache[slot // S["page"], slot % S["page"]] = torch.cat([k[t], v[t]], dim=-1).to(dtype)
    attn.bind_kv_cache(cache.permute(0, 2, 1, 3))

query_start = torch.tensor([0] + [r["n_new"] for r in reqs], dtype=torch.int32).cumsum(0, dtype=torch.int32)
seq_lens = torch.tensor([r["n_old"] + r["n_new"] for r in reqs], dtype=torch.int32)
block_table = torch.zeros(len(reqs), -(-S["max_model_len"] // S["page"]), dtype=torch.int32)  # past its pages: block 0
for i, r in enumerate(reqs):
    block_table[i, :len(r["pages"])] = torch.tensor(r["pages"], dtype=torch.int32)
slot_mapping = torch.tensor([s for r in reqs for s in r["slots"][r["n_old"]:]], dtype=torch.int64, device=DEVICE)
common = CommonAttentionMetadata(
    query_start_loc=query_start.to(DEVICE), query_start_loc_cpu=query_start, seq_lens=seq_lens.to(DEVICE),
    num_reqs=len(reqs), num_actual_tokens=slot_mapping.shape[0], max_query_len=max(r["n_new"] for r in reqs),
    max_seq_len=int(seq_lens.max()), block_table_tensor=block_table.to(DEVICE),
    slot_mapping=slot_mapping, seq_lens_cpu_upper_bound=seq_lens)
metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
names = [a.layer_name for a in layers]
outs = []
with set_forward_context({n: metadata for n in names}, config, slot_mapping={n: slot_mapping for n in names}):
    for spec, attn, per_req in zip(S["layers"], layers, inputs):
        t = slot_mapping.shape[0]
        q, k, v = (new_tokens(per_req, which).reshape(t, -1) for which in range(3))
        outs.append(attn(q, k, v).view(t, spec["heads"], spec["head_dim"]))


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
