"""The vLLM part of a standalone file: vLLM set up as its engine sets itself up (where there is no
CUDA: Triton's interpreter and vLLM's CPU platform), a config of a weightless model of the run's
heads, vLLM's own Attention layers and the backend's metadata builder, the batch as its
CommonAttentionMetadata, then build and each layer's forward inside set_forward_context; a graph
run: its full decode graphs captured and replayed as vLLM's runner does."""
from __future__ import annotations

from typing import Dict

from kit.repro.file_parts import assemble, cuda_graph_part

HOW = {"eager": ("Builds the batches with vLLM's own classes (VllmConfig, Attention, the backend's metadata builder,\n"
                 "CommonAttentionMetadata) and calls them in the order vLLM's runner does (build, then each layer's\n"
                 "forward inside set_forward_context; the layer writes the new tokens' KV itself)."),
       "graph": ("Builds the batches with vLLM's own classes (VllmConfig, Attention, the backend's metadata builder,\n"
                 "CommonAttentionMetadata) and calls them in the order vLLM's runner does for full decode graphs\n"
                 "(per capture size, largest first, build_for_cudagraph_capture on its dummy batch and the capture\n"
                 "of every layer's forward; per replay the persistent inputs refilled, padded with empty requests,\n"
                 "build, the replay).")}

ENGINE_PART = '''BACKEND = @BACKEND@
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
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

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
CACHE_DTYPE = {None: "auto", torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}[KV_DTYPE]
config = VllmConfig(model_config=model_config, cache_config=CacheConfig(block_size=S["page"], cache_dtype=CACHE_DTYPE),
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
        if spec["k_scale"] is not None:  # an fp8 cache's scales as vLLM's loader sets them, q's taken from k's
            for name, value in (("_k_scale", spec["k_scale"]), ("_v_scale", spec["v_scale"]),
                                ("_q_scale", spec["k_scale"])):
                getattr(layers[-1], name).fill_(value)
                setattr(layers[-1], f"{name}_float", value)
            layers[-1]._k_scale_cpu.fill_(spec["k_scale"])
            layers[-1]._v_scale_cpu.fill_(spec["v_scale"])
    torch.set_default_dtype(default)
    # The KV cache layout as the engine core resolves it from what the backend supports (v1/engine/core.py):
    # FlashInfer's builder and impl read it, and refuse an unresolved one.
    resolve_kv_cache_layout(config, [[layout.name for layout in get_supported_kv_cache_layouts([backend])]],
                            [layers[0].get_kv_cache_spec(config)])
    builder = backend.get_builder_cls()(layers[0].get_kv_cache_spec(config), [a.layer_name for a in layers], config,
                                       torch.device(DEVICE))


# vLLM's physical cache per layer [blocks, block, kv heads, K|V], bound once as the [blocks, kv heads,
# block, 2 * d] view its runner hands (a captured graph reads these tensors); an fp8 cache as bytes, as vLLM
# allocates one.
cache_dtype = KV_DTYPE or dtype
caches = [torch.empty((S["num_blocks"], S["page"], spec["kv_heads"], 2 * spec["head_dim"]), dtype=cache_dtype,
                      device=DEVICE) for spec in S["layers"]]
for attn, cache in zip(layers, caches):
    attn.bind_kv_cache(cache.permute(0, 2, 1, 3).view(torch.uint8) if KV_DTYPE is not None else
                       cache.permute(0, 2, 1, 3))


def load(reqs, inputs):
    """The batch's cached tokens written into each layer's cache as it stores them (an fp8 cache: quantized
    with the layer's scales), NaN where no token is (a read past a request's keys shows)."""
    for spec, cache, per_req in zip(S["layers"], caches, inputs):
        cache.fill_(float("nan"))
        for r, (_, k, v) in zip(reqs, per_req):
            for t, slot in enumerate(r["slots"][:r["n_old"]]):
                cache[slot // S["page"], slot % S["page"]] = torch.cat([
                    quantize(k[t].to(dtype), spec["k_scale"], cache_dtype),
                    quantize(v[t].to(dtype), spec["v_scale"], cache_dtype)], dim=-1)


def common_metadata(cached, new, block_table, slot_mapping, max_query_len, max_seq_len, held=None):
    """vLLM's CommonAttentionMetadata of requests of `cached` + `new` tokens (their pages `block_table`);
    `held`: the runner's persistent query_start_loc and seq_lens buffers, which a graph reads, filled."""
    query_start = torch.tensor([0] + new, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor(cached, dtype=torch.int32) + torch.tensor(new, dtype=torch.int32)
    on_device = [query_start.to(DEVICE), seq_lens.to(DEVICE)]
    if held is not None:
        on_device = [buffer[:len(x)].copy_(x) for buffer, x in zip(held, on_device)]
    return CommonAttentionMetadata(
        query_start_loc=on_device[0], query_start_loc_cpu=query_start, seq_lens=on_device[1],
        num_reqs=len(new), num_actual_tokens=slot_mapping.shape[0], max_query_len=max_query_len,
        max_seq_len=max_seq_len, block_table_tensor=block_table, slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=seq_lens)


def block_table_of(reqs, rows):
    """Each request's pages, then block 0 (past its pages, and for padded rows up to `rows`)."""
    table = torch.zeros(rows, -(-S["max_model_len"] // S["page"]), dtype=torch.int32)
    for i, r in enumerate(reqs):
        table[i, :len(r["pages"])] = torch.tensor(r["pages"], dtype=torch.int32)
    return table.to(DEVICE)


def forward(metadata, slot_mapping, qkv):
    """Each layer's forward inside set_forward_context, on `qkv` (per layer: q, k, v of the step's tokens)."""
    names = [a.layer_name for a in layers]
    outs = []
    with set_forward_context({n: metadata for n in names}, config, slot_mapping={n: slot_mapping for n in names}):
        for spec, attn, (q, k, v) in zip(S["layers"], layers, qkv):
            t = q.shape[0]
            outs.append(attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)).view(t, spec["heads"],
                                                                                        spec["head_dim"]))
    return outs
'''

