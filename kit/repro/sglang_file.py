"""The SGLang part of a standalone file: SGLang's server args and attention TP of one process,
its own ReqToTokenPool, MHATokenToKVPool, token allocator and KVIndexTranslator behind a model
runner of the attributes its backends read, the backend class, RadixAttention layers, the batch as
its ForwardBatch (a speculative one with EAGLE's spec_info: EagleVerifyInput with the drafts' tree
mask in TARGET_VERIFY, EagleDraftExtendInput in DRAFT_EXTEND_V2), then init_forward_metadata and
each layer's forward inside its forward context (a multi-step draft: each step's, kit.repro.sglang_draft);
a graph run: its batch-size graphs (DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2, the draft's steps) captured and
replayed as its CUDA-graph runners do (two-phase hooks)."""
from __future__ import annotations

from typing import Dict

from kit.repro import sglang_draft
from kit.repro.file_parts import assemble, cuda_graph_part

HOW = {"eager": ("Builds the batches with SGLang's own classes (ReqToTokenPool, MHATokenToKVPool, KVIndexTranslator,\n"
                 "the backend, RadixAttention, ForwardBatch) and calls them in the order its model runner does\n"
                 "(init_forward_metadata, then each layer's forward inside forward_context; the layer writes the new\n"
                 "tokens' KV itself)."),
       "graph": ("Builds the batches with SGLang's own classes (ReqToTokenPool, MHATokenToKVPool, KVIndexTranslator,\n"
                 "the backend, RadixAttention, ForwardBatch) and calls them in the order its CUDA-graph runner does\n"
                 "(init_cuda_graph_state; per bucket, largest first, init_forward_metadata_out_graph(in_capture=True)\n"
                 "and the capture of every layer's forward on padded rows; per replay the static buffers refilled,\n"
                 "init_forward_metadata_out_graph, the replay).")}

# What any SGLang file imports first: sglang's import chain without its CUDA-only packages.
PLACEHOLDERS = '''import importlib.abc, importlib.machinery, importlib.util, types

BACKEND = @BACKEND@
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
'''

