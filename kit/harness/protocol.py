"""The backend protocol (SPEC): what a backend implements for the kit to test it.

Subclassing AttentionBackend is optional; the kit only looks for the methods.
A backend is a class: `supports` is a classmethod (so a backend that cannot
even be constructed here still says why), and the constructor takes a
BackendContext. AttentionBackend is the one place its declarations (DECLARATIONS)
are documented and given their defaults; kit.harness.capabilities reads them.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Dict, Optional, Tuple

import torch

from kit.engine.batch import SpeculativeConfig
from kit.engine.case import Case
from kit.engine.layer import Layer, model_layers
from kit.engine.modes import rules_for
from kit.engine.pools import KVPool, ReqToTokenPool
from kit.engine.numerics import EXACT_NUMERICS, Numerics
from kit.engine.profile import EngineProfile

# What a backend class declares of itself (AttentionBackend documents each), read once when it is
# loaded (kit.harness.capabilities.Capabilities.of); `profile` has no default: every backend names its engine's.
DECLARATIONS = ("profile", "modes", "attention_kinds", "kv_dtypes", "attention_features", "numerics",
                "extend_capture", "real_rows_only", "batch_invariant", "host_mirrors", "returns_lse", "ci_cases",
                "own_process")


@dataclasses.dataclass
class BackendContext:
    """What a serving engine's model runner gives an attention backend at construction."""

    device: torch.device
    dtype: torch.dtype  # model (q/k/v) dtype
    kv_cache_dtype: torch.dtype
    page_size: int  # the pool's (kit.engine.fixture sets it from the case)
    layers: Tuple[Layer, ...]  # the model's attention layers (heads, head_dim, scale, window, cap), by layer_id
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool
    speculative: Optional[SpeculativeConfig] = None  # set for the speculative modes
    # The model's context length (SGLang's model_config.context_len): the longest sequence a request
    # commits. None: as wide as a req_to_token row (max_context_len); a case at the context edge
    # (Case.context_edge) sets it to the run's longest committed sequence, the rows wider by what
    # the mode writes past it (drafts: SGLang's speculative headroom).
    model_context_len: Optional[int] = None

    @property
    def max_context_len(self) -> int:
        """The width of a req_to_token row: the most tokens a request's row addresses."""
        return self.req_to_token_pool.max_context_len

    @property
    def context_len(self) -> int:
        """The model's context length (model_context_len, else the req_to_token row's width)."""
        return self.max_context_len if self.model_context_len is None else self.model_context_len

    @classmethod
    def for_case(cls, case: Case, pools, device, plans=()) -> "BackendContext":
        """The context of a run of `case` over `pools`; `plans`: the run's batches (at the context
        edge, the model's context length is their longest committed sequence)."""
        edge = max(r.seq_len for plan in plans for r in plan.requests) if case.context_edge else None
        return cls(device=torch.device(device), dtype=case.torch_dtype, kv_cache_dtype=case.kv_torch_dtype,
                   page_size=pools.token_to_kv_pool.page_size, layers=model_layers(case), req_to_token_pool=pools.req_to_token_pool,
                   token_to_kv_pool=pools.token_to_kv_pool, speculative=rules_for(case.mode).speculative_config(case),
                   model_context_len=edge)


