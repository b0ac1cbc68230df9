"""vLLM's own attention backends, unmodified, behind the kit's protocol.

What is mapped, and nothing more (a bug here could hide one in vLLM):
- the kit's context -> a VllmConfig of a small model with the kit's heads and widths (a config.json
  with no weights; runtime.vllm_config), its KV cache block size the pool's page, its blocks the
  pool's, its sequence and batch limits the pools', a speculative config for TARGET_VERIFY;
- each kit layer -> vLLM's own layer, `Attention` (or `MLAAttention`, mla.py), built as a model
  builds it, with its window, soft cap, sinks and KV scales, registered in the config's forward
  context; the pool's tensor of that layer bound as its KV cache, in vLLM's layout (the pool's
  storage is vLLM's physical one: `interleaved`, each block [block, heads, K then V], handed as the
  logical [blocks, heads, block, 2 * head_dim] view create_kv_cache_views gives);
- one metadata builder per group of layers that share a KV cache spec, as vLLM's runner groups
  them;
- the kit's `batch.common` (kit.engine.common.CommonBatch, in static buffers under graphs) ->
  vLLM's CommonAttentionMetadata, field for field (`common_metadata`); the builder's build() for
  eager steps and replays, build_for_cudagraph_capture() at capture;
- forward -> the layer called as a model calls it, inside vLLM's forward context (the metadata and
  slot mapping per layer name), with the KV write the layer does itself.

The engine's conventions are PROFILE: the storage above, no KV write for padded tokens (slot -1),
padded requests empty, vLLM's default capture sizes, graphs captured as vLLM captures them
(kit.harness.hooks' builder style), a ragged step's decode rows first (as its runner reorders them),
decode rows verifying drafts beside prefill rows (speculative decoding with chunked prefill), drafts as
vLLM counts them (kit.engine.drafts.vllm), a recurrent layer's verify states in a block per token
(kit.harness.recurrent_rules). Which graphs run is vLLM's own declaration,
AttentionMetadataBuilder.get_cudagraph_support (`supports_graph`).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Dict, Optional

import torch

from backends import pinned
from kit.engine import drafts
from kit.engine.modes import rules_for
from kit.engine.modes.rules import GraphBuckets
from kit.engine.numerics import ALL, P_FP8, Q_FP8, TF32, Numerics
from kit.engine.profile import BUILDER, COMMON, DECODE_FIRST, NO_WRITE, PER_TOKEN_BLOCKS, EngineProfile
from kit.engine.variants import bucket_for
from kit.harness.protocol import AttentionBackend, library_version
from kit.modes import ForwardMode

PINNED = "0.33.0"
INSTALL = "python -m backends.vllm.install"
# vLLM's default CUDA-graph capture sizes (config/vllm.py:2398 _set_cudagraph_sizes): 1, 2, 4, then
# multiples of 8 up to 256 and of 16 up to 512, in tokens; set as the config's capture sizes too.
CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 256, 8)) + tuple(range(256, 513, 16))
# Sparse MLA's cache in blocks a row apart: in a DeepSeek-V3.2 model its blocks share an allocation with
# the indexer's keys, and its kernels read them through the block stride (sparse_utils.flat_kv_row_view).
PROFILE = EngineProfile("vllm", storage={"dense": "interleaved", "mla": "latent_blocks",
                                         "sparse_mla": "latent_strided_blocks"}, batch=COMMON,
                        padded_slot=NO_WRITE, padded_seq_len=0, padded_query_len=0, pads_token_graph_requests=True,
                        batch_sizes=CAPTURE_SIZES, token_buckets=CAPTURE_SIZES, hooks=BUILDER, capture_warmups=1,
                        row_order=DECODE_FIRST, spec_rows_beside_prefill=True, drafts=drafts.vllm,
                        recurrent_verify=PER_TOKEN_BLOCKS)
# The kit's quantized KV caches, as vLLM's kv_cache_dtype names them.
CACHE_DTYPES = {None: "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
INTERPRETER_BF16 = "bf16 on CPU: Triton's interpreter computes bf16 tl.dot wrong (CPU runs fp16/fp32)"


def vllm_problem() -> Optional[str]:
    """Why the pinned vllm cannot be used here, or None."""
    return pin_problem() or _import_problem()


def pin_problem() -> Optional[str]:
    """Why the pinned vllm is not installed here (read from installed metadata, nothing imported), or None."""
    return pinned.pin_problem("vllm", PINNED, INSTALL)


_IMPORTED: Dict[str, Optional[str]] = {}


def _import_problem() -> Optional[str]:
    """Why vLLM's attention chain does not import here (its runtime set-up included), or None."""
    if "problem" not in _IMPORTED:
        try:
            importlib.import_module("backends.vllm.runtime")
            _IMPORTED["problem"] = None
        except Exception as exc:  # noqa: BLE001 - a missing package or a broken install: say which
            _IMPORTED["problem"] = f"vllm {PINNED} does not import here: {type(exc).__name__}: {exc}"
    return _IMPORTED["problem"]