ENGINE_PART = PLACEHOLDERS + '''from sglang.srt.configs.model_config import AttentionArch
@BACKEND_IMPORT@
SPLIT_CALL = @SPLIT_CALL@  # whether DeepSeek's model hands this backend an MLA layer's q and k in latent and rope parts
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from transformers import PretrainedConfig

get_parallel().override_permanently(attn_tp_size=1, attn_dcp_rank=0)  # one process, no torch.distributed
no_graphs = PhaseConfig(backend=Backend.DISABLED)
KV_CACHE_DTYPE = {None: "auto", torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}[KV_DTYPE]
cache_dtype = KV_DTYPE or dtype  # SGLang's pool stores an fp8 cache as bytes and reads them as this
# The server's speculative config (TARGET_VERIFY, DRAFT_EXTEND_V2, a multi-step draft: EAGLE's drafts), read
# by the backends when built; without one, the server's defaults.
SPEC = S["speculative"] or dict(algorithm=None, num_draft_tokens=1, topk=1, num_steps=0)
DRAFT = S["multi_step"]  # the draft worker's multi-step backend, over SPEC's lanes (topk) and steps
get_context().override_server_args(
    attention_backend=BACKEND, page_size=S["page"], chunked_prefill_size=-1, dp_size=1, tp_size=1, pp_size=1,
    cuda_graph_config=CudaGraphConfig(decode=no_graphs, prefill=no_graphs), enable_deterministic_inference=False,
    kv_cache_dtype=KV_CACHE_DTYPE, speculative_algorithm=SPEC["algorithm"], speculative_eagle_topk=SPEC["topk"],
    speculative_num_draft_tokens=SPEC["num_draft_tokens"], speculative_num_steps=SPEC["num_steps"],
    device=DEVICE).install()


MLA = L0["rank"] > 0  # latent attention: one latent row a token (its first `rank` columns V), DeepSeek's


class ModelConfig:  # the fields of a model's config SGLang's attention backends read
    attention_arch = AttentionArch.MLA if MLA else AttentionArch.MHA
    context_len = S["context_len"]
    num_attention_heads, num_key_value_heads = L0["heads"], L0["heads"] if MLA else L0["kv_heads"]
    head_dim = v_head_dim = swa_v_head_dim = L0["head_dim"]
    if MLA:  # what SGLang's ModelConfig derives for an MLA model (configs/model_config.py)
        kv_lora_rank, qk_rope_head_dim, scaling = L0["rank"], L0["rope"], L0["scale"]
        qk_nope_head_dim = v_head_dim = swa_v_head_dim = @NORMAL_PATH_HEAD_DIM@  # its normal path's, unused here
        head_dim = @MLA_CONFIG_HEAD_DIM@
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
    use_mla_backend, is_draft_worker = MLA, DRAFT
    windows = [spec["window"] for spec in S["layers"] if spec["window"] >= 0]
    sliding_window_size = max(windows) if windows else None
    spec_algorithm = SpeculativeAlgorithm.EAGLE if S["speculative"] else SpeculativeAlgorithm.NONE
    prefill_attention_backend_str = decode_attention_backend_str = BACKEND
    server_args = get_context().server_args
    req_to_token_pool = ReqToTokenPool(S["max_num_seqs"], S["max_model_len"], DEVICE, enable_memory_saver=False)
    token_to_kv_pool = MLATokenToKVPool(S["num_slots"], S["page"], cache_dtype, L0["rank"], L0["rope"],
                                        len(S["layers"]), DEVICE, enable_memory_saver=False) if MLA else \
        MHATokenToKVPool(S["num_slots"], S["page"], cache_dtype, L0["kv_heads"], L0["head_dim"], len(S["layers"]),
                         DEVICE, enable_memory_saver=False)
    token_to_kv_pool_allocator = TokenToKVPoolAllocator(S["num_slots"], cache_dtype, DEVICE, token_to_kv_pool, False)
    kv_index_translator = KVIndexTranslator(
        req_to_token=req_to_token_pool.req_to_token, token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        token_to_kv_pool=token_to_kv_pool, page_size=S["page"], device=DEVICE, is_draft_worker=DRAFT)

    def decode_num_tokens_per_req(self, num_draft_tokens=None):
        return SPEC["num_draft_tokens"]  # a decode-shaped step's query tokens a request: a verify's drafts


runner = ModelRunner()
backend = AttnBackend(runner, SPEC["topk"], SPEC["num_steps"]) if DRAFT else AttnBackend(runner)
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
MODES = {"decode": ForwardMode.DECODE, "extend": ForwardMode.EXTEND, "mixed": ForwardMode.MIXED,
         "target_verify": ForwardMode.TARGET_VERIFY, "draft_extend_v2": ForwardMode.DRAFT_EXTEND_V2,
         "draft_decode": ForwardMode.DECODE}  # the draft's steps are decode batches
# The modes whose batches carry the extend_* fields, as the kit hands them (docs/contract.md): a verify's carry
# none, its spec_info counts the drafts.
EXTEND_LIKE = ("extend", "mixed", "draft_extend_v2")


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


def new_slots(reqs):
    """The KV slots of the step's new tokens, request after request."""
    return [s for r in reqs for s in r["slots"][r["n_old"]:]]


def new_positions(reqs):
    """The positions of the step's new tokens, request after request (a draft's: its prefix + tree depth); a
    multi-step draft's batch, as prepare_for_draft makes it: one a lane, the committed length (a step adds its
    index)."""
    if DRAFT:
        return [r["seq_len"] for r in reqs for _ in range(SPEC["topk"])]
    return [p for r in reqs for p in r["q_pos"]]


def batch_fields(mode, reqs):
    """The ForwardBatch fields of a batch of `reqs` in `mode`, as the scheduler hands them."""
    new_lens, old_lens, seq_lens = ([r[f] for r in reqs] for f in ("n_new", "n_old", "seq_len"))
    fields = dict(
        forward_mode=MODES[mode], batch_size=len(reqs), input_ids=None,
        req_pool_indices=device_ints([r["row"] for r in reqs], torch.int32),
        seq_lens=device_ints(seq_lens, torch.int32), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        seq_lens_sum=sum(seq_lens), out_cache_loc=device_ints(new_slots(reqs), torch.int64),
        positions=device_ints(new_positions(reqs), torch.int64))
    fields["spec_info"] = spec_info(mode, reqs, fields)
    if mode in EXTEND_LIKE:
        fields.update(extend_num_tokens=sum(new_lens), extend_seq_lens=device_ints(new_lens, torch.int32),
                      extend_prefix_lens=device_ints(old_lens, torch.int32),
                      extend_start_loc=device_ints([sum(new_lens[:i]) for i in range(len(reqs))], torch.int32),
                      extend_seq_lens_cpu=new_lens, extend_prefix_lens_cpu=old_lens,
                      global_num_token_non_padded_cpu=sum(new_lens))
    return fields


def spec_info(mode, reqs, fields, padded=0, fill=0):
    """EAGLE's speculative inputs of a batch in `mode`, as its worker hands them to the target model (None
    outside the speculative modes); `padded`: a graph's padded rows after `reqs`, each of seq_len `fill`."""
    drafts = SPEC["num_draft_tokens"]
    if mode == "draft_decode":
        return EagleDraftInput()
    if mode == "target_verify":
        # Per request its [drafts, seq_len + drafts] block, row-major, blocks concatenated: True where a draft
        # attends (the committed prefix, itself and its ancestors in the draft tree); a padded row's all True.
        mask = device_ints([c == "1" for r in reqs for row in r["visible"] for c in row]
                           + [True] * (padded * drafts * (fill + drafts)), torch.bool)
        return EagleVerifyInput(
            draft_token=None, custom_mask=mask, positions=fields["positions"], retrieve_index=None,
            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=SPEC["num_steps"],
            topk=SPEC["topk"], draft_token_num=drafts, capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=fields["seq_lens_sum"], seq_lens_cpu=fields["seq_lens_cpu"])
    if mode == "draft_extend_v2":
        # Every draft accepted: SGLang keeps num_accept_tokens = num_correct_drafts + 1 a request (eagle_info.py);
        # a padded row extends by the drafts too.
        lens = [r["n_new"] for r in reqs] + [drafts] * padded
        accepted = device_ints(lens, torch.int32)
        info = EagleDraftExtendInput(num_tokens_per_req=drafts, num_accept_tokens=accepted,
                                     num_correct_drafts=accepted - 1, num_accept_tokens_cpu=lens)
        # Set by SGLang's draft-extend runner, not dataclass fields: the prefix is seq_lens minus these.
        info.extend_seq_lens_tensor, info.extend_seq_lens_cpu = accepted, lens
        return info
    return None


def forward_batch(fields, in_capture=False):
    """A new ForwardBatch bound to its KV location plan, as the model runner makes one (a graph's capture
    batch over the runner's buffers binds those)."""
    fb = ForwardBatch(**fields)
    (runner.kv_index_translator.bind_runner_slots if in_capture else runner.kv_index_translator.bind_own_plan)(fb)
    return fb


def steps_of(fields):
    """The forwards of a batch, each (its fields, the backend it runs under): the batch itself, or a multi-step
    draft's steps as draft_forward makes them (eagle_worker_v2.py): step i on column i of every lane's write
    slots, at positions + i, under the wrapper's i-th backend."""
    if not DRAFT:
        return [(fields, backend)]
    bs, lanes, steps = fields["batch_size"], SPEC["topk"], SPEC["num_steps"]
    columns = fields["out_cache_loc"].view(bs, lanes, steps)
    return [(dict(fields, out_cache_loc=columns[:, :, i].reshape(-1), positions=fields["positions"] + i,
                  spec_info=EagleDraftInput()), backend.attn_backends[i]) for i in range(steps - 1)]


def forward(fields, qkv, attn_backend):
    """Each layer's forward inside `attn_backend`'s forward context (a draft step's: its own), on `qkv` (per layer:
    q, k, v of the step)."""
    outs = []
    with forward_context(ForwardContext(attn_backend=attn_backend)):
        for spec, attn, extra, (q, k, v) in zip(S["layers"], layers, sinks, qkv):
            t, rank = q.shape[0], spec["rank"]
            if rank and SPLIT_CALL:  # q [T, H, rank | rope], k [T, 1, latent | k_pe]; v is the latent
                q, k, v, extra = q[..., :rank], k[..., :rank], k[..., :rank], dict(
                    extra, q_rope=q[..., rank:], k_rope=k[..., rank:])
            else:
                q = q.reshape(t, -1)
            outs.append(attn(q, k, v, forward_batch(fields), **extra).view(t, spec["heads"], rank or spec["head_dim"]))
    return outs
'''

