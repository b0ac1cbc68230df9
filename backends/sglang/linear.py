"""SGLang's own linear-attention backend (GDNAttnBackend, sglang 0.5.23), unmodified, behind the
kit's recurrent protocol (kit.harness.recurrent), run as a model runs it: inside SGLang's
HybridLinearAttnBackend, which routes a layer to its full-attention backend or its linear one
(layers/attention/attention_registry.py builds it so for every hybrid GDN model), a layer called as
Qwen3-Next's GatedDeltaNet calls its RadixLinearAttention (mixed_qkv before the conv, a, b).

What is mapped, and nothing more:
- the kit's state pool -> SGLang's MambaPool: its own State dataclass over the kit's buffers (views;
  SpeculativeState, with the intermediate pools, where the run verifies drafts) and its own pool code
  (`mamba2_layer_cache`, `clear_slots`) taken from its class (`_mamba_pool`);
- the kit's batch -> SGLang's ForwardBatch over request rows of SGLang's HybridReqToTokenPool code,
  whose mapping (`req_index_to_mamba_index_mapping`) holds each request's state slot, as its
  allocator leaves it; padded rows of a graph batch carry request row 0, as SGLang's runner pads;
- the scheduler's clear of a new request's slot (HybridReqToTokenPool.alloc sets mamba_needs_clear,
  then MambaPool.clear_slots before the forward): played here, through SGLang's own clear_slots;
- the scheduler's copy of each request's last kept draft after a verify: the kit's (StatePool.commit).
  SGLang's own (HybridLinearAttnBackend.update_mamba_state_after_mtp_verify) scatters with kernels
  that take its pools as it allocates them, contiguous in its layout
  (mamba_state_scatter_triton.py: "src tensor must be contiguous"), which views over the kit's pools
  are not (each layer's tail rows; KDA's conv windows transposed), and launch on CUDA/XPU only;
- a case without full-attention layers -> HybridLinearAttnBackend over a full-attention side that
  owns no layer (`_NoFullLayers`, raising if a layer is routed to it).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Optional

import torch

from backends.qwen3_next import qwen3_next_config
from backends.sglang.adapter import sglang_problem
from kit.engine.kinds.recurrent import GRAPH_MODES
from kit.engine.numerics import ALL, PREFILL, Numerics
from kit.engine.profile import SGLANG
from kit.harness.protocol import library_version
from kit.modes import ForwardMode

GDN_BACKEND = "sglang.srt.layers.attention.linear.gdn_backend"
HYBRID = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
LINEAR_UTILS = "sglang.srt.layers.attention.linear.utils"
RADIX_LINEAR = "sglang.srt.layers.radix_linear_attention"
# What SGLang's pools do themselves, taken from their classes and run over the kit's buffers.
MAMBA_POOL_CODE = ("mamba2_layer_cache", "clear_slots", "_should_fuse_slot_ops", "_conv_fuse_ok", "SpeculativeState")
REQ_POOL_CODE = ("get_mamba_indices", "translate_mamba_indices", "mamba_translate_is_fusable", "mamba_v2p_table",
                 "mamba2_layer_index", "mamba2_layer_cache")


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


def cpu_prefill_reason(case, backend: str, prefill: str) -> str:
    """Why `backend`'s prefill (`prefill`, under kernels/ops/attention/) does not run on CPU: its first kernel."""
    return (f"{case.mode.value} on CPU: {backend}'s prefill ({prefill}) normalizes q and k with l2norm_fwd, "
            "whose kernel loads through block pointers (fla/l2norm.py:65 tl.make_block_ptr), which Triton's "
            "interpreter no longer implements; CUDA GPUs only")