class AttentionBackend:
    """Reference shape of a backend. Override what you support."""

    name: Optional[str] = None
    # The engine whose conventions the backend follows (kit.engine.profile.EngineProfile: its KV storage,
    # padded graph rows, graph buckets and hook style): SGLANG, vLLM's (backends.vllm.adapter.PROFILE), or
    # a new engine's. Required: a class without one fails to load.
    profile: EngineProfile
    # The modes forward() implements, as ForwardMode values; None: every mode whose rules
    # say it is assumed supported (the four the protocol started with).
    modes: Optional[tuple] = None
    # True if forward() for EXTEND may be captured in a CUDA graph once per token
    # bucket and replayed after the metadata hooks of a new batch (metadata filled in
    # place). Otherwise EXTEND graph mode runs the padded call eagerly.
    extend_capture: bool = False
    # True if forward() sees only the real tokens of a padded EXTEND batch: the caller
    # (SGLang's attention layer) runs it on the real rows and zeroes the padded ones.
    real_rows_only: bool = False
    # True if forward() gives a request the same output rows, bit for bit, whatever batch it is in (its
    # size, the requests beside it, its position and pages, the graph bucket): an engine's deterministic
    # mode promises it. The kit then compares a request that recurs in a run's batches bit for bit;
    # otherwise within the output tolerance (kit.harness.invariance).
    batch_invariant: bool = False
    # The host copies of device values its metadata reads although the engine does not wait for the device
    # to make them exact (kit.harness.mirrors.MIRRORS: "seq_lens_cpu", "seq_lens_sum"; SGLang's
    # needs_cpu_seq_lens = False): its runs then hand those one step stale or as an upper bound, and the
    # others None, as an overlap scheduler may. None: it needs them exact, and the engine waits for them.
    host_mirrors: Optional[tuple] = None
    # The attention kinds forward() implements (Case.kind): "dense" (MHA/GQA/MQA over K and V
    # caches) and "mla" (latent attention over one latent row per token). A backend that
    # does not list "mla" is unsupported for MLA cases, whatever its supports() says.
    attention_kinds: tuple = ("dense",)
    # The quantized KV caches forward() reads (Case.kv_dtype: "fp8_e4m3", "fp8_e5m2"): a pool of
    # that dtype, each layer's scales on the layer (k_scale, v_scale). A case whose kv_dtype is
    # not listed is unsupported, whatever supports() says.
    kv_dtypes: tuple = ()
    # The layer features forward() implements (Case.features): "sinks" (a learned per-head logit
    # in every softmax denominator, Layer.sinks). A backend that does not list a case's feature
    # is unsupported for it, whatever its supports() says: a backend written before a feature
    # existed would run it and ignore it.
    attention_features: tuple = ()
    # The rounding steps forward() takes on purpose, each for the modes it takes it in
    # (kit.engine.numerics.Numerics: q quantized to fp8 with q_scale = k_scale, new tokens attended as
    # handed rather than as stored, probabilities quantized to fp8 before PV, TF32 dots). Its runs are
    # judged against a float64 reference that takes the same steps; default: none (exact).
    numerics: Numerics = EXACT_NUMERICS
    # True if forward() returns (out, lse): with the output, the log-sum-exp of each query row and head,
    # lse [T, Hq] (float32 or wider, on q's device), the natural log of the softmax's denominator: the sum
    # of exp over the keys the row attends (after the window) of the scaled and capped logits, the
    # layer's sink logit one more term (docs/contract.md, 'The log-sum-exp'). What a caller merging
    # partial attentions reads (split prefill, cascade, context parallelism); the kit judges it too.
    returns_lse: bool = False
    # {mode value: case names}: the smoke cases a plain CPU run (`--case-set auto`) gives a backend
    # too slow on CPU for all of them; None: every case. `--case-set smoke` runs them all.
    ci_cases: Optional[dict] = None
    # None, or why each of its runs needs a process of its own, as an engine's worker serving one model: its
    # library keeps process-wide state (compiled kernels, their lowering choices) that makes a run pass or fail
    # by the runs before it. Its runs then go to a subprocess each, as a quarantined run does.
    own_process: Optional[str] = None

    @classmethod
    def supports(cls, case: Case) -> Optional[str]:
        """None, or the reason this case is out of scope."""
        return None

    @classmethod
    def supports_graph(cls, case: Case) -> Optional[str]:
        """None, or why graph runs of this case are out of scope though its eager runs are not
        (e.g. the engine captures no full graph of such batches); asked only of a backend with
        graph hooks."""
        return None

    @classmethod
    def versions(cls) -> Dict[str, str]:
        """Versions of the libraries this backend runs on, for the records (torch and CUDA
        are recorded by the kit): e.g. {"triton": "3.6.0"}."""
        return {}

    def __init__(self, ctx: BackendContext):
        self.ctx = ctx

    def init_forward_metadata(self, batch) -> None:
        """Eager metadata; for a two-phase backend, out_graph then in_graph (as SGLang's base)."""
        if not callable(getattr(self, "init_forward_metadata_out_graph", None)):
            raise NotImplementedError
        self.init_forward_metadata_out_graph(batch)
        in_graph = getattr(self, "init_forward_metadata_in_graph", None)
        if callable(in_graph):
            in_graph(batch)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Layer, batch,
                save_kv_cache: bool = True) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> out [T, Hq, D] (declaring returns_lse: (out, lse [T, Hq])).
        With save_kv_cache, write k/v to the pool at batch.out_cache_loc before attending. MLA: q [T, Hq, R + P]
        (absorbed: q_nope . W_UK, then q_pe), k [T, 1, R + P] (the latent c_kv, then k_pe), v
        [T, 1, R] a view of k's first R columns; out [T, Hq, R]; the pool's set_kv_buffer
        writes k's whole row."""
        raise NotImplementedError

    # Optional graph hooks (absent: the graph cells read "no capture hooks"), one style:
    #   init_cuda_graph_state(max_bs, max_num_tokens), and
    #   two-phase (SGLang 0.5.23):
    #     init_forward_metadata_out_graph(batch, in_capture=False)  host prep, before capture
    #                                                               (in_capture=True) and replay
    #     init_forward_metadata_in_graph(batch)   optional; static-shape device work, recorded
    #                                             in the graph and re-run by every replay
    #   or capture/replay:
    #     init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices, seq_lens,
    #                                              forward_mode, spec_info)
    #     init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, seq_lens_sum,
    #                                             forward_mode, spec_info, seq_lens_cpu)
    #   or builder (the profile's hooks = BUILDER, vLLM's metadata builders): metadata from the
    #   engine-neutral step description batch.common (kit.engine.common.CommonBatch):
    #     build_for_capture(batch)       at capture; init_forward_metadata(batch) before each replay
    #   get_cuda_graph_seq_len_fill_value() -> int  (default 1)


def library_version(distribution: str) -> str:
    """The installed version of `distribution`, read from its metadata, or "not installed" (for
    AttentionBackend.versions). Never by importing it: an import runs the package's own set-up
    before the adapter's (importing sglang moves the compilers' caches for the whole process), and
    a distribution's name need not be its module's (sgl-flash-mla installs flash_mla)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def backend_problem(obj) -> Optional[str]:
    """Why `obj` cannot be a backend before anything runs (not a class, or no `supports`, the
    first thing the kit calls), or None. The instance methods fail at their own stage."""
    if not isinstance(obj, type):
        return f"a {type(obj).__name__}, not a backend class (see docs/extending.md, 'Adding a backend')"
    if not callable(getattr(obj, "supports", None)):
        return f"the class {obj.__name__} has no `supports` classmethod (see docs/extending.md, 'Adding a backend')"
    return None


def seq_len_fill_value(backend) -> int:
    fill = getattr(backend, "get_cuda_graph_seq_len_fill_value", None)
    return int(fill()) if callable(fill) else 1