def runtime():
    from backends.vllm import runtime as rt  # imported where vLLM is used: seconds of imports
    return rt


def layer_name(layer) -> str:
    """A layer's name in vLLM's forward context, as a model's decoder layer names it."""
    return f"model.layers.{layer.layer_id}.self_attn.attn"


def model_of(case=None, ctx=None):
    """The model a VllmConfig is made for: a case's (asked before anything is built) or a context's."""
    rt = runtime()
    if ctx is not None:
        layer, pool = ctx.layers[0], ctx.token_to_kv_pool
        return rt.Model(
            dtype=ctx.dtype, heads=layer.tp_q_head_num, kv_heads=layer.tp_k_head_num, head_dim=layer.head_dim,
            kv_lora_rank=layer.kv_lora_rank, rope_dim=layer.rope_dim, block_size=ctx.page_size,
            cache_dtype=CACHE_DTYPES[_kit_kv_dtype(ctx.kv_cache_dtype)], max_model_len=ctx.max_context_len,
            max_num_seqs=ctx.req_to_token_pool.size, num_blocks=pool.num_blocks,
            num_speculative_tokens=ctx.speculative.num_draft_tokens - 1 if ctx.speculative else 0,
            capture_sizes=CAPTURE_SIZES, index_topk=layer.index_topk)
    speculative = rules_for(case.mode).speculative_config(case)
    return rt.Model(
        dtype=case.torch_dtype, heads=case.num_q_heads, kv_heads=case.num_kv_heads, head_dim=case.head_dim,
        kv_lora_rank=case.kv_lora_rank, rope_dim=case.rope_dim, block_size=case.page,
        cache_dtype=CACHE_DTYPES[case.kv_dtype], max_model_len=4096, max_num_seqs=max(CAPTURE_SIZES),
        num_blocks=1024, num_speculative_tokens=speculative.num_draft_tokens - 1 if speculative else 0,
        capture_sizes=CAPTURE_SIZES, index_topk=case.index_topk)


@functools.lru_cache(maxsize=None)
def _served_config(model, vllm_backend: str):
    rt = runtime()
    return rt.served_config(model, rt.backend_class(vllm_backend))


def _kit_kv_dtype(dtype: torch.dtype) -> Optional[str]:
    return {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}.get(dtype)


