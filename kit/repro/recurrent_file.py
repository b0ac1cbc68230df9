"""The standalone file of a recurrent run (kit.engine.kinds.recurrent) on SGLang's Mamba2 backend: its
step as the kit runs it (kit.harness.recurrent), with only torch and SGLang imported.

Its scenario is plain data, as a softmax run's (kit.repro.scenario): the case's widths, each
request's prefix and state slot, the pool's size, the graph's bucket and the kit's seeds, by which
the file draws the run's own weights, inputs and saved states (kit.engine.recurrent_step). What the
file holds of the kit is the kit's own source, put into it: the float64 reference of the recurrence
(kit.engine.recurrent_reference), the NaN fill of fresh allocations the run is made under
(kit.harness.nan_fill), and the adapter's pools, runner and mixer (backends.sglang.linear,
backends.sglang.mamba2), SGLang's own classes and pool code behind them. Its verdict is the run's:
each layer's real rows against the reference (the limit: RATIO x the float32 arithmetic's error,
plus the dtype's floor) and, in a graph, its padded rows finite."""
from __future__ import annotations

import inspect
import pprint
from typing import Dict

import torch

from kit.engine import numerics, recurrent_reference
from kit.engine.case import DTYPES
from kit.engine.kinds import mamba2 as mamba2_kind
from kit.engine.kinds.recurrent import GRAPH_MODES, RecurrentCase
from kit.engine.pools import POISON_K_STD, POISON_SEED
from kit.engine.recurrent_step import build
from kit.harness import interpreter, nan_fill
from kit.harness.checks import ABS_FLOOR, RATIO
from kit.harness.recurrent import declared_casts, padded_bucket
from kit.modes import Exec, ForwardMode
from kit.repro.file_parts import cuda_graph_part, opening
from kit.repro.scenario import DEVICE_TYPES, NotReproducible
from kit.repro.sglang_file import PLACEHOLDERS

HOW = {"eager": ("Builds the step with SGLang's own classes as the kit's adapter does (MambaPool's State and pool\n"
                 "code, HybridReqToTokenPool's code, HybridLinearAttnBackend around Mamba2AttnBackend, MambaMixer2,\n"
                 "ForwardBatch) and calls them as Nemotron-H's model does (init_forward_metadata, each layer's\n"
                 "mixer through the backend's forward)."),
       "graph": ("Builds the step with SGLang's own classes as the kit's adapter does (MambaPool's State and pool\n"
                 "code, HybridReqToTokenPool's code, HybridLinearAttnBackend around Mamba2AttnBackend, MambaMixer2,\n"
                 "ForwardBatch) over the batch padded to its graph bucket (padded rows: state slot -1, zero\n"
                 "inputs); init_cuda_graph_state, init_forward_metadata_out_graph outside the graph, every layer's\n"
                 "forward captured, the pools refilled, the replay. Without CUDA the same calls run eagerly on the\n"
                 "same instance, as the kit emulates a graph (metadata, program, refill, metadata, program). The\n"
                 "padded output rows must be finite, as the kit checks them.")}
VERIFY = ("\nA verify hands EagleVerifyInput's chain of drafts and keeps each draft's state in the intermediate\n"
          "pools; the file reproduces the verify's own step, not the decode after it.")


def scenario(case: RecurrentCase, backend_cls, exec_: Exec, origin: str) -> Dict:
    """`case`'s step in `exec_` as plain data: the file draws the rest from the kit's seeds."""
    fx = build(case, "cpu")
    padded = padded_bucket(case.bs, backend_cls.profile) if exec_ == Exec.GRAPH else case.bs
    return dict(
        case=case.name, origin=origin, mode=case.mode.value, kind=case.kind, dtype=DTYPES[case.dtype], kv_dtype=None,
        heads=list(case.heads), head_k_dim=case.head_k_dim, head_v_dim=case.head_v_dim, conv_width=case.conv_width,
        conv_dim=case.conv_dim, layers=list(case.linear_layers), prefix=list(case.prefix), new=list(case.new_lens),
        drafts=fx.geometry.drafts, slots=list(fx.slots), pool_slots=fx.geometry.slots, padded_bs=padded,
        poison=dict(seed=POISON_SEED, std=POISON_K_STD), ratio=RATIO, abs_floor=ABS_FLOOR[fx.torch_dtype],
        casts={device: _casts(backend_cls, case, device) for device in DEVICE_TYPES},
        seeds={salt: case.rng_seed(salt) & 0x7FFFFFFF for salt in _salts(case)})


