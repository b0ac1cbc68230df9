"""SGLang's own attention backends, unmodified, behind the kit's protocol.

What is mapped, and nothing more (a bug here could hide one in SGLang):
- the kit's context -> the model runner SGLang's constructors read (`_ModelRunner`), and the
  server args they read through SGLang's runtime context (`runtime.install_server_args`);
- the kit's pools -> SGLang's pool interface: the kit's ReqToTokenPool as is (`size`,
  `req_to_token`), the kit's KV pool behind SGLang's readers and `set_kv_buffer`, whose
  location is SGLang's KVWriteLoc (`_KVPool`);
- the kit's batch -> SGLang's own ForwardBatch with its real ForwardMode, bound to a KV
  location plan by SGLang's KVIndexTranslator, and the kit's spec_info -> EagleVerifyInput
  (TARGET_VERIFY) or EagleDraftExtendInput (DRAFT_EXTEND_V2) (`_forward_batch`); a new one
  on every call, over the kit's tensors (views, never copies), so a graph's replays re-read
  the kit's static buffers;
- the kit's layer -> a RadixAttention (one per layer config), called as a model calls it:
  the layer narrows a token-padded EXTEND batch to its real rows itself;
- an MLA case -> the model config SGLang derives for an MLA model, the kit's latent pool behind
  SGLang's own MLATokenToKVPool code, and the DeepSeek model's absorbed call (mla.py);
- the kit's layer sinks -> the gpt-oss model's `sinks` parameter, passed as it passes it
  (models/gpt_oss.py forward_core: `self.attn(q, k, v, forward_batch, sinks=self.sinks)`).
- the kit's EXTEND and MIXED graph runs -> SGLang's breakable-graph context
  (enable_breakable_cuda_graph) over their metadata hooks and forwards, as its prefill graph
  runner holds it at capture and replay (`in_prefill_graph`), and their request tensors cut to
  the batch's rows, as that runner hands them (`prefill_runner_view`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from typing import Optional

import torch

from backends import pinned
from backends.sglang import mla
from kit.engine.numerics import ALL, TF32, Numerics
from kit.engine.profile import SGLANG
from kit.engine.render import REQUEST, STATIC_FIELDS
from kit.modes import ForwardMode
from kit.harness.protocol import AttentionBackend, library_version

PINNED = "0.5.23"
INSTALL = "python -m backends.sglang.install"
# SGLang sizes its decode KV splits by the SM count, 0 without CUDA (srt/utils/common.py:1161),
# and with 0 skips its planner (triton_backend.py:448): an H100 SXM's count runs it on CPU.
NOMINAL_SMS = 132
# The modes SGLang runs under its prefill graph runner, not its decode-shaped ones.
PREFILL_GRAPH_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)
# A batch's per-request fields (the request axis of a graph's static buffers).
REQUEST_FIELDS = tuple(f.name for f in STATIC_FIELDS if f.axis == REQUEST)


def prefill_runner_view(batch):
    """An EXTEND or MIXED batch as SGLang's prefill graph runner hands it to attention: its
    per-request fields those of its batch_size requests, as the runner's static ForwardBatch takes
    them from the scheduler's batch (prefill_cuda_graph_runner.py:1977-2008), where the kit's token
    graph may hold them at full capacity, rows past the batch stale. Its backends' eager EXTEND
    metadata, which the runner runs before every replay, reads them whole: Triton cumsums seq_lens
    into a bs + 1 kv_indptr (triton_backend.py:526), DSA zips seq_lens_cpu with
    extend_seq_lens_cpu strictly (dsa_backend.py init_forward_metadata). Other batches as they are."""
    if batch.forward_mode not in PREFILL_GRAPH_MODES:
        return batch
    n = batch.batch_size
    fields = {name: getattr(batch, name) for name in REQUEST_FIELDS}
    cut = {name: value[:n] for name, value in fields.items() if value is not None and len(value) > n}
    return dataclasses.replace(batch, **cut) if cut else batch


def sglang_problem() -> Optional[str]:
    """Why the pinned sglang cannot be used here, or None."""
    return pinned.pin_problem("sglang", PINNED, INSTALL)


class _ModelConfig:
    """The ModelConfig fields SGLang's attention backends read: one dense (MHA/GQA) model."""

    def __init__(self, ctx, sg):
        layer = ctx.layers[0]  # the kit's layers share heads and head_dim
        self.attention_arch = sg.AttentionArch.MHA
        self.context_len = ctx.context_len  # the model's; the req_to_token pool's rows may be wider
        self.num_attention_heads = layer.tp_q_head_num
        self.num_key_value_heads = layer.tp_k_head_num
        self.head_dim = self.v_head_dim = self.swa_v_head_dim = layer.head_dim
        self.is_encoder_decoder = self.is_multimodal = False
        # A plain config: hybrid_arch.mambaish_config() isinstance-checks it and finds no hybrid.
        self.hf_config = self.hf_text_config = sg.PretrainedConfig(architectures=["KitForCausalLM"])
        self.linear_attn_registry_result = None

    def get_max_num_attention_heads(self):
        return self.num_attention_heads

    def get_num_kv_heads(self, tensor_parallel_size, dcp_size=1):
        return self.num_key_value_heads // (tensor_parallel_size // dcp_size)