class VllmBackend(AttentionBackend):
    """The protocol over one of vLLM's backends (`vllm_backend`, its AttentionBackendEnum name)."""

    vllm_backend: str = ""
    cuda_only: bool = False  # its kernels are compiled CUDA ones (else Triton or PyTorch's, which run on CPU)
    triton_kernels: bool = False  # its attention is Triton kernels (Triton's interpreter on CPU)
    # What its impl raises NotImplementedError for, which vLLM's validate_configuration does not
    # check: {"cap": reason, "window": reason}.
    impl_refuses: Dict[str, str] = {}
    profile = PROFILE
    # By value: MIXED is named before the kit defines it (vLLM schedules mixed batches every step).
    modes = ("decode", "extend", "target_verify", "mixed")
    # vLLM's full graphs capture a mixed batch's forward whole where the builder declares ALWAYS
    # (supports_graph says where it does not).
    extend_capture = True
    compiles = False  # its kernels are compiled by torch.compile (flex attention)
    # The KV writer its impl calls itself, whatever loads; None: the compiled op (runtime.KV_WRITE).
    own_kv_writer: Optional[str] = None

    @classmethod
    def versions(cls):
        out = {"vllm": library_version("vllm"), "triton": library_version("triton")}
        if vllm_problem() is None:
            out["kv_write"] = cls.own_kv_writer or runtime().KV_WRITE[cls.attention_kinds[0]]
        return out

    @classmethod
    def installed_problem(cls) -> Optional[str]:
        return pin_problem()

    @classmethod
    def backend_cls(cls):
        return runtime().backend_class(cls.vllm_backend)

    @classmethod
    def load_engine(cls) -> None:
        """What a run imports of vLLM (the offline bundle traces it): the runtime and vLLM's backend class."""
        cls.backend_cls()

    @classmethod
    def supports(cls, case) -> Optional[str]:
        problem = vllm_problem()
        if problem:
            return problem
        if case.mode is ForwardMode.DRAFT_EXTEND_V2:
            return ("DRAFT_EXTEND_V2 is SGLang's EAGLE draft-extend step; vLLM's runner has no such mode (its drafters "
                    "run decode and prefill batches)")
        if case.mode is ForwardMode.TARGET_VERIFY and case.topk > 1:
            return "tree verify (topk > 1): vLLM 0.33 has no tree attention (AttentionBackendEnum has no TREE_ATTN)"
        if cls.cuda_only and not torch.cuda.is_available():
            return f"vLLM's {cls.vllm_backend} runs compiled CUDA kernels; no CUDA device here"
        if cls.triton_kernels and case.dtype == "bf16" and not torch.cuda.is_available():
            return INTERPRETER_BF16
        return cls._refused(case) or cls._vllm_refuses(case)

    @classmethod
    def _refused(cls, case) -> Optional[str]:
        """What vLLM refuses outside its validate_configuration: a feature its impl raises for, an
        fp8 cache where no writer of vLLM's stores fp8."""
        for feature, on in (("cap", case.cap > 0 or case.hybrid), ("window", case.window >= 0 or case.hybrid)):
            if on and feature in cls.impl_refuses:
                return cls.impl_refuses[feature]
        if case.kv_dtype and not runtime().current_platform.has_device_capability(89):
            return (f"{case.kv_dtype} KV cache: vLLM stores fp8 only on SM89+ GPUs "
                    f"(triton_reshape_and_cache_flash.py:19-29; its CPU writers store no fp8)")
        return None

    @classmethod
    def _vllm_refuses(cls, case) -> Optional[str]:
        """vLLM's own check of a configuration (AttentionBackend.validate_configuration, what its
        backend selector asks), or None."""
        rt = runtime()
        with rt.set_current_vllm_config(cls.served_config(case)):  # some backends read the config there
            reasons = cls._validate(case)
        if not reasons:
            return None
        return f"vLLM's {cls.vllm_backend} refuses it (validate_configuration): {', '.join(reasons)}"

    @classmethod
    def _validate(cls, case):
        rt = runtime()
        return cls.backend_cls().validate_configuration(
            head_size=case.head_dim, dtype=case.torch_dtype, kv_cache_dtype=CACHE_DTYPES[case.kv_dtype],
            block_size=case.page, use_mla=case.is_mla, has_sink=case.sinks, use_sparse=case.kind == "sparse_mla",
            use_mm_prefix=False, use_per_head_quant_scales=False,
            device_capability=rt.current_platform.get_device_capability(), attn_type="decoder",
            has_sliding_window=case.window >= 0 or case.hybrid)

    @classmethod
    def served_config(cls, case):
        """The VllmConfig of an engine serving the case's model with this backend, for the class's
        questions (read, never changed): one per model, as a listing asks of hundreds of cases."""
        return _served_config(model_of(case), cls.vllm_backend)

    @classmethod
    def supports_graph(cls, case) -> Optional[str]:
        """vLLM runs a batch under a full graph where its builder's declared support covers it
        (config/compilation.py:1395-1460): a ragged batch needs ALWAYS, a uniform one of more than
        one token per request UNIFORM_BATCH, single-token decodes UNIFORM_SINGLE_TOKEN_DECODE; and
        only up to its largest capture size."""
        rt = runtime()
        rules = rules_for(case.mode)
        support = cls._graph_support(case)
        ragged = rules.graph is GraphBuckets.TOKEN_COUNT
        uniform = None if ragged else rules.tokens_per_request(case)
        need = (rt.AttentionCGSupport.ALWAYS if ragged else rt.AttentionCGSupport.UNIFORM_BATCH if uniform > 1
                else rt.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
        if support.value < need.value:
            batches = "ragged batches" if ragged else f"uniform batches of {uniform} tokens per request"
            return (f"vLLM captures no full graph of {batches} with {cls.vllm_backend}: its builder declares "
                    f"AttentionCGSupport.{support.name} (get_cudagraph_support), full graphs of these need {need.name}")
        tokens = max(sum(c.new_lens) if ragged else bucket_for(c.bs, PROFILE.batch_sizes) * uniform
                     for c in rules.replay_schedule(case, PROFILE))
        if tokens > max(CAPTURE_SIZES):
            return (f"vLLM captures graphs of up to {max(CAPTURE_SIZES)} tokens (max_cudagraph_capture_size); a batch of "
                    f"{tokens} runs eagerly")
        return None

    @classmethod
    def _graph_support(cls, case):
        """The builder's declaration for the case's model (get_cudagraph_support, a classmethod)."""
        rt = runtime()
        config = cls.served_config(case)
        with rt.set_current_vllm_config(config):  # FlashInfer's asks the current config (its TRT-LLM choice)
            return cls.backend_cls().get_builder_cls().get_cudagraph_support(config, rt.kv_cache_spec(config))

    # ---- construction -------------------------------------------------------------------------
    def __init__(self, ctx):
        super().__init__(ctx)
        rt = self.rt = runtime()
        layout = ctx.token_to_kv_pool.storage.name
        if layout != self.profile.storage_for(self.attention_kinds[0]):
            raise ValueError(f"the pool stores KV as {layout!r}, not as vLLM's cache does (profile {self.profile.name!r})")
        backend = self._vllm_backend()
        self.vllm_config = rt.served_config(model_of(ctx=ctx), backend)
        resolved = self.vllm_config.cache_config.kv_cache_layout
        if resolved != "LBNHC":
            raise ValueError(f"vLLM resolves the KV cache layout {resolved} for {self.vllm_backend}; the pool holds "
                             f"vLLM's LBNHC (the adapter's cache view)")
        default = torch.get_default_dtype()
        with rt.set_current_vllm_config(self.vllm_config):
            torch.set_default_dtype(ctx.dtype)  # vLLM's layers take the activation dtype from it
            try:
                self.layers = {layer: self._vllm_layer(layer, backend) for layer in ctx.layers}
            finally:
                torch.set_default_dtype(default)
            groups: Dict[object, list] = {}
            for layer, attn in self.layers.items():
                spec = backend.customize_spec(attn.get_kv_cache_spec(self.vllm_config))
                if spec.block_size != ctx.page_size:
                    raise ValueError(f"vLLM gives layer {layer.layer_id} KV blocks of {spec.block_size} tokens, the "
                                     f"pool's pages hold {ctx.page_size}")
                groups.setdefault(spec, []).append(attn.layer_name)
            self.builders = [(backend.get_builder_cls()(spec, names, self.vllm_config, ctx.device), names)
                             for spec, names in groups.items()]
        for layer, attn in self.layers.items():
            attn.bind_kv_cache(self._cache_view(ctx.token_to_kv_pool.layer_storage(layer.layer_id)))
        self.metadata: Dict[str, object] = {}
        self.slot_mapping: Dict[str, torch.Tensor] = {}

    def _vllm_backend(self):
        """The vLLM backend class whose impl and builder run (a real-code mutant gives a patched
        copy's)."""
        return self.backend_cls()

    def _vllm_layer(self, layer, backend):
        """vLLM's Attention for a kit layer, as a model builds it."""
        ctx, rt = self.ctx, self.rt
        extra = {"sinks": layer.sinks_tensor(ctx.device, ctx.dtype)} if layer.sinks else {}
        attn = rt.Attention(
            layer.tp_q_head_num, layer.head_dim, layer.scaling, num_kv_heads=layer.tp_k_head_num,
            cache_config=self.vllm_config.cache_config, logits_soft_cap=layer.logit_cap or None,
            # vLLM's window counts the query's own key: the kit's W (keys p-W..p) is W + 1 keys.
            per_layer_sliding_window=layer.sliding_window_size + 1 if layer.sliding_window_size >= 0 else None,
            prefix=layer_name(layer), attn_backend=backend, **extra)
        self._load_kv_scales(attn, layer)
        return attn.to(ctx.device)

    @staticmethod
    def _load_kv_scales(attn, layer) -> None:
        """The layer's fp8 scales as vLLM's kv-cache quantization loads a checkpoint's
        (quantization/kv_cache.py:117-198); q's the layer's k_scale, as a checkpoint that carries a q_scale
        sets it (one without gets 1.0 there: :171-198), so that a q_scale folded where no query was
        quantized moves the output."""
        if layer.k_scale is None:
            return
        for name, value in (("_k_scale", layer.k_scale), ("_v_scale", layer.v_scale), ("_q_scale", layer.k_scale)):
            getattr(attn, name).fill_(value)
            setattr(attn, f"{name}_float", value)
        attn._k_scale_cpu.fill_(layer.k_scale)
        attn._v_scale_cpu.fill_(layer.v_scale)

    @staticmethod
    def _cache_view(storage: torch.Tensor) -> torch.Tensor:
        """A layer's KV cache as vLLM's runner hands it to bind_kv_cache: the logical [blocks, heads,
        block, 2 * head_dim] view of its physical [blocks, block, heads, 2 * head_dim] (LBNHC), bytes
        for a quantized cache (vLLM allocates fp8 caches as uint8, utils/torch_utils.py:46)."""
        view = storage.permute(0, 2, 1, 3)
        return view.view(torch.uint8) if view.element_size() == 1 else view

    # ---- metadata -----------------------------------------------------------------------------
    def common_metadata(self, common):
        """vLLM's CommonAttentionMetadata of the kit's step description. num_actual_tokens is every
        token the step hands (the slot mapping's length): vLLM passes the padded count under full
        graphs (v1/worker/gpu/model_states/default.py:179-186), the real one eagerly, where the two
        are the same; seq_lens_cpu_upper_bound is exact here (no asynchronous scheduling)."""
        return self.rt.CommonAttentionMetadata(
            query_start_loc=common.query_start_loc, query_start_loc_cpu=common.query_start_loc_cpu,
            seq_lens=common.seq_lens, num_reqs=common.num_reqs, num_actual_tokens=common.slot_mapping.shape[0],
            max_query_len=common.max_query_len, max_seq_len=common.max_seq_len,
            block_table_tensor=common.block_table, slot_mapping=common.slot_mapping,
            seq_lens_cpu_upper_bound=common.seq_lens_cpu)

    def _build(self, batch, capture: bool) -> None:
        """Every builder's metadata for the step, each from a CommonAttentionMetadata of its own
        (as vLLM's runner makes one per KV cache group: a capture build may rewrite its fields)."""
        self.metadata, self.slot_mapping = {}, {}
        for builder, names in self.builders:
            common = self.common_metadata(batch.common)
            with self._running():
                metadata = (builder.build_for_cudagraph_capture(common) if capture
                            else builder.build(common_prefix_len=0, common_attn_metadata=common))
            for name in names:
                self.metadata[name], self.slot_mapping[name] = metadata, batch.common.slot_mapping

    def _running(self) -> contextlib.ExitStack:
        """While vLLM runs (its metadata build and forward): what it needs of torch here
        (backends/vllm/environment.py)."""
        from backends.vllm import environment

        stack = contextlib.ExitStack()
        stack.enter_context(environment.cuda_capability_answered())
        if self.compiles:
            stack.enter_context(environment.flex_compiles())
        return stack

    def init_forward_metadata(self, batch) -> None:
        self._build(batch, capture=False)

    def init_cuda_graph_state(self, max_bs, max_num_tokens) -> None:
        """vLLM's builders allocate their graph buffers at construction, for the config's limits."""

    def build_for_capture(self, batch) -> None:
        self._build(batch, capture=True)

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if not save_kv_cache:
            raise ValueError("vLLM's layers write the step's KV themselves; the kit calls them as a model does")
        t = q.shape[0]
        with self._running(), self.rt.set_forward_context(self.metadata, self.vllm_config,
                                                          slot_mapping=self.slot_mapping):
            out = self._call(self.layers[layer], q, k, v, layer)
        return out.view(t, layer.tp_q_head_num, layer.v_head_dim)

    def _call(self, attn, q, k, v, layer):
        t = q.shape[0]
        return attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1))


