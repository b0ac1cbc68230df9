"""Standalone repro: vLLM FLEX_ATTENTION, mixed eager, case gqa32_scale_fp16_p16_shuf (attention conformance kit).
Imports only torch and vLLM.
Builds the batches with vLLM's own classes (VllmConfig, Attention, the backend's metadata builder,
CommonAttentionMetadata) and calls them in the order vLLM's runner does (build, then each layer's
forward inside set_forward_context; the layer writes the new tokens' KV itself).
The run vllm_flex_attention-mixed-eager-gqa32_scale_fp16_p16_shuf as recorded (--no-shrink).
Each layer's output is judged against an inline float64 reference: the error against the limit,
PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
import json, logging, os, sys, tempfile

import torch

SCENARIO = {'abs_floor': 0.002,
 'batches': [{'mode': 'mixed',
              'name': 'gqa32_scale_fp16_p16_shuf~step8',
              'requests': [{'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
                                        41],
                            'n_new': 1,
                            'n_old': 41,
                            'pages': [25, 8, 16],
                            'q_pos': [41],
                            'row': 10,
                            'seq_len': 42,
                            'slots': [400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415,
                                      128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143,
                                      256, 257, 258, 259, 260, 261, 262, 263, 264, 265],
                            'visible': ['111111111111111111111111111111111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27],
                            'n_new': 1,
                            'n_old': 27,
                            'pages': [7, 13],
                            'q_pos': [27],
                            'row': 11,
                            'seq_len': 28,
                            'slots': [112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127,
                                      208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219],
                            'visible': ['1111111111111111111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                        42, 43, 44, 45, 46],
                            'n_new': 9,
                            'n_old': 38,
                            'pages': [14, 9, 26],
                            'q_pos': [38, 39, 40, 41, 42, 43, 44, 45, 46],
                            'row': 6,
                            'seq_len': 47,
                            'slots': [224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
                                      144, 145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159,
                                      416, 417, 418, 419, 420, 421, 422, 423, 424, 425, 426, 427, 428, 429, 430],
                            'visible': ['11111111111111111111111111111111111111100000000',
                                        '11111111111111111111111111111111111111110000000',
                                        '11111111111111111111111111111111111111111000000',
                                        '11111111111111111111111111111111111111111100000',
                                        '11111111111111111111111111111111111111111110000',
                                        '11111111111111111111111111111111111111111111000',
                                        '11111111111111111111111111111111111111111111100',
                                        '11111111111111111111111111111111111111111111110',
                                        '11111111111111111111111111111111111111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24],
                            'n_new': 9,
                            'n_old': 16,
                            'pages': [10, 23],
                            'q_pos': [16, 17, 18, 19, 20, 21, 22, 23, 24],
                            'row': 9,
                            'seq_len': 25,
                            'slots': [160, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 173, 174, 175,
                                      368, 369, 370, 371, 372, 373, 374, 375, 376],
                            'visible': ['1111111111111111100000000', '1111111111111111110000000',
                                        '1111111111111111111000000', '1111111111111111111100000',
                                        '1111111111111111111110000', '1111111111111111111111000',
                                        '1111111111111111111111100', '1111111111111111111111110',
                                        '1111111111111111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                        42, 43, 44, 45],
                            'n_new': 9,
                            'n_old': 37,
                            'pages': [19, 17, 3],
                            'q_pos': [37, 38, 39, 40, 41, 42, 43, 44, 45],
                            'row': 1,
                            'seq_len': 46,
                            'slots': [304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319,
                                      272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
                                      48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61],
                            'visible': ['1111111111111111111111111111111111111100000000',
                                        '1111111111111111111111111111111111111110000000',
                                        '1111111111111111111111111111111111111111000000',
                                        '1111111111111111111111111111111111111111100000',
                                        '1111111111111111111111111111111111111111110000',
                                        '1111111111111111111111111111111111111111111000',
                                        '1111111111111111111111111111111111111111111100',
                                        '1111111111111111111111111111111111111111111110',
                                        '1111111111111111111111111111111111111111111111']}]},
             {'mode': 'mixed',
              'name': 'gqa32_scale_fp16_p16_shuf~step9',
              'requests': [{'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
                            'n_new': 1,
                            'n_old': 13,
                            'pages': [1],
                            'q_pos': [13],
                            'row': 4,
                            'seq_len': 14,
                            'slots': [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
                            'visible': ['11111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                        42, 43],
                            'n_new': 1,
                            'n_old': 43,
                            'pages': [4, 6, 9],
                            'q_pos': [43],
                            'row': 1,
                            'seq_len': 44,
                            'slots': [64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 96, 97, 98, 99,
                                      100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 144, 145, 146, 147,
                                      148, 149, 150, 151, 152, 153, 154, 155],
                            'visible': ['11111111111111111111111111111111111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                        42],
                            'n_new': 9,
                            'n_old': 34,
                            'pages': [5, 15, 7],
                            'q_pos': [34, 35, 36, 37, 38, 39, 40, 41, 42],
                            'row': 7,
                            'seq_len': 43,
                            'slots': [80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 240, 241, 242,
                                      243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255, 112, 113, 114,
                                      115, 116, 117, 118, 119, 120, 121, 122],
                            'visible': ['1111111111111111111111111111111111100000000',
                                        '1111111111111111111111111111111111110000000',
                                        '1111111111111111111111111111111111111000000',
                                        '1111111111111111111111111111111111111100000',
                                        '1111111111111111111111111111111111111110000',
                                        '1111111111111111111111111111111111111111000',
                                        '1111111111111111111111111111111111111111100',
                                        '1111111111111111111111111111111111111111110',
                                        '1111111111111111111111111111111111111111111']}]},
             {'mode': 'mixed',
              'name': 'gqa32_scale_fp16_p16_shuf',
              'requests': [{'key_pos': [0, 1, 2, 3, 4, 5],
                            'n_new': 1,
                            'n_old': 5,
                            'pages': [1],
                            'q_pos': [5],
                            'row': 6,
                            'seq_len': 6,
                            'slots': [16, 17, 18, 19, 20, 21],
                            'visible': ['111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],
                            'n_new': 1,
                            'n_old': 18,
                            'pages': [11, 7],
                            'q_pos': [18],
                            'row': 4,
                            'seq_len': 19,
                            'slots': [176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
                                      112, 113, 114],
                            'visible': ['1111111111111111111']},
                           {'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24],
                            'n_new': 9,
                            'n_old': 16,
                            'pages': [3, 2],
                            'q_pos': [16, 17, 18, 19, 20, 21, 22, 23, 24],
                            'row': 3,
                            'seq_len': 25,
                            'slots': [48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 32, 33, 34, 35,
                                      36, 37, 38, 39, 40],
                            'visible': ['1111111111111111100000000', '1111111111111111110000000',
                                        '1111111111111111111000000', '1111111111111111111100000',
                                        '1111111111111111111110000', '1111111111111111111111000',
                                        '1111111111111111111111100', '1111111111111111111111110',
                                        '1111111111111111111111111']}]},
             {'mode': 'extend',
              'name': 'gqa32_scale_fp16_p16_shuf~step10',
              'requests': [{'key_pos': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24],
                            'n_new': 9,
                            'n_old': 16,
                            'pages': [3, 5],
                            'q_pos': [16, 17, 18, 19, 20, 21, 22, 23, 24],
                            'row': 2,
                            'seq_len': 25,
                            'slots': [48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 80, 81, 82, 83,
                                      84, 85, 86, 87, 88],
                            'visible': ['1111111111111111100000000', '1111111111111111110000000',
                                        '1111111111111111111000000', '1111111111111111111100000',
                                        '1111111111111111111110000', '1111111111111111111111000',
                                        '1111111111111111111111100', '1111111111111111111111110',
                                        '1111111111111111111111111']}]}],
 'case': 'gqa32_scale_fp16_p16_shuf',
 'dtype': 'float16',
 'layers': [{'cap': 0.0, 'head_dim': 64, 'heads': 32, 'kv_heads': 8, 'scale': 0.1, 'sinks': [], 'window': -1},
            {'cap': 0.0, 'head_dim': 64, 'heads': 32, 'kv_heads': 8, 'scale': 0.1, 'sinks': [], 'window': -1}],
 'max_model_len': 128,
 'max_num_seqs': 16,
 'mode': 'mixed',
 'num_blocks': 64,
 'num_slots': 1024,
 'origin': 'The run vllm_flex_attention-mixed-eager-gqa32_scale_fp16_p16_shuf as recorded (--no-shrink).',
 'page': 16,
 'ratio': 2.0,
 'seed': 381660774}
S, L0 = SCENARIO, SCENARIO["layers"][0]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, S["dtype"])
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's Triton kernels in Triton's interpreter

# Per batch, layer and request: q of its new tokens, K and V of all its tokens (cached, then new), drawn
# in float64 from the seed and rounded to the run's dtype (the reference reads the values the engine gets).
gen = torch.Generator().manual_seed(S["seed"])


def draw_inputs(reqs):
    inputs = []
    for spec in S["layers"]:
        per_req = []
        for r in reqs:
            q = torch.randn(r["n_new"], spec["heads"], spec["head_dim"], generator=gen, dtype=torch.float64)
            k, v = (torch.randn(r["n_old"] + r["n_new"], spec["kv_heads"], spec["head_dim"], generator=gen,
                                dtype=torch.float64) for _ in "kv")
            per_req.append(tuple(x.to(dtype).to(torch.float64) for x in (q, k, v)))
        inputs.append(per_req)
    return inputs


def new_tokens(reqs, per_req, which):
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


# vLLM's physical cache per layer [blocks, block, kv heads, K|V], bound once as the [blocks, kv heads,
# block, 2 * d] view its runner hands (a captured graph reads these tensors).
caches = [torch.empty((S["num_blocks"], S["page"], spec["kv_heads"], 2 * spec["head_dim"]), dtype=dtype,
                      device=DEVICE) for spec in S["layers"]]
for attn, cache in zip(layers, caches):
    attn.bind_kv_cache(cache.permute(0, 2, 1, 3))


def load(reqs, inputs):
    """The batch's cached tokens written into each layer's cache, NaN where no token is (a read past a
    request's keys shows)."""
    for cache, per_req in zip(caches, inputs):
        cache.fill_(float("nan"))
        for r, (_, k, v) in zip(reqs, per_req):
            for t, slot in enumerate(r["slots"][:r["n_old"]]):
                cache[slot // S["page"], slot % S["page"]] = torch.cat([k[t], v[t]], dim=-1).to(dtype)


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
    return forward(metadata, slot_mapping, [[new_tokens(reqs, per_req, which) for which in range(3)]
                                            for per_req in inputs])


def reference(spec, reqs, per_req, precision):
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
for b, batch in enumerate(S["batches"]):
    reqs = batch["requests"]
    inputs = draw_inputs(reqs)
    outs = run(batch, inputs)
    for i, (spec, out, per_req) in enumerate(zip(S["layers"], outs, inputs)):
        golden = reference(spec, reqs, per_req, torch.float64)
        # The limit: 2x the error of the same computation in the run's dtype, plus a floor (as FlashAttention's tests).
        limit = S["ratio"] * (reference(spec, reqs, per_req, dtype) - golden).abs().max().item() + S["abs_floor"]
        err = (out.double().cpu() - golden).abs().nan_to_num(nan=float("inf")).max().item()
        ok = err <= limit
        failed |= not ok
        print(f"batch {b + 1}/{len(S['batches'])} ({batch['name']}) layer {i}: max error {err:.3g} "
              f"{'<=' if ok else '>'} limit {limit:.3g}: {'PASS' if ok else 'FAIL'}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