class _KVPool:
    """The kit's KV pool behind SGLang's KV-cache interface (MHATokenToKVPool's readers and writer)."""

    start_layer = 0

    def __init__(self, pool, sg):
        self.pool = pool
        self.size, self.page_size, self.dtype = pool.size, pool.page_size, pool.dtype
        self.head_num, self.head_dim = pool.head_num, pool.head_dim
        self.unwrap_write_loc = sg.unwrap_write_loc
        # MHATokenToKVPool's default (memory_pool.py:2289): the kit's KV cache is unquantized.
        self.quant_method = sg.UnquantizedKVCacheMethod()

    def get_kv_cache_quant_method(self):
        return self.quant_method

    def get_key_buffer(self, layer_id):
        return self.pool.get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id):
        return self.pool.get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id):
        return self.pool.get_kv_buffer(layer_id)

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, k_scale=None, v_scale=None):
        """`loc_info`: a KVWriteLoc or a bare location tensor (memory_pool.py:1880, :1958); the
        scales (passed by FlashInferAttnBackend) are those of a quantized KV cache, never the kit's."""
        if k_scale is not None or v_scale is not None:
            raise ValueError("KV scales given, but the kit's KV cache is not quantized")
        loc, _, _ = self.unwrap_write_loc(loc_info)
        self.pool.set_kv_buffer(layer, loc, cache_k, cache_v)


# What SGLang's MHATokenToKVPool does itself for a quantized (fp8) cache, taken from its class (and
# KVCache's): its readers (the stored bytes viewed as the fp8 dtype) and its writer (k / k_scale,
# cast to fp8, stored as bytes), run over the kit's buffers.
MHA_POOL_CODE = ("get_key_buffer", "_get_key_buffer", "get_value_buffer", "_get_value_buffer", "get_kv_buffer",
                 "set_kv_buffer", "_store_kv_layer", "_check_physical_write_loc", "requires_physical_write_loc",
                 "is_quantized_kv_cache")


class _QuantizedKVPoolState(_KVPool):
    """The state SGLang's MHATokenToKVPool code reads, over the kit's fp8 pool: per layer the K and V
    buffers viewed as bytes (its store_dtype, memory_pool.py:2029), dtype the fp8 one."""

    layer_transfer_counter = None  # no layer-wise host-to-device transfer in flight
    use_hnd = False
    kv_cache_layout = "nhd"
    alt_stream = None

    def __init__(self, pool, sg):
        super().__init__(pool, sg)
        self.store_dtype = torch.uint8
        self.k_buffer = [b.view(torch.uint8) for b in pool.k_buffer]
        self.v_buffer = [b.view(torch.uint8) for b in pool.v_buffer]
        self.v_head_dim = pool.head_dim
        self.row_dim = self.v_row_dim = pool.head_num * pool.head_dim
        self.device = pool.device
        self.device_module = torch.get_device_module(pool.device)


def kv_pool(pool, sg, sglang_pool):
    """The kit's dense pool as SGLang's backends see it: a quantized one behind SGLang's own
    MHATokenToKVPool code (MHA_POOL_CODE, taken from `sglang_pool`)."""
    if not pool.quantized:
        return _KVPool(pool, sg)
    code = {name: inspect.getattr_static(sglang_pool, name) for name in MHA_POOL_CODE}
    return type("QuantizedKVPool", (_QuantizedKVPoolState,), code)(pool, sg)