def _casts(backend_cls, case: RecurrentCase, device: str):
    """Per request, the declared casts (kit.engine.numerics) its rows take on `device`, which the file's reference
    takes; a cast that widens the kit's limit instead (ENVELOPE_STEPS: a prefill's) the file does not reproduce."""
    casts = [list(c) for c in declared_casts(backend_cls, case, device)]
    widening = sorted({c for request in casts for c in request if c in numerics.ENVELOPE_STEPS})
    if widening:
        raise NotReproducible(f"{case.name}: declared casts that widen the limit ({', '.join(widening)}): standalone "
                              f"recurrent files take exact ones only")
    return casts


def _salts(case: RecurrentCase):
    """What the kit's draws of the step are seeded by (kit.engine.recurrent_step): each layer's weights, each
    request's prefix in each layer, each layer's step."""
    for layer in case.linear_layers:
        yield f"layer{layer}"
        yield f"step/layer{layer}"
        yield from (f"prefix{r}/layer{layer}" for r, n in enumerate(case.prefix) if n)


DRAWS = '''
# The kit's run, drawn from its seeds (kit.engine.recurrent_step): per layer its conv weights, A_log,
# dt_bias (softplus(dt_bias) = dt, Mamba's initialization) and D; per request its prefix's rows, whose
# state after them (the reference's, float32, the window in the model's dtype) is its saved state; per
# layer the step's rows [T, conv_dim] and gates [T, Hv].
import contextlib, dataclasses, math, types, warnings
dtype = getattr(torch, S["dtype"])
HK, HV = S["heads"]
DRAFTS = S["drafts"]  # a verify's drafts a request (0: a decode)


@SPLIT@


class Layer(types.SimpleNamespace):
    """What the reference and the adapter read of a layer (the kit's RecurrentLayer)."""
    spec = types.SimpleNamespace(split=split)
    bias, activation = None, "silu"
    q_dim = k_dim = property(lambda self: self.num_k_heads * self.head_k_dim)
    v_dim = property(lambda self: self.num_v_heads * self.head_v_dim)


def draw_layer(layer_id):
    gen = torch.Generator().manual_seed(S["seeds"][f"layer{layer_id}"])
    conv = (torch.randn(S["conv_dim"], S["conv_width"], generator=gen) / math.sqrt(S["conv_width"])).to(dtype)
    a_log = torch.empty(HV).uniform_(1, 16, generator=gen).log()
    dt = torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
    skip = torch.empty(HV).uniform_(0.5, 1.5, generator=gen)
    return Layer(kind=S["kind"], layer_id=layer_id, num_k_heads=HK, num_v_heads=HV, head_k_dim=S["head_k_dim"],
                 head_v_dim=S["head_v_dim"], conv_weights=conv, A_log=a_log, dt_bias=dt + torch.log(-torch.expm1(-dt)),
                 D=skip)


def on_device(layer):
    """`layer` with its weights where the engine runs (the reference's stay on the CPU)."""
    return Layer(**{k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in vars(layer).items()})


def draw_rows(n, salt):
    """(rows [n, conv_dim], (dt [n, Hv],)) in the model's dtype."""
    gen = torch.Generator().manual_seed(S["seeds"][salt])
    rows, dt = (torch.randn(shape, generator=gen).to(dtype) for shape in ((n, S["conv_dim"]), (n, HV)))
    return rows, (dt,)


def saved_start(layer, request):
    """(window [conv_dim, width - 1], state [Hv, K, V], saved) where the request starts, float64."""
    window = torch.zeros(S["conv_dim"], S["conv_width"] - 1, dtype=torch.float64)
    state = torch.zeros(HV, S["head_k_dim"], S["head_v_dim"], dtype=torch.float64)
    n = S["prefix"][request]
    if not n:
        return window, state, False
    rows, gates = draw_rows(n, f"prefix{request}/layer{layer.layer_id}")
    run = run_request(layer, rows, gates, window, state)
    return run.windows[-1].to(dtype).double(), run.states[-1].float().double(), True
'''