EAGER = '''

def run(batch, inputs):
    """One eager step, as the model runner makes it: init_forward_metadata, then each layer's forward (a
    multi-step draft: the metadata once for every step, then each step's forwards). Per layer, every
    forward's outputs, one after another."""
    reqs = batch["requests"]
    load(reqs, inputs)
    fields = batch_fields(batch["mode"], reqs)
    backend.init_forward_metadata(forward_batch(fields))
    outs = []
    for (step, attn_backend), (step_reqs, per_layer) in zip(steps_of(fields), forwards(batch, inputs),
                                                           strict=True):
        qkv = [[new_tokens(step_reqs, per_req, which) for which in range(3)] for per_req in per_layer]
        outs.append(handed(lambda: forward(step, qkv, attn_backend), qkv))
    return [torch.cat(per_step) for per_step in zip(*outs)]
'''

# SGLang's decode-shaped CudaGraphRunner with the 0.5.23 two-phase hooks (cuda_graph_runner.py): DECODE's graphs
# and the speculative modes', TOKENS query tokens a request.
GRAPH = '''
CAPTURE_SIZES = @BATCH_SIZES@  # SGLang's CUDA-graph batch sizes
BUCKETS = sorted({min(n for n in CAPTURE_SIZES if n >= len(b["requests"])) for b in S["batches"]}, reverse=True)
MAX_BS = BUCKETS[0]
# Query tokens a request in each forward: DECODE's one, a speculative step's drafts, a multi-step draft's lanes;
# KV slots a request's batch writes: a multi-step draft's lanes' columns, of which step i writes the i-th.
TOKENS = SPEC["topk"] if DRAFT else SPEC["num_draft_tokens"]
WRITES = TOKENS * SPEC["num_steps"] if DRAFT else TOKENS
FORWARDS = SPEC["num_steps"] - 1 if DRAFT else 1  # forwards a graph records (each: every layer)
SCRATCH_SLOT = 0  # a padded token's KV slot: the pool's slot 0, never a request's
backend.init_cuda_graph_state(MAX_BS, MAX_BS * TOKENS)
# A padded row's seq_len (the draft graph runner's: its first step backend's).
FILL = getattr(backend, "attn_backends", [backend])[0].get_cuda_graph_seq_len_fill_value()
STATEFUL = [backend, *getattr(backend, "attn_backends", [])]  # whose Python state a graph's launches keep
# The runner's static inputs, for the largest bucket; a graph reads them at every replay.
static = dict(req_pool_indices=torch.zeros(MAX_BS, dtype=torch.int32, device=DEVICE),
              seq_lens=torch.full((MAX_BS,), FILL, dtype=torch.int32, device=DEVICE),
              seq_lens_cpu=torch.full((MAX_BS,), FILL, dtype=torch.int32),
              out_cache_loc=torch.zeros(MAX_BS * WRITES, dtype=torch.int64, device=DEVICE),
              positions=torch.zeros(MAX_BS * TOKENS, dtype=torch.int64, device=DEVICE))
static_qkv = [[[torch.zeros(MAX_BS * TOKENS, heads, width, dtype=dtype, device=DEVICE) for heads, width in (
    (spec["heads"], spec["head_dim"]), (spec["kv_heads"], spec["head_dim"]),
    (spec["kv_heads"], spec["rank"] or spec["head_dim"]))] for spec in S["layers"]] for _ in range(FORWARDS)]
graphs = {}  # bucket -> (the captured batch's fields, the graph, its outputs); no graph without CUDA


def graph_fields(bs, seq_lens_sum, reqs=(), full=False):
    """A batch of `bs` rows in the run's mode over the static buffers, `reqs` first, padded rows after (their
    spec_info too); `full`: the request buffers at full capacity."""
    end = MAX_BS if full else bs
    fields = dict(forward_mode=MODES[S["mode"]], batch_size=bs, input_ids=None,
                  req_pool_indices=static["req_pool_indices"][:end], seq_lens=static["seq_lens"][:end],
                  seq_lens_cpu=static["seq_lens_cpu"][:end], seq_lens_sum=seq_lens_sum,
                  out_cache_loc=static["out_cache_loc"][:bs * WRITES], positions=static["positions"][:bs * TOKENS])
    fields["spec_info"] = spec_info(S["mode"], reqs, fields, padded=bs - len(reqs), fill=FILL)
    return fields


def program(fields, bs):
    """What a graph records: the in-graph metadata hook (where the backend has one), then every forward's
    layers. Per forward, per layer, the outputs."""
    if hasattr(backend, "init_forward_metadata_in_graph"):
        backend.init_forward_metadata_in_graph(forward_batch(fields))
    return [forward(step, [[x[:bs * TOKENS] for x in layer] for layer in qkv], attn_backend)
            for (step, attn_backend), qkv in zip(steps_of(fields), static_qkv, strict=True)]


def real_rows(outs, bs):
    """Per layer, the real rows of every forward's outputs, one forward after another."""
    return [torch.cat([out[:bs * TOKENS] for out in per_forward]) for per_forward in zip(*outs)]


def capture(bs):
    """Graph `bs` captured on padded rows only, as the runner captures: out_graph(in_capture=True) outside."""
    static["req_pool_indices"][:bs].zero_()
    static["seq_lens"][:bs].fill_(FILL)
    static["seq_lens_cpu"][:bs].fill_(FILL)
    static["out_cache_loc"][:bs * WRITES].fill_(SCRATCH_SLOT)
    static["positions"][:bs * TOKENS].zero_()
    fields = graph_fields(bs, FILL * bs)
    backend.init_forward_metadata_out_graph(forward_batch(fields, in_capture=True), in_capture=True)
    if DEVICE != "cuda":  # no graph: the replay runs the program again, with the backend's state as at capture
        program(fields, bs)
        graphs[bs] = (fields, None, [dict(vars(b)) for b in STATEFUL])
        return
    graphs[bs] = (fields, *cuda_graph(lambda: program(fields, bs)))


for bucket in BUCKETS:  # largest first, as SGLang captures
    capture(bucket)
replays = 0


def refill(buffer, values, end, pad):
    """`values` into the head of a static buffer, `pad` after them up to `end`."""
    buffer[:len(values)] = values if torch.is_tensor(values) else torch.tensor(values, dtype=buffer.dtype)
    buffer[len(values):end] = pad


def run(batch, inputs):
    """One replay: the batch's rows copied into the static buffers, padded rows to the bucket (scratch
    slot, the fill seq_len, zero inputs), out_graph outside the graph, then the graph's replay. Every
    second replay hands the request buffers at full capacity (rows past the batch keep what earlier
    batches left there)."""
    global replays
    reqs = batch["requests"]
    load(reqs, inputs)
    bs = len(reqs)
    pbs = min(n for n in BUCKETS if n >= bs)
    seq_lens = [r["seq_len"] for r in reqs]
    for name, values, pad in (("req_pool_indices", [r["row"] for r in reqs], 0), ("seq_lens", seq_lens, FILL),
                              ("seq_lens_cpu", seq_lens, FILL)):
        refill(static[name], values, pbs, pad)
    refill(static["out_cache_loc"], new_slots(reqs), pbs * WRITES, SCRATCH_SLOT)
    refill(static["positions"], new_positions(reqs), pbs * TOKENS, 0)
    for qkv_of_step, (step_reqs, per_layer) in zip(static_qkv, forwards(batch, inputs)):
        for qkv, per_req in zip(qkv_of_step, per_layer):
            for which, x in enumerate(qkv):
                refill(x, new_tokens(step_reqs, per_req, which), pbs * TOKENS, 0)
    fields = graph_fields(pbs, sum(seq_lens) + FILL * (pbs - bs), reqs, full=replays % 2 == 1)
    replays += 1
    backend.init_forward_metadata_out_graph(forward_batch(fields))
    captured, graph, kept = graphs[pbs]
    if graph is not None:
        graph.replay()
        return real_rows(kept, bs)
    after_hooks = [dict(vars(b)) for b in STATEFUL]
    for b, state in zip(STATEFUL, kept):  # a graph keeps the launch arguments it was captured with
        vars(b).update(state)
    try:
        return real_rows(program(captured, pbs), bs)
    finally:
        for b, state in zip(STATEFUL, after_hooks):
            vars(b).update(state)
'''