class _ModelRunner:
    """The model-runner attributes SGLang's attention backends read at construction."""

    def __init__(self, ctx, sg, attention_backend: str, mla_pool_code=None, draft_worker: bool = False):
        layer = ctx.layers[0]  # the kit's layers share heads, head_dim and the MLA ranks
        self.device = ctx.device
        self.gpu_id = ctx.device.index or 0
        self.dtype = ctx.dtype
        self.kv_cache_dtype = ctx.kv_cache_dtype
        self.page_size = ctx.page_size
        self.model_config = _ModelConfig(ctx, sg)
        self.use_mla_backend = layer.is_mla
        if self.use_mla_backend:
            mla.mla_config(self.model_config, layer, sg)
        # One window for the model's window layers (kit and SGLang count it alike: a query at p
        # sees keys p-W..p); None without one. The kit's layers have at most one window size.
        windows = {layer.sliding_window_size for layer in ctx.layers if layer.sliding_window_size >= 0}
        self.sliding_window_size = max(windows) if windows else None
        # The draft model's runner builds the multi-step draft backends (a draft worker's); it decides
        # the verify-mask scratch and the sliding-window pool's reads, neither of which the kit's pool has.
        self.is_draft_worker = draft_worker
        self.spec_algorithm = sg.SpeculativeAlgorithm.EAGLE if ctx.speculative else sg.SpeculativeAlgorithm.NONE
        self.prefill_attention_backend_str = self.decode_attention_backend_str = attention_backend
        self.server_args = sg.get_context().server_args
        self.speculative = ctx.speculative
        self.req_to_token_pool = ctx.req_to_token_pool
        self.token_to_kv_pool = (mla.pool_class(mla_pool_code)(ctx.token_to_kv_pool, layer) if self.use_mla_backend
                                 else kv_pool(ctx.token_to_kv_pool, sg, sg.MHATokenToKVPool))
        self.token_to_kv_pool_allocator = _Allocator(self.token_to_kv_pool)
        # As ModelRunner.init_kv_index_translator (model_runner.py:950).
        self.kv_index_translator = sg.KVIndexTranslator(
            req_to_token=ctx.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            token_to_kv_pool=self.token_to_kv_pool, page_size=ctx.page_size, device=ctx.device,
            is_draft_worker=self.is_draft_worker)

    def decode_num_tokens_per_req(self, num_draft_tokens=None):
        """Query tokens per request of a decode-shaped step: the drafts on a speculative target."""
        return self.speculative.num_draft_tokens if self.speculative else 1


class _Allocator:
    """The token allocator, as far as the translator asks: its page size and its pool."""

    def __init__(self, pool):
        self.page_size = pool.page_size
        self.pool = pool

    def get_kvcache(self):
        return self.pool


