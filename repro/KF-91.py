"""Standalone repro: SGLang sglang_mamba2, target_verify graph, case mamba2_bs1_bf16_fz2446f1 (attention conformance kit).
Imports only torch and SGLang.
Builds the step with SGLang's own classes as the kit's adapter does (MambaPool's State and pool
code, HybridReqToTokenPool's code, HybridLinearAttnBackend around Mamba2AttnBackend, MambaMixer2,
ForwardBatch) over the batch padded to its graph bucket (padded rows: state slot -1, zero
inputs); init_cuda_graph_state, init_forward_metadata_out_graph outside the graph, every layer's
forward captured, the pools refilled, the replay. Without CUDA the same calls run eagerly on the
same instance, as the kit emulates a graph (metadata, program, refill, metadata, program). The
padded output rows must be finite, as the kit checks them.
A verify hands EagleVerifyInput's chain of drafts and keeps each draft's state in the intermediate
pools; the file reproduces the verify's own step, not the decode after it.
Shrunk from mamba2_verify_saved_bf16 (2 requests, 76 cached and 6 new tokens) to mamba2_bs1_bf16_fz2446f1 (1 requests, 1 cached and 3 new tokens); both fail [kernel] in the kit.
Each layer's output is judged against an inline float64 reference: the error against the limit,
PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
from __future__ import annotations

import json, logging, os, sys, tempfile
from typing import Optional

import torch

SCENARIO = {'abs_floor': 0.016,
 'case': 'mamba2_bs1_bf16_fz2446f1',
 'casts': {'cpu': [['conv products cast', 'conv output cast']], 'cuda': [['conv products cast', 'conv output cast']]},
 'conv_dim': 48,
 'conv_width': 4,
 'drafts': 3,
 'dtype': 'bfloat16',
 'head_k_dim': 8,
 'head_v_dim': 16,
 'heads': [1, 2],
 'kind': 'mamba2',
 'kv_dtype': None,
 'layers': [0, 1],
 'mode': 'target_verify',
 'new': [3],
 'origin': 'Shrunk from mamba2_verify_saved_bf16 (2 requests, 76 cached and 6 new tokens) to mamba2_bs1_bf16_fz2446f1 '
           '(1 requests, 1 cached and 3 new tokens); both fail [kernel] in the kit.',
 'padded_bs': 2,
 'poison': {'seed': 1, 'std': 4.0},
 'pool_slots': 16,
 'prefix': [1],
 'ratio': 2.0,
 'seeds': {'layer0': 1891950553,
           'layer1': 130281295,
           'prefix0/layer0': 965296487,
           'prefix0/layer1': 1317958129,
           'step/layer0': 2041062168,
           'step/layer1': 246354830},
 'slots': [12]}
S, L0 = SCENARIO, SCENARIO["layers"][0]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, S["dtype"])
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's Triton kernels in Triton's interpreter
# A quantized (fp8) KV cache: what it stores of x is fp8(x / scale), read back as fp8 * scale (per layer, one
# scale for K and one for V).
KV_DTYPE = getattr(torch, S["kv_dtype"]) if S["kv_dtype"] else None

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

def _typed_int1(compare, tl, handle_cls):
    def typed(self, lhs, rhs):
        found = compare(self, lhs, rhs)
        return handle_cls(found.data.astype(bool, copy=False), tl.int1)
    typed.__wrapped__ = compare
    return typed


def _comparisons_typed_int1(builder_cls, handle_cls, tl) -> None:
    for name in dir(builder_cls):
        if name.startswith(("create_icmp", "create_fcmp")):
            setattr(builder_cls, name, _typed_int1(getattr(builder_cls, name), tl, handle_cls))


def _bf16_in_float32(op_impl, tl, handle_cls):
    """`op_impl(self, *operands, op)` over float32 copies of bfloat16 operands, a float result back in bfloat16."""
    def computed(self, *args):
        operands, op = args[:-1], args[-1]
        if not any(h.dtype.scalar == tl.bfloat16 for h in operands):
            return op_impl(self, *args)
        widened = [self.create_fp_ext(h, tl.float32) if h.dtype.scalar == tl.bfloat16 else h for h in operands]
        found = op_impl(self, *widened, op)
        if found.data.dtype.kind != "f":  # a comparison's booleans
            return found
        return self.create_fp_trunc(handle_cls(found.data, tl.float32), tl.bfloat16)
    computed.__wrapped__ = op_impl
    return computed


def _bf16_bits_rounded_to_nearest_even(np, values):
    """float32 values as bfloat16 bits, rounded to nearest even (NaN kept NaN), as a GPU converts."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _bf16_rounded_to_nearest(fp_trunc, tl, handle_cls):
    """float32 -> bfloat16 rounded to nearest even: the interpreter's conversion truncates (and its
    RTNE mode rounds half up)."""
    import numpy as np

    def trunc(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle_cls(_bf16_bits_rounded_to_nearest_even(np, src.data), dst_type.scalar)
        return fp_trunc(self, src, dst_type)
    trunc.__wrapped__ = fp_trunc
    return trunc


def _bf16_as_the_gpu(builder_cls, handle_cls, tl) -> None:
    builder_cls.create_fp_trunc = _bf16_rounded_to_nearest(builder_cls.create_fp_trunc, tl, handle_cls)
    for name in ("binary_op", "unary_op"):
        setattr(builder_cls, name, _bf16_in_float32(getattr(builder_cls, name), tl, handle_cls))


if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
    import triton.language as tl
    import triton.runtime.interpreter as interp

    _comparisons_typed_int1(interp.InterpreterBuilder, interp.TensorHandle, tl)
    _bf16_as_the_gpu(interp.InterpreterBuilder, interp.TensorHandle, tl)

# The kit's run, drawn from its seeds (kit.engine.recurrent_step): per layer its conv weights, A_log,
# dt_bias (softplus(dt_bias) = dt, Mamba's initialization) and D; per request its prefix's rows, whose
# state after them (the reference's, float32, the window in the model's dtype) is its saved state; per
# layer the step's rows [T, conv_dim] and gates [T, Hv].
import contextlib, dataclasses, math, types, warnings
dtype = getattr(torch, S["dtype"])
HK, HV = S["heads"]
DRAFTS = S["drafts"]  # a verify's drafts a request (0: a decode)


def split(mixed, layer):
    """(query, key, value) rows of the conv's output: (C, B, x)."""
    x, b, c = mixed.split([layer.v_dim, layer.k_dim, layer.q_dim], dim=-1)
    return c, b, x


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

import torch.nn.functional as F

# The declared casts' names (kit.engine.numerics), which the scenario's `casts` list per request.
CONV_PRODUCTS, CONV_CAST, QK_CAST, STATE_CAST = ('conv products cast',
 'conv output cast',
 'q k cast',
 'state cast at the output')
CHUNKED = {}  # a decode's and a verify's tokens: the token scan (the chunked form is a prefill's)


@dataclasses.dataclass
class RecurrentRun:
    """What a request's tokens give, in the reference's dtype."""

    out: torch.Tensor  # [n, Hv, V]
    states: List[torch.Tensor]  # after each token, [Hv, K, V]
    windows: List[torch.Tensor]  # the conv window after each token, [conv_dim, width - 1] (the raw rows)


def conv_windows(window: torch.Tensor, rows: torch.Tensor) -> List[torch.Tensor]:
    """The conv window ([conv_dim, width - 1], oldest row first) after each of `rows` [n, conv_dim]."""
    seq = torch.cat([window, rows.t().to(window.dtype)], dim=1)
    w = window.shape[1]
    return [seq[:, i + 1:i + 1 + w] for i in range(rows.shape[0])]


def _cast(x: torch.Tensor, step: str, model: torch.dtype, casts: Sequence[str]) -> torch.Tensor:
    """x as a kernel that takes `step` stores it: in the model's dtype, read back in x's."""
    return x.to(model).to(x.dtype) if step in casts else x


def causal_conv(window: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype = torch.float64,
                casts: Sequence[str] = ()) -> torch.Tensor:
    """The depthwise causal conv and SiLU of `rows` [n, conv_dim] after `window` [conv_dim, width - 1]
    ([n, conv_dim], in `dtype`), taking CONV_PRODUCTS and CONV_CAST of `casts` to the rows' dtype."""
    seq = torch.cat([window.to(dtype), rows.t().to(dtype)], dim=1)  # [conv_dim, width - 1 + n]
    # As taps times weights: torch's float64 depthwise conv1d is slow on CPU.
    taps = seq.unfold(1, weights.shape[1], 1)  # [conv_dim, n, width]
    products = _cast(taps * weights.to(dtype)[:, None, :], CONV_PRODUCTS, rows.dtype, casts)
    return _cast(F.silu(products.sum(-1).t()), CONV_CAST, rows.dtype, casts)


def _mamba2_dt(layer: RecurrentLayer, gates, dtype):
    """Mamba2's dt = softplus(dt + dt_bias) [n, H] and its log-decay dt A (A = -exp(A_log))."""
    dt = F.softplus(gates[0].to(dtype) + layer.dt_bias.to(dtype))
    return dt, -layer.A_log.to(dtype).exp() * dt


def _mamba2(layer: RecurrentLayer, c, b, x, gates, dtype, cast):
    dt, log_decay = _mamba2_dt(layer, gates, dtype)
    decay = log_decay.exp()

    def update(s, t):
        return s * decay[t][:, None, None] + dt[t][:, None, None] * b[t][:, :, None] * x[t][:, None, :]
    return update, lambda s, t: torch.einsum("hk,hkv->hv", c[t], s) + layer.D.to(dtype)[:, None] * x[t]


def run_request(layer: RecurrentLayer, rows: torch.Tensor, gates: Sequence[torch.Tensor], window: torch.Tensor,
                state: torch.Tensor, dtype: torch.dtype = torch.float64, casts: Sequence[str] = (),
                position: int = 0) -> RecurrentRun:
    """One request's n tokens (`rows` [n, conv_dim], each gate [n, Hv]) from `window` and `state` [Hv, K, V]
    after `position` tokens, taking the declared `casts` (kit.engine.numerics: CONV_PRODUCTS, CONV_CAST,
    QK_CAST, STATE_CAST) to the rows' dtype."""
    def cast(x, step):
        return _cast(x, step, rows.dtype, casts)
    hk, hv = layer.num_k_heads, layer.num_v_heads
    mixed = causal_conv(window, rows, layer.conv_weights, dtype, casts)
    q, k, v = layer.spec.split(mixed, layer)
    # value head h reads key head h // (Hv / Hk)
    q, k = (t.unflatten(-1, (hk, layer.head_k_dim)).repeat_interleave(hv // hk, dim=1) for t in (q, k))
    v = v.unflatten(-1, (hv, layer.head_v_dim))
    s = state.to(dtype)
    if STATE_CAST in casts and layer.kind in CHUNKED and rows.shape[0]:
        out, states = CHUNKED[layer.kind](layer, q, k, v, gates, dtype, cast, s, position)
        return RecurrentRun(out, states, conv_windows(window, rows))
    update, output = STEPS[layer.kind](layer, q, k, v, gates, dtype, cast)
    outs, states = [], []
    for t in range(rows.shape[0]):
        s = update(s, t)
        outs.append(output(s, t))
        states.append(s)
    out = torch.stack(outs) if outs else rows.new_zeros((0, hv, layer.head_v_dim), dtype=dtype)
    return RecurrentRun(out, states, conv_windows(window, rows))


STEPS = {"mamba2": _mamba2}

# The kit's run is made with every fresh allocation NaN-filled: a row the engine never writes reads NaN, not
# whatever memory held.
# The flag itself: torch.use_deterministic_algorithms also sets torch.compile's copy of it, and
# importing that config imports torch._dynamo, seconds of each worker's start.
_set_deterministic = getattr(torch._C, "_set_deterministic_algorithms", torch.use_deterministic_algorithms)


@contextlib.contextmanager
def nan_filled_allocations():
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    _set_deterministic(True, warn_only=True)  # warn_only: never change what runs
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        _set_deterministic(was_on, warn_only=was_warn_only)


class StatePool:
    """The kit's state pools (kit.engine.state_pool) a layer each: conv windows [slots, conv_dim, width - 1]
    in the model's dtype, states [slots, Hv, V, K] float32, and one poison slot past the last; every slot
    the step does not own holds poison (normal, std 4.0), so that a read of a free slot shows; a verify's
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
CHUNK_SIZE = 256  # the SSD scan's chunk (mamba_chunk_size of Mamba2-2.7B's and Nemotron-H's configs)
MAMBA_POOL_CODE = ('mamba2_layer_cache', 'clear_slots', '_should_fuse_slot_ops', '_conv_fuse_ok', 'SpeculativeState')
REQ_POOL_CODE = ('get_mamba_indices',
 'translate_mamba_indices',
 'mamba_translate_is_fusable',
 'mamba_v2p_table',
 'mamba2_layer_index',
 'mamba2_layer_cache')
MIXER = 'sglang.srt.layers.attention.mamba.mamba'
SSU = 'sglang.kernels.ops.mamba.triton_ops'
CUDA_CONV = {'causal_conv1d_fn': ('sglang.srt.layers.attention.mamba.causal_conv1d', 'causal_conv1d_fn'),
 'causal_conv1d_fn_triton': ('sglang.kernels.ops.mamba.causal_conv1d_triton', 'causal_conv1d_fn'),
 'causal_conv1d_update': ('sglang.srt.layers.attention.mamba.causal_conv1d',
                          'causal_conv1d_update'),
 'causal_conv1d_update_triton': ('sglang.kernels.ops.mamba.causal_conv1d_triton',
                                 'causal_conv1d_update')}


def _code(cls, names) -> dict:
    return {name: inspect.getattr_static(cls, name) for name in names}


class _MambaPoolState:
    """The MambaPool fields GDNAttnBackend and the pool code read, over the kit's StatePool."""

    _slot_siblings = ()
    enable_linear_replayssm = False
    replayssm_is_kda = False
    replayssm_write_pos = None
    replayssm_spec_write_pos = None

    def __init__(self, pool, sg_pool_cls, conv_view):
        self.size = pool.size
        views = {name: pool.buffers[name][:, :pool.size] for name in pool.buffers}
        conv, temporal = [conv_view(views["conv"])], views["temporal"]
        if pool.geometry.drafts:  # the run verifies drafts: SGLang's pool of a speculative server
            self.mamba_cache = sg_pool_cls.SpeculativeState(
                conv=conv, temporal=temporal, intermediate_ssm=views["intermediate_ssm"],
                intermediate_conv_window=[conv_view(views["intermediate_conv"])])
        else:
            self.mamba_cache = sg_pool_cls.State(conv=conv, temporal=temporal)


def _mamba_pool(pool, sg_pool_cls, conv_view):
    """`conv_view`: the kit's conv windows [layers, slots, dim, width - 1] as the kind's pool lays them out."""
    return type("MambaPool", (_MambaPoolState,), _code(sg_pool_cls, MAMBA_POOL_CODE))(pool, sg_pool_cls, conv_view)


class _ReqToTokenPoolState:
    """The HybridReqToTokenPool fields its code reads: request row r holds state slot mapping[r]
    (row 0, the padded rows', slot 0, as SGLang reserves it)."""

    start_layer = 0
    layer_transfer_counter = None

    def __init__(self, mamba_pool, rows: int, device, linear_layer_ids):
        self.mamba_pool = mamba_pool
        self.size = rows
        self.device = device
        # The model's linear layer ids to the state pools' layers, as HybridReqToTokenPool maps them.
        self.mamba_map = {layer_id: i for i, layer_id in enumerate(linear_layer_ids)}
        self.req_index_to_mamba_index_mapping = torch.zeros(rows + 1, dtype=torch.int32, device=device)


def _req_to_token_pool(mamba_pool, rows: int, device, sg_req_pool_cls, linear_layer_ids):
    code = _code(sg_req_pool_cls, REQ_POOL_CODE)
    return type("HybridReqToTokenPool", (_ReqToTokenPoolState,), code)(mamba_pool, rows, device, linear_layer_ids)


class _ModelConfig:
    """The ModelConfig fields SGLang's linear backends read: the model's HF config (a text model's
    text config is itself); HybridLinearAttnBackend's prefill takes mamba_chunk_size from it (64 where
    the config has none)."""

    def __init__(self, hf_config):
        self.hf_config = self.hf_text_config = hf_config


class _ModelRunner:
    """The ModelRunner attributes SGLang's GDN, KDA and Mamba2 backends and HybridLinearAttnBackend
    read, in any mode (tests/test_sglang_linear.py lists them from SGLang's source)."""

    is_draft_worker = False

    def __init__(self, device, req_to_token_pool, server_args, model_config):
        self.device = device
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = None  # a linear layer keeps no KV pages
        self.server_args = server_args
        self.model_config = model_config


def _no_full_layers(base):
    class _NoFullLayers(base):
        """The full-attention side of a model whose layers are all linear: owns no layer."""

        needs_cpu_seq_lens = False
        use_captured_forward_metadata_for_breakable_cuda_graph = False

        def __init__(self, runner):
            super().__init__()
            self.token_to_kv_pool = runner.token_to_kv_pool
            self.req_to_token_pool = runner.req_to_token_pool

        def init_forward_metadata(self, forward_batch):
            pass

        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            pass

        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            pass

        def forward_decode(self, *args, **kwargs):
            raise AssertionError("a layer was routed to full attention, but the case has none")

        forward_extend = forward_decode
    return _NoFullLayers


def bind_conv_without_cuda(mixer_module) -> None:
    """On a host where mamba.py bound no causal conv1d (no CUDA, NPU or XPU), its CUDA branch's names."""
    for name, (module, attr) in CUDA_CONV.items():
        if not hasattr(mixer_module, name):
            setattr(mixer_module, name, getattr(import_module(module), attr))


class _PassThrough(torch.nn.Module):
    """A linear layer of the mixer that hands its input on, as (output, bias) as SGLang's linears do."""

    def forward(self, x):
        return x, None


class _NoNorm(torch.nn.Module):
    """The mixer's gated RMS norm, left out: the SSD's output is what the kit judges."""

    def forward(self, x, gate):
        return x


class _Conv1d(torch.nn.Module):
    """The mixer's conv1d parameters as MambaMixer2 keeps them: weight [conv_dim, 1, width]."""

    def __init__(self, weights, bias):
        super().__init__()
        self.weight = weights[:, None, :]
        self.bias = bias


def _mixer(cls, layer):
    """SGLang's MambaMixer2 of one layer at TP 1, its dense parts passing through (see the module)."""
    mixer = cls.__new__(cls)
    torch.nn.Module.__init__(mixer)
    heads, groups = layer.num_v_heads, layer.num_k_heads
    mixer.tp_size, mixer.activation = 1, layer.activation
    mixer.num_heads, mixer.head_dim, mixer.n_groups = heads, layer.head_v_dim, groups
    mixer.ssm_state_size = layer.head_k_dim
    mixer.intermediate_size = heads * layer.head_v_dim
    mixer.groups_ssm_state_size = groups * layer.head_k_dim
    mixer.conv_dim = mixer.intermediate_size + 2 * mixer.groups_ssm_state_size
    mixer.conv1d = _Conv1d(layer.conv_weights, layer.bias)
    mixer.in_proj, mixer.out_proj, mixer.norm = _PassThrough(), _PassThrough(), _NoNorm()
    mixer.A = -torch.exp(layer.A_log.float())
    mixer.D, mixer.dt_bias = layer.D, layer.dt_bias
    return mixer


class _HfConfig:
    """What SGLang reads of a Mamba2 model's HF config (mamba_chunk_size)."""

    mamba_chunk_size = CHUNK_SIZE


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

def cuda_graph(program):
    """`program` captured in a CUDA graph as the engine captures one: its warm-up runs on a side stream, then
    the capture on it. Returns (the graph, the outputs it writes at each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            program()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = program()
    return graph, outs



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