# vLLM's Attention layer (the kit calls it as a model does) quantizes the query to fp8 with the layer's
# q_scale (the kit's k_scale, as a checkpoint with its own q_scale sets it) where the impl's
# supports_quant_query_input holds (model_executor/layers/attention/attention.py:470-486, :519-525).
class VllmTritonAttnBackend(VllmBackend):
    """TRITON_ATTN (v1/attention/backends/triton_attn.py): vLLM's unified Triton attention; its KV
    write is vLLM's Triton reshape_and_cache_flash, everywhere."""

    name = "vllm_triton_attn"
    vllm_backend = "TRITON_ATTN"
    triton_kernels = True
    own_kv_writer = "vllm triton_reshape_and_cache_flash (TritonAttentionImpl.do_kv_cache_update, triton_attn.py:834)"
    attention_features = ("sinks",)  # Attention(..., sinks=) (triton_attn.py: TritonAttentionImpl sinks)
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")  # TritonAttentionBackend.supported_kv_cache_dtypes
    # supports_quant_query_input on CUDA (triton_attn.py:553); with q in fp8, V stays fp8 and P is scaled by
    # 2^8 into e4m3 for the PV dot (ops/triton_unified_attention.py:55, :592-599); fp32: tl.dot with no input
    # precision is TF32 on NVIDIA GPUs (triton_unified_attention.py:547).
    numerics = Numerics(q_fp8=ALL, p_fp8=ALL, tf32_dots=ALL, cuda_only=(Q_FP8, P_FP8, TF32))
    # A plain CPU run (CI): its decode kernel splits each request's keys into 16 segments, seconds a
    # layer call in Triton's interpreter; `--case-set smoke` runs every smoke case.
    ci_cases = {"decode": ("gqa_fused_p16_fp32",)}