class SGLangBackend(AttentionBackend):
    """The eager protocol, common to SGLang's backends; subclasses name the one they wrap."""

    sglang_class: str = ""  # module:attr in sglang
    server_name: str = ""  # its --attention-backend name
    server_fields: dict = {}  # its own server args, besides those install_server_args sets
    profile = SGLANG
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY,
             ForwardMode.DRAFT_EXTEND_V2)

    @classmethod
    def installed_problem(cls) -> Optional[str]:
        return sglang_problem()

    @classmethod
    def load_engine(cls) -> None:
        """What a run imports of SGLang (the offline bundle traces it): the adapter's runtime, the class wrapped."""
        importlib.import_module("backends.sglang.runtime")
        module, _, attr = cls.sglang_class.partition(":")
        getattr(importlib.import_module(module), attr)
    # Why the class does not run DRAFT_DECODE: SGLang runs the draft's steps in a multi-step wrapper.
    draft_decode_reason = ""
    draft_worker = False  # built by the draft model's runner
    # Forward gets a token-padded EXTEND batch whole: SGLang's RadixAttention runs the backend on
    # its real rows and zeroes the rest (graph_utils.py:146, :161). Its piecewise prefill graphs
    # leave attention out of the capture (the breakable backend runs it eagerly).
    real_rows_only = False
    extend_capture = False
    # Whether the step being run is one of SGLang's prefill graphs (set by the metadata hook that
    # prepares it): its runner, breakable on CUDA by default, holds enable_breakable_cuda_graph() over
    # the metadata and the forward, at capture and at every replay (breakable_cuda_graph_backend.py
    # capture_session, replay_session; prefill_cuda_graph_runner.py execute), and backends branch on
    # it (dsa_backend.py set_dsa_prefill_impl keeps such a batch off its dense MHA_ONE_SHOT path).
    in_prefill_graph = False

    @classmethod
    def versions(cls):
        return {"sglang": library_version("sglang"), "triton": library_version("triton")}

    @classmethod
    def supports(cls, case) -> Optional[str]:
        return sglang_problem() or cls._mode_problem(case)

    @classmethod
    def _mode_problem(cls, case) -> Optional[str]:
        """Why the wrapped class does not run the case's mode, or None."""
        return cls.draft_decode_reason if case.mode is ForwardMode.DRAFT_DECODE else None

    def __init__(self, ctx):
        super().__init__(ctx)
        from backends.sglang import runtime as sg

        self.sg = sg
        sg.install_server_args(self.server_name, ctx.device, ctx.page_size, ctx.speculative, **self.server_fields)
        self.runner = _ModelRunner(ctx, sg, self.server_name, self._mla_pool_code(), self.draft_worker)
        self.impl = self._make_impl()
        # An MLA layer as DeepSeek's `attn_mqa`: head_dim = rank + rope, one KV head, v_head_dim = rank
        # (models/deepseek_v2.py:2183).
        self.layers = {layer: sg.RadixAttention(
            num_heads=layer.tp_q_head_num, head_dim=layer.head_dim, scaling=layer.scaling,
            num_kv_heads=layer.tp_k_head_num, layer_id=layer.layer_id, logit_cap=layer.logit_cap,
            sliding_window_size=layer.sliding_window_size, v_head_dim=layer.v_head_dim) for layer in ctx.layers}
        for layer, attn in self.layers.items():
            if layer.k_scale is not None:  # as a model's fp8 KV scales load (quantization/kv_cache.py:80)
                attn.k_scale = torch.tensor(layer.k_scale, dtype=torch.float32, device=ctx.device)
                attn.v_scale = torch.tensor(layer.v_scale, dtype=torch.float32, device=ctx.device)
                attn.k_scale_float, attn.v_scale_float = layer.k_scale, layer.v_scale
        # The gpt-oss model's sinks parameter, in the dtype it gives every backend but trtllm_mha
        # (models/gpt_oss.py:428): bf16 holds the kit's sink logits exactly (kit.engine.layer.SINK_GRID).
        self.sinks = {layer: layer.sinks_tensor(ctx.device, torch.bfloat16) for layer in ctx.layers if layer.sinks}

    def _mla_pool_code(self):
        """The class whose MLA pool code runs over the kit's latent (a real-code mutant gives a
        patched copy's)."""
        return self.sg.MLATokenToKVPool

    def _impl_class(self):
        """The SGLang class wrapped (a real-code mutant gives a patched copy's)."""
        module, _, attr = self.sglang_class.partition(":")
        return getattr(importlib.import_module(module), attr)

    def _make_impl(self):
        return self._impl_class()(self.runner)

    def _attention_backend(self, batch):
        """The backend a forward runs under (its ForwardContext's): the wrapped one."""
        return self.impl

    def _forward_batch(self, b, in_capture: bool = False):
        sg = self.sg
        b = prefill_runner_view(b)
        fb = sg.ForwardBatch(
            forward_mode=sg.MODES[b.forward_mode.value], batch_size=b.batch_size, input_ids=None,
            req_pool_indices=b.req_pool_indices, seq_lens=b.seq_lens, seq_lens_cpu=b.seq_lens_cpu,
            seq_lens_sum=b.seq_lens_sum, out_cache_loc=b.out_cache_loc, positions=b.positions,
            extend_num_tokens=b.extend_num_tokens, extend_seq_lens=b.extend_seq_lens,
            extend_prefix_lens=b.extend_prefix_lens, extend_start_loc=b.extend_start_loc,
            extend_seq_lens_cpu=b.extend_seq_lens_cpu, extend_prefix_lens_cpu=b.extend_prefix_lens_cpu,
            # The real tokens of a token-padded EXTEND batch, read by RadixAttention (graph_utils.py:146).
            global_num_token_non_padded_cpu=b.extend_num_tokens,
            spec_info=self._spec_info(b))
        translator = self.runner.kv_index_translator
        # A batch built outside ForwardBatch.init_new binds its own KV location plan; a capture
        # batch over a runner's buffers binds those (kv_index_translator.py:398, :678).
        (translator.bind_runner_slots if in_capture else translator.bind_own_plan)(fb)
        return fb

    def _layer_batch(self, batch):
        """The ForwardBatch a layer's call is handed: a new one over the kit's batch."""
        return self._forward_batch(batch)

    def _model_args(self, batch, num_tokens: int) -> dict:
        """What else the model hands its attention call besides q, k, v and their parts (a sparse
        model's top-k selection)."""
        return {}

    def _spec_info(self, b):
        s, sg = b.spec_info, self.sg
        if b.forward_mode is ForwardMode.TARGET_VERIFY:
            return sg.EagleVerifyInput(
                draft_token=None, custom_mask=s.custom_mask, positions=b.positions, retrieve_index=None,
                retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
                spec_steps=s.num_steps, topk=s.topk, draft_token_num=s.draft_token_num,
                capture_hidden_mode=sg.CaptureHiddenMode.FULL, seq_lens_sum=b.seq_lens_sum,
                seq_lens_cpu=b.seq_lens_cpu)
        if b.forward_mode is ForwardMode.DRAFT_EXTEND_V2:
            # Every draft accepted: SGLang keeps num_accept_tokens = num_correct_drafts + 1 per request
            # (eagle_info.py:332); its draft-extend runner fills both (FlashInfer reads them).
            info = sg.EagleDraftExtendInput(
                num_tokens_per_req=s.num_tokens_per_bs, num_accept_tokens=s.extend_seq_lens_tensor,
                num_correct_drafts=s.extend_seq_lens_tensor - 1, num_accept_tokens_cpu=s.extend_seq_lens_cpu)
            # Set by SGLang's draft-extend runner, not dataclass fields
            # (eagle_draft_extend_cuda_graph_runner.py:628).
            info.extend_seq_lens_tensor = s.extend_seq_lens_tensor
            info.extend_seq_lens_cpu = s.extend_seq_lens_cpu
            return info
        if b.forward_mode is ForwardMode.DRAFT_DECODE:
            # The draft input prepare_for_draft makes (eagle_worker_common.py:241-374); its kv_indptr and
            # kv_indices the multi-step wrapper sets per step, its other fields are the model's, not attention's.
            return sg.EagleDraftInput()
        return None

    def init_forward_metadata(self, batch) -> None:
        self.in_prefill_graph = False
        self.impl.init_forward_metadata(self._forward_batch(batch))

    def _prefill_graph_scope(self):
        """SGLang's breakable-graph context where the step is one of its prefill graphs, else none."""
        return self.sg.enable_breakable_cuda_graph() if self.in_prefill_graph else contextlib.nullcontext()

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        sg = self.sg
        t = q.shape[0]
        if layer.is_mla:
            q, k, v, parts = mla.absorbed_call(self.server_name, q, k, v, layer.kv_lora_rank)
        else:
            q, parts = q.reshape(t, -1), {}
        if layer in self.sinks:
            parts["sinks"] = self.sinks[layer]
        parts.update(self._model_args(batch, t))
        context = sg.ForwardContext(attn_backend=self._attention_backend(batch))
        with self._prefill_graph_scope(), sg.forward_context(context):
            out = self.layers[layer](q, k, v, self._layer_batch(batch), save_kv_cache=save_kv_cache, **parts)
        return out.view(t, layer.tp_q_head_num, layer.v_head_dim)