class SGLangLinearBackend:
    """What every SGLang linear-attention adapter shares: SGLang's pools over the kit's, its
    HybridLinearAttnBackend around the kind's backend (`_linear_backend`), the ForwardBatch, the
    scheduler's clear of a new request's slot, and the rules common to SGLang's recurrent kinds.
    A kind's adapter adds its backend, its layers (`_layers`) and the call a model makes
    (`forward`), and the modes it does not run (`_kind_problem`)."""

    profile = SGLANG
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)
    # Its Triton causal_conv1d kernels (prefill and update, on every platform: the prefill's input is a
    # transposed view, which makes causal_conv1d_fn pick Triton on CUDA too) multiply half-precision
    # taps in their dtype and write the output in the model's dtype; the chunked (extend) kernels round
    # to it in their tiles (state_cast: GDN's and KDA's chunk state for the q dot, Mamba2's chunked SSD).
    # A kind whose prefill l2-normalizes q and k before its kernels adds qk_cast (PREFILL).
    numerics = Numerics(conv_products=ALL, conv_cast=ALL, state_cast=PREFILL)
    engine_modules: tuple = ()  # the SGLang modules of the kind's backend (load_engine)

    @classmethod
    def versions(cls):
        return {"sglang": library_version("sglang"), "triton": library_version("triton")}

    @classmethod
    def installed_problem(cls) -> Optional[str]:
        return sglang_problem()

    @classmethod
    def load_engine(cls) -> None:
        """What a run imports of SGLang (the offline bundle traces it): what every kind's runs import,
        and the kind's own (`engine_modules`)."""
        from importlib import import_module

        shared = ("backends.sglang.runtime", HYBRID, MEMORY_POOL, LINEAR_UTILS, RADIX_LINEAR)
        for module in shared + tuple(cls.engine_modules):
            import_module(module)

    @classmethod
    def supports(cls, case) -> Optional[str]:
        problem = sglang_problem() or cls._kind_problem(case)
        if problem:
            return problem
        if case.mode in GRAPH_MODES and 0 in case.prefix:
            return (f"{case.mode.value} with a new request (prefix 0): SGLang decodes a request after its prefill; "
                    "its decode kernel reads every row's slot (no has-initial-state input), which the scheduler "
                    "cleared when the request was allocated (HybridReqToTokenPool.alloc, mamba_needs_clear)")
        return None

    @classmethod
    def _kind_problem(cls, case) -> Optional[str]:
        """Why the kind's backend does not run `case`, or None."""
        raise NotImplementedError

    def __init__(self, ctx):
        from backends.sglang import runtime as sg
        from importlib import import_module

        hybrid = import_module(HYBRID)
        memory_pool = import_module(MEMORY_POOL)
        self.sg, self.device, self.pool = sg, ctx.device, ctx.state_pool
        # SGLang's default for a GPU of 60-160 GB (arg_groups/memory_hook.py: the H100's, the H200's),
        # by which its GDN prefill picks FlashInfer's kernel on Hopper (flashinfer_gdn_prefill_default).
        sg.install_server_args("triton", ctx.device, 1, self._speculative(ctx.drafts), chunked_prefill_size=8192)
        self.drafts = ctx.drafts
        self.mamba_pool = _mamba_pool(ctx.state_pool, memory_pool.MambaPool, self._conv_view)
        self.req_pool = _req_to_token_pool(self.mamba_pool, self._request_rows(ctx), ctx.device,
                                           memory_pool.HybridReqToTokenPool, [layer.layer_id for layer in ctx.layers])
        runner = _ModelRunner(ctx.device, self.req_pool, sg.get_context().server_args,
                              _ModelConfig(self._hf_config(ctx.layers[0])))
        full, full_attn_layers = self._full_attention(runner)
        self.impl = hybrid.HybridLinearAttnBackend(full, self._linear_backend(runner),
                                                   full_attn_layers=full_attn_layers)
        self.layers = {layer.layer_id: self._layer(layer) for layer in ctx.layers}
        self.graph = False
        self.forward_batch = None

    def _request_rows(self, ctx) -> int:
        """The request rows of the HybridReqToTokenPool (a batch's rows 1..bs, row 0 the padded rows')."""
        return ctx.state_pool.size

    def _full_attention(self, runner):
        """HybridLinearAttnBackend's full-attention side and its layer ids: here one that owns no layer."""
        return _no_full_layers(self.sg.AttentionBackend)(runner), []

    @staticmethod
    def _speculative(drafts: int):
        """The server's speculative config of a run verifying `drafts` tokens a request (None: none):
        EAGLE's chain, as the kit's verify cases draft."""
        if not drafts:
            return None
        from kit.engine.batch import SpeculativeConfig

        return SpeculativeConfig(algorithm="EAGLE", num_draft_tokens=drafts, topk=1, num_steps=drafts - 1)

    @staticmethod
    def _conv_view(conv):
        """The kit's conv windows as the kind's MambaPool lays them out (GDN's and Mamba2's: as they are)."""
        return conv

    def _linear_backend(self, runner):
        """The kind's SGLang backend, built as attention_registry.py builds it for the kind's models."""
        raise NotImplementedError

    def _hf_config(self, layer):
        """The HF config of the kind's model, as its model runner holds it, of a kit layer."""
        raise NotImplementedError

    def _layer(self, layer):
        """The model's layer object SGLang's backend is called with, of the kit's RecurrentLayer: the
        RadixLinearAttention Qwen3-Next's and Kimi Linear's layers build (no gate lower bound)."""
        from importlib import import_module

        radix_linear = import_module(RADIX_LINEAR).RadixLinearAttention
        return radix_linear(
            layer_id=layer.layer_id, num_q_heads=layer.num_k_heads, num_k_heads=layer.num_k_heads,
            num_v_heads=layer.num_v_heads, head_q_dim=layer.head_k_dim, head_k_dim=layer.head_k_dim,
            head_v_dim=layer.head_v_dim, conv_weights=layer.conv_weights, bias=layer.bias,
            activation=layer.activation, A_log=layer.A_log, dt_bias=layer.dt_bias)

    def _call_layer(self, layer, mixed_qkv, a, b):
        """The RadixLinearAttention's call as the model makes it, in SGLang's forward context: [T, Hv, V]."""
        sg = self.sg
        with sg.forward_context(sg.ForwardContext(attn_backend=self.impl)):
            out = self.layers[layer.layer_id](self.forward_batch, mixed_qkv=mixed_qkv, a=a, b=b)
        return out.view(mixed_qkv.shape[0], layer.num_v_heads, layer.head_v_dim)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        # SGLang's graph runner: one token a request, or a verify's drafts.
        self.graph = True
        self.impl.init_cuda_graph_state(max_bs, max_bs * max(self.drafts, 1))

    def init_forward_metadata(self, batch) -> None:
        fb = self._forward_batch(batch)
        if self.graph:  # as SGLang's graph runner prepares a replay, outside the graph
            self.impl.init_forward_metadata_out_graph(fb)
        else:
            self._clear_new_slots(batch)
            self.impl.init_forward_metadata(fb)
        self.forward_batch = fb

    def _clear_new_slots(self, batch) -> None:
        """What the scheduler does before a new request's first forward: its slot zeroed."""
        new = batch.state_indices[(~batch.has_initial_state) & (batch.state_indices >= 0)]
        if new.numel():
            self.mamba_pool.clear_slots(new)

    def _forward_batch(self, batch):
        sg, device = self.sg, self.device
        bs = batch.batch_size
        real = batch.state_indices >= 0
        rows = torch.where(real, torch.arange(1, bs + 1, dtype=torch.int64, device=device), 0)
        mapping = self.req_pool.req_index_to_mamba_index_mapping
        mapping[rows[real]] = batch.state_indices[real]
        lens = torch.tensor(batch.extend_seq_lens_cpu, dtype=torch.int32, device=device)
        # The kit's batch says whether a request has a saved state, not how long its prefix is; SGLang's
        # linear backends read extend_prefix_lens > 0 alone (gdn_backend.py _convolve_prefill,
        # mamba2_metadata.py prepare_mixed).
        prefix = batch.has_initial_state.to(torch.int32)
        seq_lens = lens + prefix
        verify = batch.forward_mode == ForwardMode.TARGET_VERIFY
        # A verify's ForwardBatch has no extend fields (ForwardBatch.init_new sets them outside decode and
        # verify alone), by which Mamba2's metadata takes the verify for a decode of its drafts.
        extend = {} if verify else dict(
            extend_num_tokens=batch.num_tokens, extend_seq_lens=lens, extend_prefix_lens=prefix,
            extend_start_loc=batch.query_start_loc[:-1], extend_seq_lens_cpu=list(batch.extend_seq_lens_cpu),
            extend_prefix_lens_cpu=prefix.tolist())
        fb = sg.ForwardBatch(
            forward_mode=sg.MODES[batch.forward_mode.value], batch_size=bs,
            input_ids=torch.zeros(batch.num_tokens, dtype=torch.int64, device=device),
            req_pool_indices=rows, seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(), seq_lens_sum=int(seq_lens.sum()),
            out_cache_loc=torch.zeros(batch.num_tokens, dtype=torch.int64, device=device), positions=None,
            global_num_token_non_padded_cpu=batch.num_tokens, **extend,
            spec_info=self._verify_input(batch, seq_lens) if verify else None)
        fb.num_padding = int((~real).sum())
        return fb

    def _verify_input(self, batch, seq_lens):
        """The verify's EagleVerifyInput, as the target verify hands it: a chain of `draft_token_num`
        tokens a request (the tree's links, unused by a chain, left out)."""
        sg = self.sg
        return sg.EagleVerifyInput(
            draft_token=None, custom_mask=None, positions=None, retrieve_index=None, retrieve_next_token=None,
            retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=self.drafts - 1, topk=1,
            draft_token_num=self.drafts, capture_hidden_mode=sg.CaptureHiddenMode.FULL,
            seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu())