class VllmFlexAttentionBackend(VllmBackend):
    """FLEX_ATTENTION (v1/attention/backends/flex_attention.py): PyTorch's flex attention, compiled,
    over block masks vLLM builds from the block table; its KV write is the compiled
    reshape_and_cache_flash op (vLLM's Triton kernel of it where `_C` does not load)."""

    name = "vllm_flex_attention"
    vllm_backend = "FLEX_ATTENTION"
    compiles = True
    impl_refuses = {"cap": "logit soft cap: FlexAttentionImpl raises NotImplementedError for it (flex_attention.py:1186)"}

    @classmethod
    def supports_graph(cls, case):
        if not torch.cuda.is_available():
            return ("graphs on CPU: PyTorch's CPU flex attention template refuses the block mask vLLM builds at "
                    "capture (KV indices narrower than the KV cache: torch/_inductor/kernel/flex/flex_cpu.py:322-326); "
                    "its GPU template has no such check")
        return super().supports_graph(case)


class VllmFlashAttnBackend(VllmBackend):
    """FLASH_ATTN (v1/attention/backends/flash_attn.py): vLLM's FlashAttention (FA3 on Hopper, its
    default there), ahead-of-time scheduler metadata and a bounded split count under full graphs."""

    name = "vllm_flash_attn"
    vllm_backend = "FLASH_ATTN"
    cuda_only = True
    attention_features = ("sinks",)  # FA3 only; validate_configuration says so elsewhere
    kv_dtypes = ("fp8_e4m3",)  # FlashAttentionBackend.supported_kv_cache_dtypes
    # supports_quant_query_input on CUDA (flash_attn.py:1163, fa_utils.py:315); FA3's fp8 kernel takes P in
    # e4m3 for its PV product (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, the fp8 path's P conversion).
    numerics = Numerics(q_fp8=ALL, p_fp8=ALL)