class _GraphHooks:
    """SGLang 0.5.23's two-phase graph hooks, for the backends that have them."""

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.impl.init_cuda_graph_state(max_bs, max_num_tokens)

    def get_cuda_graph_seq_len_fill_value(self):
        return self.impl.get_cuda_graph_seq_len_fill_value()

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        fb = self._forward_batch(batch, in_capture)
        self.in_prefill_graph = batch.forward_mode in PREFILL_GRAPH_MODES
        if self.in_prefill_graph:
            # SGLang's prefill graphs (breakable, piecewise) prepare attention with the eager
            # metadata at capture and before every replay (prefill_cuda_graph_runner.py:1234,
            # :1256); out_graph is for the decode-shaped runners.
            with self._prefill_graph_scope():
                self.impl.init_forward_metadata(fb)
        else:
            self.impl.init_forward_metadata_out_graph(fb, in_capture=in_capture)

    def init_forward_metadata_in_graph(self, batch):
        with self._prefill_graph_scope():
            self.impl.init_forward_metadata_in_graph(self._forward_batch(batch))


class SGLangTritonBackend(_GraphHooks, SGLangBackend):
    """Dense and MLA models alike: TritonAttnBackend reads the model config's attention_arch
    (triton_backend.py:243) and writes an MLA latent row through the pool's set_kv_buffer."""

    name = "sglang_triton"
    sglang_class = "sglang.srt.layers.attention.triton_backend:TritonAttnBackend"
    server_name = "triton"
    attention_kinds = ("dense", "mla")
    # fp8 KV: written by SGLang's own pool code over the kit's buffers (kv_pool; MLA: the backend
    # divides by k_scale before the pool's write, triton_backend.py:1721), read with the layer's scales.
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    attention_features = ("sinks",)  # forward_extend / forward_decode take `sinks` (triton_backend.py:1677, :2296)
    # Over an fp8 cache its kernels cast q to the cache's dtype, no scale, for the dot with a cached key
    # (kernels/ops/attention/decode_attention.py:661 `q.to(K_Buffer.dtype.element_ty)`, extend_attention.py:619
    # `q.to(k.dtype)`) and cast p to it for PV (decode_attention.py:762, extend_attention.py:712 `p.to(v.dtype)`);
    # the extend kernel attends the step's new tokens as handed, with q as handed (forward_extend hands k/v,
    # triton_backend.py:1835-1840; extend_attention.py:795 `tl.dot(q, k)`), in every mode it serves (EXTEND,
    # MIXED, TARGET_VERIFY, DRAFT_EXTEND_V2; DECODE reads the new token from the pool). fp32: tl.dot with no
    # input precision is TF32 on NVIDIA GPUs (extend_attention.py:619, decode_attention.py:692). Its decode
    # (DECODE, DRAFT_DECODE) takes none of these where each query head has a KV head of its own: that kernel
    # (decode_attention.py:389) sums q * k and p * v in float32, no cast, no dot; and the grouped decode splits
    # MLA's rope dot off uncast (decode_attention.py:692, `tl.dot(qpe, kpe.to(qpe.dtype))`) at the widths it
    # splits (576, 288: every MLA width it decodes here, mla.triton_decode_width_problem). p is cast against
    # its split's running maximum (decode_attention.py:757), not the row's: P_CAST's envelope covers it.
    decodes = ("decode", "draft_decode")
    numerics = Numerics(q_cast=ALL, p_cast=ALL, new_tokens_as_handed=("extend", "mixed", "target_verify",
                                                                      "draft_extend_v2"),
                        rope_as_handed=decodes, tf32_dots=ALL, grouped_only=decodes, cuda_only=(TF32,))
    # TritonAttnBackend declares needs_cpu_seq_lens = False (triton_backend.py:153): SGLang's scheduler then
    # hands it no host copies at all, seq_lens_cpu and seq_lens_sum None (managers/overlap_utils.py:615-619),
    # and its metadata over-allocates (:903-905, :1018-1020): the kit hands None as SGLang does.
    host_mirrors = ()
    # A plain CPU run (CI) gives it one short case per mode: in Triton's interpreter SGLang's
    # kernels take 5-60 s a run. `--case-set smoke` runs every smoke case.
    # MLA: the small-rank EXTEND and TARGET_VERIFY cases; DECODE has none here (its kernel does not tile rank 32 + rope 16, and
    # the DeepSeek-width smoke case takes ~100 s a run in the interpreter). Sinks: the short chain verify
    # case, where they reach SGLang's extend kernel as the gpt-oss model passes them.
    ci_cases = {"decode": ("mqa_p1_shuf",), "extend": ("mqa_p1_shuf", "mla_r32_h16_ragged_p16_fp32"),
                "target_verify": ("mha_bs1_chain4_window_p64_inter", "mla_r32_h16_chain4_p16_fp32",
                                  "gqa_chain4_window_sinks_hybrid_p16_fp32"),
                "draft_extend_v2": ("mqa_draft3_p1_shuf",), "mixed": ("mqa_chunk_p1_shuf",)}

    draft_decode_reason = ("DRAFT_DECODE: SGLang runs the draft's steps in TritonMultiStepDraftBackend "
                           "(triton_backend.py:2504), a TritonAttnBackend per step: backend sglang_triton_draft")

    @classmethod
    def supports(cls, case):
        interpreted_bf16 = case.dtype == "bf16" and not torch.cuda.is_available()
        return super().supports(case) or (
            "bf16 on CPU: Triton's interpreter computes bf16 tl.dot wrong (CPU runs fp16/fp32)" if interpreted_bf16
            else mla.triton_decode_width_problem(case))

    def __init__(self, ctx):
        super().__init__(ctx)
        for backend in self._triton_backends():
            if backend.device_core_count <= 0:  # read at :315, used by get_num_kv_splits (:448)
                backend.device_core_count = NOMINAL_SMS

    def _triton_backends(self) -> list:
        """The TritonAttnBackends wrapped."""
        return [self.impl]