# The kit's float64 reference of the recurrence, token by token.
REFERENCE = '''
import torch.nn.functional as F

# The declared casts' names (kit.engine.numerics), which the scenario's `casts` list per request.
CONV_PRODUCTS, CONV_CAST, QK_CAST, STATE_CAST = @CAST_NAMES@
CHUNKED = {}  # a decode's and a verify's tokens: the token scan (the chunked form is a prefill's)


@REFERENCE_SOURCE@


STEPS = {"mamba2": _mamba2}
'''

# Triton's interpreter as the kit runs SGLang's kernels in it (kit.harness.interpreter): a comparison typed
# int1 (the causal conv1d's masks, `(coord < n) & ...`, fail as integers) and bfloat16 computed as a GPU
# computes it (the interpreter multiplies its bits as integers and truncates its stores).
INTERPRETER = '''
@INTERPRETER_SOURCE@


if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
    import triton.language as tl
    import triton.runtime.interpreter as interp

    _comparisons_typed_int1(interp.InterpreterBuilder, interp.TensorHandle, tl)
    _bf16_as_the_gpu(interp.InterpreterBuilder, interp.TensorHandle, tl)
'''

POOLS = '''
# The kit's run is made with every fresh allocation NaN-filled: a row the engine never writes reads NaN, not
# whatever memory held.
@NAN_FILL_SOURCE@


class StatePool:
    """The kit's state pools (kit.engine.state_pool) a layer each: conv windows [slots, conv_dim, width - 1]
    in the model's dtype, states [slots, Hv, V, K] float32, and one poison slot past the last; every slot
    the step does not own holds poison (normal, std @STD@), so that a read of a free slot shows; a verify's
    intermediate pools [slots, drafts, ...] too."""

    def __init__(self):
        layers, slots = len(S["layers"]), S["pool_slots"]
        self.size = slots
        self.geometry = types.SimpleNamespace(drafts=DRAFTS)
        window, state = (S["conv_dim"], S["conv_width"] - 1), (HV, S["head_v_dim"], S["head_k_dim"])
        shapes = {"conv": (window, dtype), "temporal": (state, torch.float32)}
        if DRAFTS:  # a verify's state after each draft, per batch row (SGLang's intermediate caches)
            shapes.update(intermediate_conv=((DRAFTS,) + window, dtype), intermediate_ssm=((DRAFTS,) + state,
                                                                                             torch.float32))
        self.buffers = {name: torch.empty((layers, slots + 1) + shape, dtype=dt, device=DEVICE)
                        for name, (shape, dt) in shapes.items()}
        gen = torch.Generator(device=DEVICE).manual_seed(S["poison"]["seed"])
        for buffer in self.buffers.values():
            buffer.copy_(torch.empty(buffer.shape, device=DEVICE).normal_(0.0, S["poison"]["std"], generator=gen))
        self.poison = {name: b.clone() for name, b in self.buffers.items()}

    def refill(self, starts):
        """Poison everywhere, then each request's saved window and state in its slot (a new request's keeps
        poison: the scheduler clears it)."""
        for name, buffer in self.buffers.items():
            buffer.copy_(self.poison[name])
        for i, layer_starts in enumerate(starts):
            for slot, (window, state, saved) in zip(S["slots"], layer_starts):
                if saved:
                    self.buffers["conv"][i, slot] = window.to(dtype)
                    self.buffers["temporal"][i, slot] = state.transpose(-1, -2).float()
'''

