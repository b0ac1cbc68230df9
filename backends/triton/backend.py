"""The Triton backend: our own kernels behind the SPEC protocol, with the two-phase
graph hooks of SGLang 0.5.23 (init_forward_metadata_out_graph / _in_graph).

DECODE runs the split-KV decode kernel over all seq_len keys from the pool.
DRAFT_DECODE runs it once a step, a row a lane, over metadata of each step's
own (built together, before the first step): the committed keys, then the
lane's columns so far.
EXTEND, MIXED, TARGET_VERIFY and DRAFT_EXTEND_V2 run the extend kernel: the
prefix from the pool, the new tokens' K/V passed directly. Prefix per mode:
  EXTEND, MIXED    extend_prefix_lens (a MIXED decode row: seq_len - 1)
  TARGET_VERIFY    seq_lens (drafts are not counted in seq_lens), custom mask
  DRAFT_EXTEND_V2  seq_lens - extend_seq_lens (seq_lens already count the
                   drafts), clamped at 0: padded graph rows have seq_len 1.
MLA runs the latent kernels (mla.py) on the same metadata and hooks.
Every kernel gives each row's log-sum-exp beside its output (returns_lse): the decode's from its
splits' merge, the extend kernels' from their running max and sum.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from backends.triton import mla
from backends.triton.metadata import (BLOCK_M, INTERPRETED_SPLIT_TOKENS, MAX_KV_SPLITS, SPLIT_TOKENS, Buffers,
                                      Metadata, draft_buffers, extend_grid, fill_decode, fill_draft_step, fill_extend)
from kit.engine.profile import SGLANG
from kit.modes import MODES, ForwardMode
from kit.harness.protocol import AttentionBackend, library_version

EXTEND_LIKE = (ForwardMode.EXTEND, ForwardMode.MIXED)  # extend_* fields: each request's prefix and new tokens
DECODE_KERNEL = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE)

# Tuned on an H100 (bf16, 32/8 heads, head_dim 128) over BLOCK_M/N 32-128, 4-8 warps, 2-4 stages.
DECODE_BLOCK_N = 64
EXTEND_BLOCK_N = 32
LAUNCH = dict(num_warps=4, num_stages=3)
DECODE_BLOCK_H = 16  # tl.dot needs 16 rows: a KV head's query group is padded to it


class TritonBackend(AttentionBackend):
    name = "triton"
    profile = SGLANG  # SGLang's batch and pool conventions
    modes = tuple(MODES)
    extend_capture = True
    batch_invariant = True  # a request's KV splits follow its own length alone (metadata.fill_decode)
    host_mirrors = ()  # its metadata reads no host copy of seq_lens: the engine need not wait to make one
    attention_kinds = ("dense", "mla")
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    attention_features = ("sinks",)
    returns_lse = True
    # A plain CPU run (`--case-set auto`, as CI runs it): each feature in at least one mode (paging 1/16/64,
    # the layouts, window, cap, tree, hybrid, MLA, fused inputs, fp8, sinks), each mode's graphs. Left out:
    # the DeepSeek-width MLA and long soft-capped cases (minutes a run in Triton's interpreter) and repeats
    # of a feature in another mode's extend kernel. `--case-set smoke` runs them all.
    ci_cases = {
        "decode": ("gqa_ragged_p16_fp32", "mqa_p1_shuf", "mha_bs1_window_p64_inter", "gqa_bs8_cap_p1_nonmono",
                   "mla_r32_h16_ragged_p16_fp32", "gqa_fused_p16_fp32", "gqa_fp8_e4m3_p16_fp16",
                   "gqa_window_sinks_hybrid_p16_fp16"),
        "extend": ("gqa_hybrid_p16_fp32", "gqa_fp8_e5m2_prefix_p16_fp16"),
        "target_verify": ("mqa_tree6_p1_shuf", "gqa_tree8_window4_p16_inter", "mla_r32_h16_chain4_p16_fp32",
                          "gqa_fp8_e4m3_chain3_p16_fp16", "gqa_chain4_window_sinks_hybrid_p16_fp32"),
        "draft_extend_v2": ("gqa_draft4_p16_fp32", "mqa_draft3_p1_shuf", "gqa_draft2_fused_p16_fp32",
                            "gqa_fp8_e5m2_draft3_p16_fp16"),
        "mixed": ("gqa_fresh_prompt_p16_fp32", "gqa_all_ones_bs9_p16_fp32"),
        "draft_decode": ("gqa_chain3_p16_fp32", "gqa_hybrid_tree2_p1_fp32", "gqa_context_edge_chain6_p1_fp32"),
    }

    @classmethod
    def versions(cls):
        return {"triton": library_version("triton")}

    @classmethod
    def supports(cls, case) -> Optional[str]:
        if case.is_mla:
            return mla.unsupported(case)
        if case.head_dim & (case.head_dim - 1):
            return f"head_dim {case.head_dim} is not a power of two (tl.arange needs one)"
        if case.num_q_heads // case.num_kv_heads > DECODE_BLOCK_H:
            return f"GQA group {case.num_q_heads // case.num_kv_heads} > {DECODE_BLOCK_H} heads per decode program"
        return None

    def __init__(self, ctx):
        super().__init__(ctx)
        self.req_to_token = ctx.req_to_token_pool.req_to_token
        model = ctx.layers[0]  # heads and head_dim are the model's; scale, window and cap come per layer
        self.num_q_heads, self.num_kv_heads = model.tp_q_head_num, model.tp_k_head_num
        self.head_dim = model.head_dim
        self.v_head_dim = model.v_head_dim
        self.split_tokens = SPLIT_TOKENS if ctx.device.type == "cuda" else INTERPRETED_SPLIT_TOKENS
        # Sink logits on the device, made here (a graph cannot copy them in): by layer's values
        self.sink_tensors = {layer.sinks: layer.sinks_tensor(ctx.device) for layer in ctx.layers if layer.sinks}
        self.no_sinks = torch.zeros(1, dtype=torch.float32, device=ctx.device)  # a pointer HAS_SINK=False never reads
        self.graph_bufs: Optional[Buffers] = None  # set by init_cuda_graph_state
        self.graph_rows = 0  # the most query rows a graph batch has (init_cuda_graph_state)
        self.draft_graph_bufs: Optional[List[Buffers]] = None  # a draft decode's, per step: at its first capture
        self.forward_metadata: Optional[Metadata] = None
        self.draft_metadata: List[Metadata] = []  # DRAFT_DECODE: per step

    # ---- metadata: two-phase, as SGLang 0.5.23 backends are written -------------------
    # out_graph: host work, before capture and before every replay (and first, eagerly):
    #   buffers, grid sizes, the custom mask (its size follows the batch's lengths).
    # in_graph: device work of a fixed shape per batch size, recorded in the graph and
    #   re-run by every replay. EXTEND graphs are per token bucket, replayed with other
    #   request counts, so EXTEND fills its metadata in out_graph.

    def _allocate(self, rows: int, num_tokens: int, kv_capacity: int, mask_capacity: int) -> Buffers:
        return Buffers.allocate(rows, num_tokens, kv_capacity, mask_capacity, self.num_q_heads, self.v_head_dim,
                                self.ctx.device)

    def _eager_buffers(self, batch) -> Buffers:
        """Sized for this batch."""
        mask = batch.spec_info.custom_mask if batch.spec_info is not None else None
        return self._allocate(batch.batch_size + 1, batch.num_tokens, self._key_capacity(batch),
                              0 if mask is None else mask.numel())

    def _key_capacity(self, batch) -> int:
        """Keys the batch's kv_indices may hold, without a host mirror (host_mirrors: none is exact
        here): no row (a request, a draft decode's lane) has more than a req_to_token row."""
        lanes = batch.spec_info.topk if batch.forward_mode is ForwardMode.DRAFT_DECODE else 1
        return batch.batch_size * lanes * self.ctx.max_context_len

    def _draft_buffers(self, batch) -> List[Buffers]:
        """A draft decode's buffers per step: sized for this batch, or, for graphs, for the largest
        (made at the first capture, which comes first, and kept: the graphs read them)."""
        spec = batch.spec_info
        if self.graph_bufs is None:
            rows = batch.batch_size * spec.topk
            return draft_buffers(self._allocate(rows, rows, self._key_capacity(batch), 0), spec.num_steps - 1)
        if self.draft_graph_bufs is None:
            rows = self.graph_rows
            self.draft_graph_bufs = draft_buffers(self._allocate(rows, rows, self._draft_graph_keys(), 0),
                                                  spec.num_steps - 1)
        return self.draft_graph_bufs

    def _draft_graph_keys(self) -> int:
        """Keys a step of a draft decode graph holds at most: each of its rows (a lane of the largest
        batch) a whole req_to_token row, the lanes past the model's context length included."""
        return self.graph_rows * self.ctx.max_context_len

    def init_forward_metadata_out_graph(self, batch, in_capture: bool = False) -> None:
        bs, mode = batch.batch_size, batch.forward_mode
        if mode is ForwardMode.DRAFT_DECODE:
            rows = bs * batch.spec_info.topk
            self.draft_metadata = [Metadata(bufs, rows=rows) for bufs in self._draft_buffers(batch)]
            return
        bufs = self.graph_bufs if self.graph_bufs is not None else self._eager_buffers(batch)
        if mode is ForwardMode.DECODE:
            self.forward_metadata = Metadata(bufs, rows=bs, max_splits=self._max_splits(batch))
            return
        _, _, mask = self._extend_inputs(batch)
        if mask is not None:
            mask = mask.view(torch.uint8)
            if bufs is self.graph_bufs:  # the graph reads the mask from its fixed buffer
                bufs.mask[:mask.shape[0]].copy_(mask)
                mask = bufs.mask
        self.forward_metadata = Metadata(bufs, rows=bs + 1, num_blocks=extend_grid(bufs, self._extend_tokens(batch)),
                                         mask=mask)
        if mode in EXTEND_LIKE:
            self._fill_extend(batch)

    def init_forward_metadata_in_graph(self, batch) -> None:
        bs, mode = batch.batch_size, batch.forward_mode
        if mode is ForwardMode.DECODE:
            self._fill_decode(self.forward_metadata.bufs, batch.req_pool_indices[:bs], batch.seq_lens[:bs])
        elif mode is ForwardMode.DRAFT_DECODE:
            self._fill_draft(batch)
        elif mode not in EXTEND_LIKE:
            self._fill_extend(batch)

    def _fill_draft(self, batch) -> None:
        """Every step's metadata of a draft decode, from the committed lengths."""
        bs, spec = batch.batch_size, batch.spec_info
        for step, md in enumerate(self.draft_metadata):
            fill_draft_step(md.bufs, self.req_to_token, batch.req_pool_indices[:bs], batch.seq_lens[:bs], spec.topk,
                            spec.num_steps, step, self.split_tokens)

    def _max_splits(self, batch) -> int:
        """The decode grid's split dimension: every split a request may have, whatever the batch (each
        request's own count, on the device, follows its length alone: metadata.fill_decode)."""
        return MAX_KV_SPLITS

    def _fill_decode(self, bufs: Buffers, req_pool_indices, seq_lens) -> None:
        fill_decode(bufs, self.req_to_token, req_pool_indices, seq_lens, self.split_tokens)

    def _fill_extend(self, batch) -> None:
        md, bs = self.forward_metadata, batch.batch_size
        prefix, q_lens, _ = self._extend_inputs(batch)
        fill_extend(md.bufs, self.req_to_token, batch.req_pool_indices[:bs], prefix, q_lens,
                    self._extend_tokens(batch), md.num_blocks, with_mask=md.mask is not None)

    def _extend_tokens(self, batch) -> int:
        """Query rows the extend metadata covers: every token of the call, graph padding included."""
        return batch.num_tokens

    def _extend_inputs(self, batch):
        """(prefix lens, new tokens per request, custom mask or None) of the batch's requests."""
        mode, bs, spec_info = batch.forward_mode, batch.batch_size, batch.spec_info
        seq_lens = batch.seq_lens[:bs]
        if mode in EXTEND_LIKE:
            return batch.extend_prefix_lens[:bs], batch.extend_seq_lens[:bs], None
        if mode is ForwardMode.TARGET_VERIFY:
            return seq_lens, torch.full_like(seq_lens, spec_info.draft_token_num), spec_info.custom_mask
        if mode is ForwardMode.DRAFT_EXTEND_V2:
            q_lens = spec_info.extend_seq_lens_tensor[:bs]
            return torch.clamp(seq_lens - q_lens, min=0), q_lens, None
        raise NotImplementedError(mode)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        max_ctx = self.ctx.max_context_len
        self.graph_rows = max_num_tokens
        rows = max_bs + 1
        # A custom mask holds at most max_num_tokens rows of (context + drafts) columns.
        self.graph_bufs = self._allocate(rows, max_num_tokens, rows * max_ctx,
                                         max_num_tokens * (max_ctx + max_num_tokens))

    # ---- forward -------------------------------------------------------------

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
        out = q.new_empty(q.shape[:-1] + (layer.v_head_dim,))
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        decode = batch.forward_mode in DECODE_KERNEL
        md = self.draft_metadata[batch.spec_info.draft_step] if batch.forward_mode is ForwardMode.DRAFT_DECODE \
            else self.forward_metadata
        if layer.is_mla:  # k_cache: the latent rows (v_cache is a view of them)
            if decode:
                mla.decode(md, q, k_cache, out, lse, layer, _precision(q))
            else:
                mla.extend(md, q, k, k_cache, out, lse, batch.out_cache_loc, layer, _precision(q))
        elif decode:
            self._decode(md, q, k_cache, v_cache, out, lse, layer)
        else:
            self._extend(q, k, v, k_cache, v_cache, out, lse, batch.positions, batch.out_cache_loc, layer)
        return out, lse

    def _flags(self, q, layer) -> dict:
        return dict(HAS_CAP=layer.logit_cap > 0, HAS_WINDOW=layer.sliding_window_size >= 0, D=layer.head_dim,
                    FP8_KV=layer.k_scale is not None, **_precision(q))

    def _sinks(self, layer) -> Optional[torch.Tensor]:
        """The layer's sink logits on the device, or None without sinks."""
        if not layer.sinks:
            return None
        if layer.sinks not in self.sink_tensors:  # a layer the context did not list
            self.sink_tensors[layer.sinks] = layer.sinks_tensor(self.ctx.device)
        return self.sink_tensors[layer.sinks]

    def _decode(self, md: Metadata, q, k_cache, v_cache, out, lse, layer) -> None:
        from backends.triton import kernels  # here: a kernel's definition chooses Triton's interpreter
        b = md.bufs
        group = layer.tp_q_head_num // layer.tp_k_head_num
        kernels.decode_split_kernel[(md.rows, layer.tp_k_head_num, md.max_splits)](
            q, k_cache, v_cache, b.kv_indptr, b.kv_indices, b.num_kv_splits, b.mid_o, b.mid_lse,
            layer.scaling, layer.logit_cap, layer.sliding_window_size, *_kv_scales(layer),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            b.mid_o.stride(0), b.mid_o.stride(1), b.mid_o.stride(2), b.mid_lse.stride(0), b.mid_lse.stride(1),
            GROUP=group, BLOCK_H=DECODE_BLOCK_H, BLOCK_N=DECODE_BLOCK_N, **LAUNCH, **self._flags(q, layer))
        self._combine_splits(md, out, lse, layer, self._sinks(layer))

    def _combine_splits(self, md: Metadata, out, lse, layer, sinks: Optional[torch.Tensor]) -> None:
        """Decode's stage 2: the KV splits' partial outputs (and log-sum-exps) merged, the sinks joined once."""
        from backends.triton import kernels
        b = md.bufs
        kernels.decode_reduce_kernel[(md.rows, layer.tp_q_head_num)](
            b.mid_o, b.mid_lse, b.num_kv_splits, out, lse, self.no_sinks if sinks is None else sinks,
            b.mid_o.stride(0), b.mid_o.stride(1), b.mid_o.stride(2), b.mid_lse.stride(0), b.mid_lse.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1), MAX_SPLITS=MAX_KV_SPLITS, D=layer.head_dim,
            HAS_SINK=sinks is not None)

    def _extend(self, q, k, v, k_cache, v_cache, out, lse, positions, out_cache_loc, layer) -> None:
        from backends.triton import kernels
        md, b = self.forward_metadata, self.forward_metadata.bufs
        custom = md.mask is not None
        sinks = self._sinks(layer)
        kernels.extend_kernel[(md.num_blocks, layer.tp_q_head_num)](
            q, k, v, k_cache, v_cache, out, lse, positions,
            b.qo_indptr, b.kv_indptr, b.kv_indices, md.mask if custom else b.mask, b.mask_indptr,
            b.block_req, b.block_start, self.no_sinks if sinks is None else sinks,
            layer.scaling, layer.logit_cap, layer.sliding_window_size, *_kv_scales(layer),
            out_cache_loc, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
            lse.stride(0), lse.stride(1), GROUP=layer.tp_q_head_num // layer.tp_k_head_num, BLOCK_M=BLOCK_M,
            BLOCK_N=EXTEND_BLOCK_N, CUSTOM_MASK=custom, HAS_SINK=sinks is not None, **LAUNCH, **self._flags(q, layer))


def _precision(q) -> dict:
    """The interpreter's bf16 tl.dot is wrong: on CPU the kernels upcast; fp32 stays IEEE on the GPU."""
    return dict(UPCAST=q.device.type == "cpu", IEEE=q.dtype == torch.float32)


def _kv_scales(layer) -> tuple:
    """(k_scale, v_scale) the kernels multiply a quantized cache's values by (1 where it is not)."""
    return (1.0, 1.0) if layer.k_scale is None else (layer.k_scale, layer.v_scale)