class _MultiStepDraft:
    """SGLang's multi-step EAGLE draft decode: the wrapper DraftBackendFactory builds for the draft
    worker (speculative/draft_utils.py:226, :250), one attention backend per step over shared
    buffers, built with (runner, topk, speculative_num_steps). Its metadata is built once for every
    step (init_forward_metadata; a graph's: the draft graph runner's init_cuda_graph_state(max_bs,
    max_bs * topk), out_graph before the capture and every replay, in_graph in the graph,
    eagle_draft_cuda_graph_runner.py:164, :531, :738); step i's forward runs under attn_backends[i],
    as EagleDraftWorker.draft_forward runs it (eagle_worker_v2.py:839), over a DECODE batch of the
    step's write slots."""

    modes = (ForwardMode.DRAFT_DECODE,)
    draft_worker = True
    single_step = ""  # the backend that runs the other modes in the wrapped backend's class

    @classmethod
    def _mode_problem(cls, case):
        if case.mode is ForwardMode.DRAFT_DECODE:
            return None
        return (f"{case.mode.value}: this is SGLang's multi-step draft wrapper, which runs the draft's decode "
                f"steps only; the one-step modes are backend {cls.single_step}'s")

    def _make_impl(self):
        spec = self.ctx.speculative
        return self._impl_class()(self.runner, spec.topk, spec.num_steps)

    def _attention_backend(self, batch):
        return self.impl.attn_backends[batch.spec_info.draft_step]

    def get_cuda_graph_seq_len_fill_value(self):
        # The draft graph runner's (eagle_draft_cuda_graph_runner.py: attn_backends[0]'s).
        return self.impl.attn_backends[0].get_cuda_graph_seq_len_fill_value()


