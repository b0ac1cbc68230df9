"""The standalone file of a vLLM backend's run: TEMPLATE, with the run's scenario (kit.repro.scenario)
written in as a literal. The file imports torch and vLLM only."""
from __future__ import annotations

import pprint
from typing import Dict

TEMPLATE = '''"""Standalone repro: vLLM {backend}, {mode} {exec_}, case {case} (attention conformance kit).
Imports only torch and vLLM. Builds the batch with vLLM's own classes (VllmConfig, Attention,
the backend's metadata builder, CommonAttentionMetadata), calls them in the order vLLM's runner does
(build, then each layer's forward inside set_forward_context), and judges each layer's output
against an inline float64 reference: error against limit, PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
import json, logging, os, sys, tempfile

import torch

SCENARIO = {scenario}
BACKEND = {backend!r}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # vLLM's Triton kernels in Triton's interpreter, vLLM's CPU platform
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vLLM keeps real Triton (not its placeholder) without a driver
    import vllm.triton_utils  # noqa: F401
    del os.environ["CUDA_VISIBLE_DEVICES"]
    _capability = torch.cuda.get_device_capability  # its KV writer asks for a tile size; CPU torch refuses
    torch.cuda.get_device_capability = lambda device=None: (9, 0) if device is None or torch.device(device).type != "cuda" else _capability(device)
logging.getLogger("vllm").setLevel(logging.ERROR)

from vllm.config import CacheConfig, CompilationConfig, ModelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config
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


class StandIn(torch.nn.Module):  # what the model registry inspects of a model class; never built
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


ModelRegistry.register_model("StandInForCausalLM", StandIn)
S, L0 = SCENARIO, SCENARIO["layers"][0]
dtype = getattr(torch, S["dtype"])
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(dict(architectures=["StandInForCausalLM"], model_type="llama", hidden_size=L0["heads"] * L0["head_dim"],
                   num_hidden_layers=len(S["layers"]), num_attention_heads=L0["heads"], num_key_value_heads=L0["kv_heads"],
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
config.cache_config.block_size = S["page"]
backend = AttentionBackendEnum[BACKEND].get_class()

# The batch: each request's cached tokens (in its pages) and new tokens, inputs drawn from the seed.
gen = torch.Generator().manual_seed(S["seed"])
reqs = S["requests"]
query_start = [0]
for r in reqs:
    query_start.append(query_start[-1] + r["n_new"])
slot_mapping = torch.tensor([s for r in reqs for s in r["slots"][r["n_old"]:]], dtype=torch.int64, device=DEVICE)
layers, caches, inputs = [], [], []
with set_current_vllm_config(config):
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    for i, spec in enumerate(S["layers"]):
        extra = {{"sinks": torch.tensor(spec["sinks"], dtype=dtype, device=DEVICE)}} if spec["sinks"] else {{}}
        # vLLM's window counts the query's own key: a query at p seeing keys p-W..p is a window of W + 1.
        layers.append(Attention(spec["heads"], spec["head_dim"], spec["scale"], num_kv_heads=spec["kv_heads"],
                                cache_config=config.cache_config, logits_soft_cap=spec["cap"] or None,
                                per_layer_sliding_window=spec["window"] + 1 if spec["window"] >= 0 else None,
                                prefix=f"model.layers.{{i}}.self_attn.attn", attn_backend=backend, **extra).to(DEVICE))
    torch.set_default_dtype(default)
    kv_spec = layers[0].get_kv_cache_spec(config)
    builder = backend.get_builder_cls()(kv_spec, [a.layer_name for a in layers], config, torch.device(DEVICE))
for i, (spec, attn) in enumerate(zip(S["layers"], layers)):
    h, hkv, d = spec["heads"], spec["kv_heads"], spec["head_dim"]
    # vLLM's physical cache [blocks, block, kv heads, K|V], NaN where no token is (a read past a
    # request's keys shows); bound as the [blocks, kv heads, block, 2 * d] view its runner hands.
    cache = torch.full((S["num_blocks"], S["page"], hkv, 2 * d), float("nan"), dtype=dtype, device=DEVICE)
    per_req = []
    for r in reqs:
        q = torch.randn(r["n_new"], h, d, generator=gen, dtype=torch.float64)
        k = torch.randn(r["n_old"] + r["n_new"], hkv, d, generator=gen, dtype=torch.float64)
        v = torch.randn(r["n_old"] + r["n_new"], hkv, d, generator=gen, dtype=torch.float64)
        q, k, v = (x.to(dtype).to(torch.float64) for x in (q, k, v))  # the values as the dtype holds them
        for t, slot in enumerate(r["slots"][:r["n_old"]]):
            cache[slot // S["page"], slot % S["page"], :, :d] = k[t].to(dtype)
            cache[slot // S["page"], slot % S["page"], :, d:] = v[t].to(dtype)
        per_req.append((q, k, v))
    attn.bind_kv_cache(cache.permute(0, 2, 1, 3))
    caches.append(cache)
    inputs.append(per_req)

qsl = torch.tensor(query_start, dtype=torch.int32)
seq_lens = torch.tensor([r["n_old"] + r["n_new"] for r in reqs], dtype=torch.int32)
common = CommonAttentionMetadata(
    query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl, seq_lens=seq_lens.to(DEVICE), num_reqs=len(reqs),
    num_actual_tokens=slot_mapping.shape[0], max_query_len=max(r["n_new"] for r in reqs),
    max_seq_len=int(seq_lens.max()), block_table_tensor=torch.tensor(S["block_table"], dtype=torch.int32, device=DEVICE),
    slot_mapping=slot_mapping, seq_lens_cpu_upper_bound=seq_lens)
metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
names = [a.layer_name for a in layers]
outs = []
with set_forward_context({{n: metadata for n in names}}, config, slot_mapping={{n: slot_mapping for n in names}}):
    for spec, attn, per_req in zip(S["layers"], layers, inputs):
        t = slot_mapping.shape[0]
        q = torch.cat([x[0] for x in per_req]).to(dtype).to(DEVICE)
        k = torch.cat([x[1][r["n_old"]:] for x, r in zip(per_req, reqs)]).to(dtype).to(DEVICE)
        v = torch.cat([x[2][r["n_old"]:] for x, r in zip(per_req, reqs)]).to(dtype).to(DEVICE)
        outs.append(attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)).view(t, spec["heads"], spec["head_dim"]))


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
        if spec["window"] >= 0:
            qp, kp = torch.tensor(r["q_pos"])[:, None], torch.tensor(r["key_pos"])[None, :]
            seen &= (kp >= qp - spec["window"]) & (kp <= qp)
        scores = scores.masked_fill(~seen, float("-inf"))
        if spec["sinks"]:
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
    print(f"layer {{i}}: max error {{err:.3g}} {{'<=' if ok else '>'}} limit {{limit:.3g}}: {{'PASS' if ok else 'FAIL'}}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
'''

def render(scenario: Dict, backend_cls, exec_: str) -> str:
    """The file's text for a run of `backend_cls` (its vLLM backend enum name) on `scenario`."""
    return TEMPLATE.format(scenario=pprint.pformat(scenario, width=120, compact=True), backend=backend_cls.vllm_backend,
                           mode=scenario["mode"], exec_=exec_, case=scenario["case"])