ENGINE = '''
import inspect
from importlib import import_module

if DEVICE == "cpu" and not hasattr(torch.cpu, "device"):  # SGLang's kernel wrappers enter their tensors' device
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend, Mamba2AttnBackend
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

get_parallel().override_permanently(attn_tp_size=1, attn_dcp_rank=0)  # one process, no torch.distributed
no_graphs = PhaseConfig(backend=Backend.DISABLED)  # graphs are this file's, not SGLang's runner's
get_context().override_server_args(
    attention_backend=BACKEND, page_size=1, chunked_prefill_size=8192, dp_size=1, tp_size=1, pp_size=1,
    cuda_graph_config=CudaGraphConfig(decode=no_graphs, prefill=no_graphs), enable_deterministic_inference=False,
    kv_cache_dtype="auto", device=DEVICE, speculative_eagle_topk=1,  # a verify: EAGLE's chain, as the kit drafts
    speculative_algorithm="EAGLE" if DRAFTS else None, speculative_num_draft_tokens=max(DRAFTS, 1),
    speculative_num_steps=max(DRAFTS - 1, 0)).install()

# The kit's adapter (backends/sglang/linear.py, mamba2.py): SGLang's pool code over the pools, a runner of the
# attributes its backends read, the mixer of each layer with its dense parts passing through.
CHUNK_SIZE = @CHUNK_SIZE@  # the SSD scan's chunk (mamba_chunk_size of Mamba2-2.7B's and Nemotron-H's configs)
@ADAPTER_SOURCE@


layers = [draw_layer(i) for i in S["layers"]]
starts = [[saved_start(layer, r) for r in range(len(S["prefix"]))] for layer in layers]
pool = StatePool()
mamba_pool = _mamba_pool(pool, MambaPool, lambda conv: conv)
req_pool = _req_to_token_pool(mamba_pool, S["pool_slots"], DEVICE, HybridReqToTokenPool, S["layers"])
runner = _ModelRunner(DEVICE, req_pool, get_context().server_args, _ModelConfig(_HfConfig()))
mixer_module = import_module(MIXER)
bind_conv_without_cuda(mixer_module)
import_module(SSU).initialize_mamba_selective_state_update_backend(runner.server_args)  # as the scheduler at start
impl = HybridLinearAttnBackend(_no_full_layers(AttentionBackend)(runner), Mamba2AttnBackend(runner),
                               full_attn_layers=[])
mixers = [_mixer(mixer_module.MambaMixer2, on_device(layer)) for layer in layers]


def forward_batch(bs, lens, saved):
    """The step's ForwardBatch as the adapter hands it: request rows 1..n, row 0 a padded row's, whose
    state slot is the request's in HybridReqToTokenPool's mapping; seq_lens the new tokens and, for a
    saved state, 1 (SGLang's linear backends read extend_prefix_lens > 0 alone); a verify's has no extend
    fields (ForwardBatch.init_new sets them outside decode and verify alone) and the drafts' EagleVerifyInput."""
    real = torch.tensor([r < len(S["slots"]) for r in range(bs)], device=DEVICE)
    rows = torch.where(real, torch.arange(1, bs + 1, device=DEVICE), 0)
    req_pool.req_index_to_mamba_index_mapping[rows[real]] = torch.tensor(S["slots"], dtype=torch.int32,
                                                                         device=DEVICE)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    prefix = torch.tensor(saved, dtype=torch.int32, device=DEVICE)
    seq_lens = lens_t + prefix
    tokens = sum(lens)
    extend = {} if DRAFTS else dict(
        extend_num_tokens=tokens, extend_seq_lens=lens_t, extend_prefix_lens=prefix,
        extend_start_loc=torch.cumsum(lens_t, 0, dtype=torch.int32) - lens_t, extend_seq_lens_cpu=list(lens),
        extend_prefix_lens_cpu=prefix.tolist())
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY if DRAFTS else ForwardMode.DECODE, batch_size=bs,
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=DEVICE), req_pool_indices=rows, seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(), seq_lens_sum=int(seq_lens.sum()),
        out_cache_loc=torch.zeros(tokens, dtype=torch.int64, device=DEVICE), positions=None,
        global_num_token_non_padded_cpu=tokens, **extend, spec_info=verify_input(seq_lens) if DRAFTS else None)
    fb.num_padding = int((~real).sum())
    return fb


def verify_input(seq_lens):
    """The verify's EagleVerifyInput as the target verify hands it: a chain of DRAFTS tokens a request (the
    tree's links, unused by a chain, left out)."""
    return EagleVerifyInput(
        draft_token=None, custom_mask=None, positions=None, retrieve_index=None, retrieve_next_token=None,
        retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=DRAFTS - 1, topk=1, draft_token_num=DRAFTS,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu())


def forward(fb, inputs):
    """Every layer's mixer through the backend, as Nemotron-H calls it: in_proj hands [gate | xBC | dt]."""
    outs = []
    for i, (mixer, (rows, (dt,))) in enumerate(zip(mixers, inputs)):
        projected = torch.cat([rows.new_zeros((rows.shape[0], HV * S["head_v_dim"])), rows, dt], dim=-1)
        out = impl.linear_attn_backend.forward(mixer=mixer, layer_id=i, hidden_states=projected, output=None,
                                               forward_batch=fb, use_triton_causal_conv=True)
        outs.append(out.view(rows.shape[0], HV, S["head_v_dim"]))
    return outs
'''