class SGLangTritonDraftBackend(_MultiStepDraft, SGLangTritonBackend):
    name = "sglang_triton_draft"
    sglang_class = "sglang.srt.layers.attention.triton_backend:TritonMultiStepDraftBackend"
    single_step = "sglang_triton"
    # A plain CPU run: one short chain (SGLang's kernels in Triton's interpreter: a tree takes 50-150 s a run).
    ci_cases = {"draft_decode": ("gqa_chain3_p16_fp32",)}

    def _triton_backends(self):
        return list(self.impl.attn_backends)


class SGLangTorchNativeBackend(SGLangBackend):
    """No graph hooks: TorchNativeAttnBackend has only the eager init_forward_metadata
    (torch_native_backend.py:50); SGLang disables CUDA graphs with it (attention_hook.py:124)."""

    name = "sglang_torch_native"
    sglang_class = "sglang.srt.layers.attention.torch_native_backend:TorchNativeAttnBackend"
    server_name = "torch_native"
    draft_decode_reason = ("DRAFT_DECODE: SGLang has no multi-step draft backend for torch_native "
                           "(speculative/draft_utils.py:98, create_decode_backend's map)")
    # No fp8 KV (kv_dtypes left empty): TorchNativeAttnBackend never reads layer.k_scale / v_scale.

    @classmethod
    def supports(cls, case):
        return super().supports(case) or (
            "TorchNativeAttnBackend has no verify path: it never reads spec_info, so no custom (tree) mask "
            "(torch_native_backend.py forward_extend)" if case.mode is ForwardMode.TARGET_VERIFY else
            "attention sinks: TorchNativeAttnBackend's forward_extend / forward_decode take no `sinks` "
            "(torch_native_backend.py:279, :338)" if case.sinks else None)


class SGLangFlexAttentionBackend(SGLangBackend):
    """TorchFlexAttnBackend (`--attention-backend flex_attention`): PyTorch's flex attention,
    compiled, one request at a time, block masks built per request in init_forward_metadata.
    No graph hooks (no init_cuda_graph_state), no verify path."""

    name = "sglang_flex_attention"
    sglang_class = "sglang.srt.layers.attention.torch_flex_backend:TorchFlexAttnBackend"
    server_name = "flex_attention"
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND)  # its metadata builds masks for these two only (torch_flex_backend.py:40-67)
    # On CPU each new shape compiles a flex kernel in C++ (tens of seconds cold): CI runs one short case.
    ci_cases = {"decode": ("mqa_p1_shuf",)}

    @classmethod
    def supports(cls, case):
        return super().supports(case) or (
            "attention sinks: TorchFlexAttnBackend's forward_extend / forward_decode take no `sinks` "
            "(torch_flex_backend.py:242, :288)" if case.sinks else None)


SGLANG_FLASHINFER_NO_SINKS = ("attention sinks: FlashInferAttnBackend's forward_extend / forward_decode take no "
                              "`sinks` (flashinfer_backend.py:1357, :1521)")