class SGLangGDNBackend(SGLangLinearBackend):
    name = "sglang_gdn"
    attention_kinds = ("gdn",)
    numerics = dataclasses.replace(SGLangLinearBackend.numerics, qk_cast=PREFILL)
    engine_modules = (GDN_BACKEND,)
    # On CPU its Triton kernels run in the interpreter: one small case a mode it runs there.
    ci_cases = {"decode": ("gdn_decode_bf16_long",), "target_verify": ("gdn_verify_bf16",)}

    @classmethod
    def _kind_problem(cls, case) -> Optional[str]:
        if case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED) and case.dtype == "fp32":
            return (f"{case.mode.value} in fp32: GDNAttnBackend's prefill (kernels/ops/attention/fla/chunk.py "
                    "chunk_gated_delta_rule) asserts its inputs are not float32")
        if case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED) and not torch.cuda.is_available():
            return cpu_prefill_reason(case, "GDNAttnBackend", "fla/chunk.py:111 chunk_gated_delta_rule")
        return None

    def _hf_config(self, layer):
        """SGLang's own Qwen3NextConfig, the class its model runner loads for Qwen3-Next (its GDN prefill
        default, flashinfer_gdn_prefill_default, reads the heads of that class alone); no mamba_chunk_size:
        the prefill chunks by 64."""
        from importlib import import_module

        return qwen3_next_config(layer, import_module("sglang.srt.configs.qwen3_next").Qwen3NextConfig)

    def _linear_backend(self, runner):
        from importlib import import_module

        gdn = import_module(GDN_BACKEND)
        linear_utils = import_module(LINEAR_UTILS)
        # As attention_registry.py builds a hybrid GDN model's backends.
        runner.linear_attn_backends = linear_utils.resolve_linear_attn_backends(
            prefill_default=gdn.flashinfer_gdn_prefill_default(runner))
        return gdn.GDNAttnBackend(runner)

    def forward(self, mixed_qkv, a, b, layer, batch):
        return self._call_layer(layer, mixed_qkv, a, b)