# The modes SGLang runs under its decode-shaped CUDA-graph runners: one graph per batch-size bucket (a multi-step
# draft's: every step in one graph, eagle_draft_cuda_graph_runner.py).
BATCH_SIZE_GRAPHS = {"decode", "target_verify", "draft_extend_v2", "draft_decode"}


def render(scenario: Dict, backend_cls, exec_: str) -> str:
    """The file's text for a run of `backend_cls` (its SGLang --attention-backend name) on `scenario`."""
    from kit.repro.scenario import NotReproducible

    modes = {b["mode"] for b in scenario["batches"]}
    # The draft's steps on a multi-step draft backend, or one batch a forward.
    how = sglang_draft.how(backend_cls, exec_) if modes == {"draft_decode"} else HOW[exec_]
    if exec_ == "eager":
        run = EAGER
    elif modes <= BATCH_SIZE_GRAPHS:
        run = cuda_graph_part(backend_cls.profile) + GRAPH.replace("@BATCH_SIZES@", repr(backend_cls.profile.batch_sizes))
    else:
        raise NotReproducible(f"{exec_} runs of SGLang backends in {scenario['mode']}: standalone files reproduce "
                              f"its batch-size graphs only ({', '.join(sorted(BATCH_SIZE_GRAPHS))}; its token-bucket "
                              f"graphs not yet); give the eager run's id")
    from backends.sglang import mla

    module, cls = backend_cls.sglang_class.split(":")
    engine_part = ENGINE_PART.replace("@BACKEND@", repr(backend_cls.server_name)).replace(
        "@SPLIT_CALL@", repr(backend_cls.server_name in mla.SPLIT_CALL_BACKENDS)).replace(
        "@BACKEND_IMPORT@", f"from {module} import {cls} as AttnBackend").replace(
        "@NORMAL_PATH_HEAD_DIM@", repr(mla.NORMAL_PATH_HEAD_DIM)).replace(
        "@MLA_CONFIG_HEAD_DIM@", repr(mla.MLA_CONFIG_HEAD_DIM)) + run
    return assemble(scenario, "SGLang", backend_cls.server_name, exec_, how, engine_part)