class SGLangFlashInferBackend(_GraphHooks, SGLangBackend):
    name = "sglang_flashinfer"
    sglang_class = "sglang.srt.layers.attention.flashinfer_backend:FlashInferAttnBackend"
    server_name = "flashinfer"
    draft_decode_reason = ("DRAFT_DECODE: SGLang runs the draft's steps in FlashInferMultiStepDraftBackend "
                           "(flashinfer_backend.py:2442), a FlashInferAttnBackend per step: backend "
                           "sglang_flashinfer_draft")
    # fp8 KV: its wrappers are planned with the cache's dtype (flashinfer_backend.py:384) and run with
    # the layer's k_scale_float / v_scale_float (:1437); the write is SGLang's pool code (kv_pool).
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    # EXTEND and DRAFT_EXTEND_V2: the ragged pass attends the step's new tokens as handed, before the pool's
    # write (forward_extend, flashinfer_backend.py:1482-1490), the paged pass the prefix as stored.
    numerics = Numerics(new_tokens_as_handed=("extend", "draft_extend_v2"))

    @classmethod
    def versions(cls):
        return dict(super().versions(), flashinfer=library_version("flashinfer-python"))

    @classmethod
    def supports(cls, case):
        if not torch.cuda.is_available():
            return super().supports(case) or (SGLANG_FLASHINFER_NO_SINKS if case.sinks else
                                              "FlashInferAttnBackend runs on CUDA GPUs only; no CUDA device here")
        from backends import flashinfer  # FlashInfer itself: SGLang's backend needs it as ours does

        problem = super().supports(case) or (SGLANG_FLASHINFER_NO_SINKS if case.sinks else flashinfer.UNAVAILABLE)
        if problem is None and case.dtype not in flashinfer.DTYPES:
            problem = (f"{case.dtype}: FlashInferAttnBackend plans FlashInfer's wrappers in the model's dtype, and "
                       f"FlashInfer has no {case.dtype} kernels (its JIT raises KeyError: torch.float32)")
        return problem


class SGLangFlashInferDraftBackend(_MultiStepDraft, SGLangFlashInferBackend):
    name = "sglang_flashinfer_draft"
    sglang_class = "sglang.srt.layers.attention.flashinfer_backend:FlashInferMultiStepDraftBackend"
    single_step = "sglang_flashinfer"

    @classmethod
    def supports(cls, case):
        return super().supports(case) or (
            "sliding-window layers: FlashInferMultiStepDraftBackend hands each step's FlashInferAttnBackend one "
            "kv_indptr buffer, which asserts one wrapper (flashinfer_backend.py:482), and a window model plans two"
            if case.window >= 0 or case.hybrid else None)


class SGLangFlashInferMLABackend(_GraphHooks, SGLangBackend):
    """FlashInferMLAAttnBackend: what SGLang builds for `--attention-backend flashinfer` on an MLA
    model (attention_registry.py:55-77). Its graph hooks capture DECODE and TARGET_VERIFY only:
    DRAFT_EXTEND_V2 raises "Invalid mode" at capture (flashinfer_mla_backend.py:393).

    The DeepSeek model runs an EXTEND batch absorbed (over the latent) with this backend when
    its ragged prefill is off or the batch has a prefix below the chunked-prefix threshold
    (deepseek_common/attention_backend_handler.py _handle_attention_backend); otherwise its
    normal path runs dense MHA over K/V decompressed from the latent, outside the latent pool.
    `--flashinfer-mla-disable-ragged` makes every EXTEND batch take the absorbed path, which is
    what the kit's MLA cases test."""

    name = "sglang_flashinfer_mla"
    sglang_class = "sglang.srt.layers.attention.flashinfer_mla_backend:FlashInferMLAAttnBackend"
    server_name = "flashinfer"
    draft_decode_reason = ("DRAFT_DECODE: SGLang runs an MLA draft's steps in FlashInferMLAMultiStepDraftBackend "
                           "(flashinfer_mla_backend.py:1184, topk 1 only), which the kit does not wrap")
    server_fields = {"flashinfer_mla_disable_ragged": True}
    attention_kinds = ("mla",)  # SGLang builds it for MLA models only
    # No fp8 KV (kv_dtypes left empty): FlashInferMLAAttnBackend plans its wrappers with the model's
    # dtype as the KV data type (flashinfer_mla_backend.py:1001), never the cache's.

    @classmethod
    def versions(cls):
        return dict(super().versions(), flashinfer=library_version("flashinfer-python"))

    @classmethod
    def supports(cls, case):
        from backends.flashinfer_mla import FlashInferMLABackend  # FlashInfer's own MLA limits, as ours

        problem = super().supports(case)
        if problem is None and case.mode is ForwardMode.TARGET_VERIFY and case.topk > 1:
            problem = ("tree verify (topk > 1): FlashInferMLAAttnBackend plans verify causal, with no custom mask "
                       "(flashinfer_mla_backend.py:1110), and its draft backend refuses topk > 1 (:1197)")
        return problem or FlashInferMLABackend.supports(case)