EAGER = '''

def run(inputs):
    """The step as the model runner makes it: the scheduler's clear of a new request's slot,
    init_forward_metadata, every layer."""
    pool.refill(starts)
    saved = [s[2] for s in starts[0]]
    new = [slot for slot, was in zip(S["slots"], saved) if not was]
    if new:
        mamba_pool.clear_slots(torch.tensor(new, dtype=torch.int64, device=DEVICE))
    fb = forward_batch(len(S["slots"]), S["new"], saved)
    impl.init_forward_metadata(fb)
    return forward(fb, inputs)
'''

GRAPH = '''

def pad(x, rows):
    return torch.cat([x, x.new_zeros((rows,) + x.shape[1:])])


def run(inputs):
    """The step padded to its bucket (padded rows: slot -1, no saved state, zero inputs), as the kit runs a
    graph: init_cuda_graph_state; init_forward_metadata_out_graph outside the graph; the program (every
    layer) captured after its warm-up; the pools refilled as before the step; the replay."""
    bs, real = S["padded_bs"], len(S["slots"])
    impl.init_cuda_graph_state(bs, bs * max(DRAFTS, 1))  # one token a row, or a verify's drafts
    saved = [s[2] for s in starts[0]] + [False] * (bs - real)
    extra = (bs - real) * S["new"][-1]  # a padded row takes as many tokens as a real one
    padded = [(pad(rows, extra), tuple(pad(g, extra) for g in gates)) for rows, gates in inputs]
    lens = S["new"] + [S["new"][-1]] * (bs - real)

    def metadata():  # outside the graph: before the capture, and (the same batch) before the replay
        fb = forward_batch(bs, lens, saved)
        impl.init_forward_metadata_out_graph(fb)
        return fb
    pool.refill(starts)
    fb = metadata()
    if DEVICE != "cuda":  # no CUDA graph: the capture's calls, the refill, the replay's calls, eagerly
        forward(fb, padded)
        pool.refill(starts)
        return forward(metadata(), padded)
    graph, outs = cuda_graph(lambda: forward(fb, padded))
    pool.refill(starts)
    graph.replay()
    torch.cuda.synchronize()
    return outs
'''

VERDICT = '''

failed = False
casts = S["casts"][torch.device(DEVICE).type]  # per request, the declared casts the reference takes
taken = ", ".join(dict.fromkeys(c for request in casts for c in request))
inputs = [draw_rows(sum(S["new"]), f"step/layer{i}") for i in S["layers"]]
with nan_filled_allocations():
    outs = run([(rows.to(DEVICE), tuple(g.to(DEVICE) for g in gates)) for rows, gates in inputs])
real = sum(S["new"])
for layer, layer_starts, out, (rows, gates) in zip(layers, starts, outs, inputs):
    per_request = list(zip(rows.split(S["new"]), zip(*(g.split(S["new"]) for g in gates)), layer_starts, casts,
                           S["prefix"]))
    golden, same = (torch.cat([run_request(layer, r, g, w, s, precision, c, p).out
                               for r, g, (w, s, _), c, p in per_request])
                    for precision in (torch.float64, torch.float32))
    # The limit: 2x the error of the same recurrence in float32 arithmetic, plus the dtype's floor (the kit's).
    limit = S["ratio"] * (same.double() - golden).abs().max().item() + S["abs_floor"]
    err = (out[:real].double().cpu() - golden).abs().nan_to_num(nan=float("inf")).max().item()
    ok = err <= limit
    print(f"layer {layer.layer_id}: real rows' max error {err:.3g} {'<=' if ok else '>'} limit {limit:.3g}"
          f"{' under ' + taken if taken else ''}: {'PASS' if ok else 'FAIL'}")
    failed |= not ok
    if out.shape[0] > real:  # a graph's padded rows: the engine must write them (finite), as a real row
        nonfinite = int((~torch.isfinite(out[real:].float())).flatten(1).any(dim=1).sum())
        print(f"layer {layer.layer_id}: {nonfinite} of {out.shape[0] - real} padded output rows NaN/inf: "
              f"{'FAIL' if nonfinite else 'PASS'}")
        failed |= bool(nonfinite)
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
'''