class VllmFlashInferBackend(VllmBackend):
    """FLASHINFER (v1/attention/backends/flashinfer.py): FlashInfer's wrappers (or TRT-LLM's kernels
    where vLLM picks them), planned by vLLM's builder."""

    name = "vllm_flashinfer"
    vllm_backend = "FLASHINFER"
    cuda_only = True
    attention_features = ("sinks",)  # only with TRT-LLM kernels; validate_configuration says so elsewhere
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")  # FlashInferBackend.supported_kv_cache_dtypes
    # On SM90 its prefill wrappers take q in the cache's fp8 dtype (flashinfer.py:1157-1166), quantized with
    # the layer's q_scale (maybe_quant_query, :2165-2181), and run FlashInfer's FA3 fp8 prefill (P in e4m3);
    # its decode keeps the model's dtype (:1142-1154). Modes whose batches vLLM sends to prefill only: a verify's
    # rows too, where no TRT-LLM decode kernel is had (FlashInfer's cubins), as the builder then keeps the
    # reorder threshold at one token (:1053-1059).
    numerics = Numerics(q_fp8=("extend", "target_verify", "draft_extend_v2"),
                        p_fp8=("extend", "target_verify", "draft_extend_v2"))

    @classmethod
    def versions(cls):
        return dict(super().versions(), flashinfer=library_version("flashinfer-python"))