EAGER = '''

def run(batch, inputs):
    """One eager step, as vLLM's runner makes it: the builder's build, then each layer's forward (the layer
    writes the new tokens' KV itself)."""
    reqs = batch["requests"]
    load(reqs, inputs)
    slot_mapping = torch.tensor([s for r in reqs for s in r["slots"][r["n_old"]:]], dtype=torch.int64, device=DEVICE)
    new = [r["n_new"] for r in reqs]
    common = common_metadata([r["n_old"] for r in reqs], new, block_table_of(reqs, len(reqs)), slot_mapping,
                             max(new), max(r["n_old"] + r["n_new"] for r in reqs))
    metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
    qkv = [[new_tokens(reqs, per_req, which) for which in range(3)] for per_req in inputs]
    return handed(lambda: forward(metadata, slot_mapping, qkv), qkv)
'''
# vLLM's full decode graphs as its runner captures and replays them (v1/worker/gpu/cudagraph_utils.py): a
# graph per capture size, captured on its dummy batch (InputBatch.make_dummy: one token a request, nothing
# cached, the null block) built with build_for_cudagraph_capture and the host maxima of the worst replay;
# a replay's padded requests are empty (no query token, seq_len 0) and its padded tokens write no KV (-1).
GRAPH = '''
CAPTURE_SIZES = @BATCH_SIZES@  # vLLM's default capture sizes
BUCKETS = sorted({min(n for n in CAPTURE_SIZES if n >= len(b["requests"])) for b in S["batches"]}, reverse=True)
MAX_BS = BUCKETS[0]
NO_WRITE = -1  # a padded token's slot: vLLM's KV writer skips it
# The runner's persistent inputs, for the largest graph; a graph reads them at every replay.
slot_mapping = torch.full((MAX_BS,), NO_WRITE, dtype=torch.int64, device=DEVICE)
block_table = block_table_of([], MAX_BS)
held = (torch.zeros(MAX_BS + 1, dtype=torch.int32, device=DEVICE), torch.zeros(MAX_BS, dtype=torch.int32, device=DEVICE))
static_qkv = [[torch.zeros(MAX_BS, heads, spec["head_dim"], dtype=dtype, device=DEVICE)
               for heads in (spec["heads"], spec["kv_heads"], spec["kv_heads"])] for spec in S["layers"]]
graphs = {}  # bucket -> (the metadata captured, the graph, its outputs); no graph without CUDA


def program(metadata, bs):
    return forward(metadata, slot_mapping[:bs], [[x[:bs] for x in qkv] for qkv in static_qkv])


def capture(bs):
    slot_mapping[:bs].fill_(NO_WRITE)
    block_table[:bs].zero_()
    common = common_metadata([0] * bs, [1] * bs, block_table[:bs], slot_mapping[:bs], 1, S["max_model_len"], held)
    metadata = builder.build_for_cudagraph_capture(common)
    if DEVICE != "cuda":  # no graph: a replay runs the program again with the metadata captured
        program(metadata, bs)
        graphs[bs] = (metadata, None, None)
        return
    graphs[bs] = (metadata, *cuda_graph(lambda: program(metadata, bs)))


for bucket in BUCKETS:  # largest first, as vLLM captures
    capture(bucket)


def prepare_replay(reqs, pbs):
    """The batch's slots, pages and lengths in the persistent inputs, padded to `pbs` rows, then the build."""
    bs = len(reqs)
    slot_mapping[:bs] = torch.tensor([r["slots"][-1] for r in reqs], dtype=torch.int64)
    slot_mapping[bs:pbs] = NO_WRITE
    block_table[:pbs] = block_table_of(reqs, pbs)
    pad = [0] * (pbs - bs)
    common = common_metadata([r["n_old"] for r in reqs] + pad, [1] * bs + pad, block_table[:pbs],
                             slot_mapping[:pbs], 1, max(r["n_old"] + 1 for r in reqs), held)
    builder.build(common_prefix_len=0, common_attn_metadata=common)


def run(batch, inputs):
    """One replay: the batch's tokens, slots and pages copied into the persistent inputs, padded to the
    graph's size with empty requests, the builder's build over them (its metadata buffers), the replay."""
    reqs = batch["requests"]
    load(reqs, inputs)
    bs = len(reqs)
    pbs = min(n for n in BUCKETS if n >= bs)
    for qkv, per_req in zip(static_qkv, inputs):
        for which, x in enumerate(qkv):
            x[:bs] = new_tokens(reqs, per_req, which)
            x[bs:pbs] = 0
    prepare_replay(reqs, pbs)
    captured, graph, outs = graphs[pbs]
    if graph is not None:
        graph.replay()
        return [out[:bs] for out in outs]
    return [out[:bs] for out in program(captured, pbs)]
'''


def render(scenario: Dict, backend_cls, exec_: str) -> str:
    """The file's text for a run of `backend_cls` (its vLLM backend enum name) on `scenario`."""
    from kit.repro.scenario import NotReproducible

    if scenario["layers"][0]["rank"]:
        raise NotReproducible(f"MLA runs of vLLM backends ({scenario['case']}): standalone files reproduce vLLM's "
                              f"dense attention only (its MLA layer and latent cache not yet)")
    if exec_ == "eager":
        run = EAGER
    elif {b["mode"] for b in scenario["batches"]} == {"decode"}:
        run = cuda_graph_part(backend_cls.profile) + GRAPH.replace("@BATCH_SIZES@", repr(backend_cls.profile.batch_sizes))
    else:
        raise NotReproducible(f"{exec_} runs of vLLM backends in {scenario['mode']}: standalone files reproduce "
                              f"decode graphs only (its mixed-batch graphs not yet); give the eager run's id")
    return assemble(scenario, "vLLM", backend_cls.vllm_backend, exec_, HOW[exec_],
                    ENGINE_PART.replace("@BACKEND@", repr(backend_cls.vllm_backend)) + run)