def _source(*objects) -> str:
    return "\n\n\n".join(inspect.getsource(o).strip() for o in objects)


def _after_imports(module) -> str:
    """`module`'s source past its `import torch` (its imports are the file's)."""
    return inspect.getsource(module).split("import torch\n", 1)[1].strip()


def _reference() -> str:
    r = recurrent_reference
    names = (numerics.CONV_PRODUCTS, numerics.CONV_CAST, numerics.QK_CAST, numerics.STATE_CAST)
    return REFERENCE.replace("@CAST_NAMES@", pprint.pformat(names, width=70)).replace(
        "@REFERENCE_SOURCE@", _source(r.RecurrentRun, r.conv_windows, r._cast, r.causal_conv, r._mamba2_dt, r._mamba2,
                                      r.run_request))


def _interpreter() -> str:
    i = interpreter
    return INTERPRETER.replace("@INTERPRETER_SOURCE@", _source(
        i._typed_int1, i._comparisons_typed_int1, i._bf16_in_float32, i._bf16_bits_rounded_to_nearest_even,
        i._bf16_rounded_to_nearest, i._bf16_as_the_gpu))


def _adapter(backend_cls) -> str:
    """The adapter's own pool, runner and mixer code: its kind's module (backends/sglang/mamba2.py) and the
    one its class builds on (backends/sglang/linear.py), through the run's class (kit.repro imports no
    backend)."""
    mamba2, linear = (inspect.getmodule(cls) for cls in (backend_cls, backend_cls.__bases__[0]))
    constants = "\n".join(f"{name} = {pprint.pformat(getattr(module, name), width=100)}" for module, name in (
        (linear, "MAMBA_POOL_CODE"), (linear, "REQ_POOL_CODE"), (mamba2, "MIXER"), (mamba2, "SSU"),
        (mamba2, "CUDA_CONV")))
    return constants + "\n\n\n" + _source(
        linear._code, linear._MambaPoolState, linear._mamba_pool, linear._ReqToTokenPoolState,
        linear._req_to_token_pool, linear._ModelConfig, linear._ModelRunner, linear._no_full_layers,
        mamba2.bind_conv_without_cuda, mamba2._PassThrough, mamba2._NoNorm, mamba2._Conv1d, mamba2._mixer,
        mamba2._HfConfig)


def render(case: RecurrentCase, backend_cls, exec_: Exec, origin: str) -> str:
    """The file's text for `backend_cls` (SGLang's Mamba2) on `case` in `exec_`."""
    if "mamba2" not in getattr(backend_cls, "attention_kinds", ()) or backend_cls.profile.name != "sglang":
        raise NotReproducible(f"{backend_cls.name}: standalone files reproduce SGLang's Mamba2 of the recurrent "
                              f"backends only (GDN's and KDA's RadixLinearAttention calls and configs not yet)")
    if case.mode not in GRAPH_MODES:
        raise NotReproducible(f"{case.mode.value} runs of {backend_cls.name}: standalone files reproduce its decode "
                              f"and verify steps only (its chunked prefill not yet)")
    problem = backend_cls.supports(case)  # a run the kit does not make, a file does not either
    if problem:
        raise NotReproducible(f"{backend_cls.name} does not run {case.name}: {problem}")
    graph = exec_ == Exec.GRAPH
    parts = (
        opening(scenario(case, backend_cls, exec_, origin), "SGLang", backend_cls.name, exec_.value,
                HOW[exec_.value] + (VERIFY if case.mode == ForwardMode.TARGET_VERIFY else "")),
        PLACEHOLDERS.replace("@BACKEND@", repr("triton")),
        _interpreter(),
        DRAWS.replace("@SPLIT@", _source(mamba2_kind.split)),
        _reference(),
        POOLS.replace("@NAN_FILL_SOURCE@", _after_imports(nan_fill)).replace("@STD@", repr(POISON_K_STD)),
        ENGINE.replace("@ADAPTER_SOURCE@", _adapter(backend_cls)).replace("@CHUNK_SIZE@", repr(mamba2_kind.CHUNK_SIZE)),
        cuda_graph_part(backend_cls.profile) + GRAPH if graph else EAGER,
        VERDICT)
    return "\n".join(part.strip("\n") + "\n" for part in parts)
