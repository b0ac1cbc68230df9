"""FlashInfer backend: the real flashinfer-python (0.7.x) kernels behind the kit's protocol.

Which wrapper runs each mode (the conventions of SGLang's flashinfer backend):
- DECODE: BatchDecodeWithPagedKVCacheWrapper, on tensor cores when the GQA
  group is >= 4 (engines' rule: the CUDA-core kernel only wins for small groups).
- EXTEND, MIXED, DRAFT_EXTEND_V2: BatchPrefillWithPagedKVCacheWrapper, causal
  (bottom-right aligned) over prefix + new tokens, whose KV forward() writes to
  the pool first. One paged pass, not SGLang's ragged pass over the new tokens
  merged (merge_state) with a paged pass over the prefix: that split only saves
  paged reads of fresh tokens on long prompts, while the single pass is one
  kernel and reads the new tokens through the page table, as decode does.
- TARGET_VERIFY: the same wrapper with the custom mask, kv = prefix + drafts.
- With attention sinks, every mode: a paged prefill wrapper over FlashInfer's
  AttentionSink variant (DECODE as one query row a request), the layer's sinks
  given to run(). The variant has no logits soft cap, and applies no custom
  mask: TARGET_VERIFY runs chains (causal), not trees. The adapter builds it as
  BatchAttentionWithAttentionSinkWrapper does, under FlashInfer's full name for
  the module (sink_wrapper).
The paged prefill wrappers pin backend="fa2", as SGLang pins its paged prefill
wrapper: the FA3 (SM90) kernels reject custom masks, so "auto" would run verify
on fa2 and extend on fa3; fa2 is also what tensor-core decode runs, so one JIT
build per variant serves all modes.

FlashInfer fixes the kernel variant at plan() (dtypes, head_dim, window_left,
logits_soft_cap; sm_scale is kept from there too), so every plan passes them
all, with the dtypes explicit: the library defaults q to fp16.

Every wrapper's run() also gives each row's log-sum-exp (return_lse), which the
kit judges (returns_lse): FlashInfer keeps it in base 2 (its softmax runs on
exp2 of the logits times log2(e)), so forward() hands it on times ln 2, the
natural log the engines' merges and the reference use.

Its window_left counts on the token index (kv_len - qo_len + i): right for
EXTEND, DECODE, DRAFT_EXTEND_V2 and chains, wrong for a tree, whose draft sits
at seq_len + its depth. TARGET_VERIFY therefore plans no window and folds it,
on positions, into the custom mask (window_on_positions).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from kit.engine.numerics import ALL, Numerics
from kit.engine.profile import SGLANG
from kit.modes import ForwardMode
from kit.harness.protocol import AttentionBackend, library_version
from kit.engine.transfer import to_device

try:
    import flashinfer
    from flashinfer.jit.attention import get_batch_prefill_attention_sink_uri
    from flashinfer.jit.attention.variants import attention_sink_decl
except Exception as exc:  # noqa: BLE001 - not installed, or a build that cannot load here: a reason, not a crash
    flashinfer = None
    IMPORT_ERROR: Optional[Exception] = exc  # raised again by an offline bundle's check (backends/offline)
    UNAVAILABLE: Optional[str] = (f"flashinfer-python cannot be imported here ({type(exc).__name__}: {exc}); "
                                   f"install it with `pip install .[flashinfer]`")
else:
    IMPORT_ERROR = UNAVAILABLE = None

WORKSPACE_BYTES = 128 << 20  # the size FlashInfer recommends for its split-k scratch
EXTEND_LIKE = (ForwardMode.EXTEND, ForwardMode.MIXED)  # extend_* fields: a MIXED decode row is a 1-token extend
NO_DRAFT_DECODE = ("DRAFT_DECODE: this adapter has no multi-step draft path (a decode plan per draft step over "
                   "each lane's keys, as SGLang's FlashInferMultiStepDraftBackend builds them: backend "
                   "sglang_flashinfer_draft)")
DTYPES = ("bf16", "fp16")  # the model dtypes FlashInfer has kernels for
HEAD_DIMS = (64, 128, 256)
TENSOR_CORE_MIN_GROUP = 4
LN2 = math.log(2.0)  # FlashInfer's base-2 log-sum-exp to the natural one


def window_on_positions(mask: torch.Tensor, seq_lens, draft: int, window: int) -> torch.Tensor:
    """TARGET_VERIFY's custom mask (per request a row-major [draft, seq_len + draft] block)
    with the sliding window applied on positions: a draft's row tells its depth (its
    ancestors, itself included, number depth + 1), so its position is seq_len + depth."""
    blocks, start = [], 0
    for s in seq_lens.tolist():
        block = mask[start:start + draft * (s + draft)].view(draft, s + draft)
        start += block.numel()
        q_pos = s + block[:, s:].sum(dim=1) - 1
        k_pos = torch.cat([torch.arange(s, device=mask.device), q_pos])
        blocks.append((block & (k_pos[None, :] >= q_pos[:, None] - window)).reshape(-1))
    return torch.cat(blocks)


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    profile = SGLANG  # SGLang's batch and pool conventions
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY,
             ForwardMode.DRAFT_EXTEND_V2)
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")  # plan(kv_data_type=the cache's), run(k_scale=, v_scale=)
    attention_features = ("sinks",)  # FlashInfer's AttentionSink variant (sink_wrapper)
    # EXTEND stays piecewise-eager: a use_cuda_graph prefill wrapper fixes its batch
    # size at construction and its query-row limit at the first plan(), while one
    # captured token bucket is replayed with batches of other request counts and more
    # real tokens. Engines (SGLang's piecewise CUDA graphs) leave attention out of the
    # captured pieces for the same reason, and their attention layer hands the backend
    # the real rows of a padded batch only.
    extend_capture = False
    real_rows_only = True
    returns_lse = True
    # Its prefill kernels (which tensor-core decode and the sink variant run too) round each exp(s - max)
    # to the query's dtype for the PV product and sum the rounded values for the denominator and the LSE
    # (include/flashinfer/attention/prefill.cuh: m16k16_rowsum_f16f16f32 over s_frag_f16).
    numerics = Numerics(p_half=ALL)

    @classmethod
    def versions(cls):
        return {"flashinfer": library_version("flashinfer-python")}

    @classmethod
    def supports(cls, case) -> Optional[str]:
        if case.mode is ForwardMode.DRAFT_DECODE:
            return NO_DRAFT_DECODE
        if case.dtype not in DTYPES:
            return f"{case.dtype}: FlashInfer's attention kernels take fp16/bf16 (or fp8) q/k/v, no fp32"
        if case.head_dim not in HEAD_DIMS:
            return (f"head_dim {case.head_dim}: FlashInfer supports head_dim 64, 128, 256 "
                    f"(its SM90 kernels are instantiated for these only)")
        # No page size is out of scope: the paged wrappers take any page_size >= 1.
        if case.hybrid:
            return ("layers of different window / scale / cap: this adapter plans one kernel variant "
                    "(FlashInfer fixes them at plan()) for the whole model")
        if case.sinks and case.cap > 0:
            return ("attention sinks with a logit soft cap: FlashInfer's sink variant (AttentionSink, "
                    "BatchAttentionWithAttentionSinkWrapper) applies no soft cap")
        if case.sinks and case.topk > 1:
            return ("attention sinks in a tree verify: FlashInfer's sink variant (AttentionSink) masks by its "
                    "window alone, its LogitsMask replacing the one that reads a custom mask "
                    "(include/flashinfer/attention/variants.cuh), so the tree's mask would be ignored; a chain "
                    "runs causal")
        if UNAVAILABLE is not None:
            return UNAVAILABLE
        if not torch.cuda.is_available():
            return "FlashInfer runs on CUDA GPUs only; no CUDA device here"
        return None

    def __init__(self, ctx):
        super().__init__(ctx)
        layer = ctx.layers[0]  # every layer alike (supports() declines hybrid models)
        self.page = ctx.page_size
        self.heads = (layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim)
        self.decode_tensor_cores = layer.tp_q_head_num // layer.tp_k_head_num >= TENSOR_CORE_MIN_GROUP
        # each layer's own sink logits, made before any capture
        self.sinks = {la.layer_id: la.sinks_tensor(ctx.device) for la in ctx.layers if la.sinks} or None
        self.variant = dict(q_data_type=ctx.dtype, kv_data_type=ctx.kv_cache_dtype, sm_scale=layer.scaling,
                            window_left=layer.sliding_window_size, logits_soft_cap=layer.logit_cap)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=ctx.device)
        self.eager_wrappers: Dict[ForwardMode, object] = {}
        self.graph_wrappers: Dict[Tuple[ForwardMode, int], object] = {}
        self.wrapper = None  # the wrapper the next forward() runs

    # --- metadata ---------------------------------------------------------------------------

    def _decode_wrapper(self, mode: ForwardMode) -> bool:
        """Whether `mode` runs the decode wrapper (else a paged prefill one; with sinks every mode)."""
        return mode is ForwardMode.DECODE and self.sinks is None

    def _new_wrapper(self, mode: ForwardMode, graph_bs: Optional[int] = None):
        """A wrapper for `mode`; with graph_bs, a CUDA-graph one whose metadata lives in the
        fixed buffers of init_cuda_graph_state (plan() fills them in place)."""
        g = graph_bs
        if self._decode_wrapper(mode):
            kw = {} if g is None else dict(
                use_cuda_graph=True, paged_kv_indptr_buffer=self.g_kv_indptr[:g + 1],
                paged_kv_indices_buffer=self.g_kv_indices, paged_kv_last_page_len_buffer=self.g_last_page_len[:g])
            return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=self.decode_tensor_cores, **kw)
        kw = {} if g is None else dict(
            use_cuda_graph=True, qo_indptr_buf=self.g_qo_indptr[:g + 1], paged_kv_indptr_buf=self.g_kv_indptr[:g + 1],
            paged_kv_indices_buf=self.g_kv_indices, paged_kv_last_page_len_buf=self.g_last_page_len[:g])
        if self.sinks is None:
            if g is not None and mode is ForwardMode.TARGET_VERIFY:
                kw.update(custom_mask_buf=self.g_mask, mask_indptr_buf=self.g_mask_indptr[:g + 1])
            return flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2", **kw)
        return self.sink_wrapper(**kw)

    def sink_wrapper(self, **kw):
        """A paged prefill wrapper running FlashInfer's AttentionSink variant, built for the
        case's dtypes, head dim and whether a window applies. Not BatchAttentionWithAttentionSinkWrapper:
        in FlashInfer 0.7.2 it names its JIT module by q dtype and window alone
        (flashinfer/attention/_core.py), so a variant of another head dim or KV dtype loads (and
        rebuilds over) the one built first (tests/test_flashinfer_findings.py). FlashInfer's own
        name for the module (get_batch_prefill_attention_sink_uri) names every one of them."""
        q, kv, d, swa = self.variant["q_data_type"], self.variant["kv_data_type"], self.heads[2], \
            self.variant["window_left"] >= 0
        uri = get_batch_prefill_attention_sink_uri("fa2", q, kv, q, torch.int32, d, d, 0, swa)
        jit_args = [uri, q, kv, q, torch.int32, d, d, ["sink"], ["float"], ["sm_scale"], ["double"],
                    "AttentionSink", attention_sink_decl["fa2"]]
        jit_kwargs = dict(use_sliding_window=swa, use_fp16_qk_reduction=False, pos_encoding_mode=0,
                          paged_kv_stride_mode="independent", module_surface="full")
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2", jit_args=jit_args,
                                                             jit_kwargs=jit_kwargs, **kw)

    @staticmethod
    def _lengths(mode: ForwardMode, seq_lens: torch.Tensor, spec_info,
                 extend_lens) -> Tuple[torch.Tensor, torch.Tensor]:
        """(query rows, kv length) per request, on the host, from the mode's seq_lens convention."""
        seq_lens = seq_lens.to(torch.int32)
        if mode is ForwardMode.DECODE:
            return torch.ones_like(seq_lens), seq_lens
        if mode in EXTEND_LIKE:
            return extend_lens, seq_lens  # seq_lens = prefix + extend
        if mode is ForwardMode.TARGET_VERIFY:
            q = torch.full_like(seq_lens, spec_info.draft_token_num)
            return q, seq_lens + q  # seq_lens exclude the drafts
        if mode is ForwardMode.DRAFT_EXTEND_V2:
            q = spec_info.extend_seq_lens_tensor.cpu().to(torch.int32)
            # seq_lens already count the drafts; a padded graph row (seq_len = fill) has no prefix
            return q, (seq_lens - q).clamp(min=0) + q
        raise NotImplementedError(mode)

    def _page_table(self, rows: torch.Tensor, kv_lens: torch.Tensor):
        """FlashInfer's CSR page table (indptr, page indices, last page lengths) for the
        requests in req_to_token rows `rows` (device) holding `kv_lens` tokens (host)."""
        p = self.page
        n_pages = (kv_lens + p - 1) // p
        indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(n_pages, 0, dtype=torch.int32)])
        last_page_len = kv_lens - (n_pages - 1) * p
        total = int(indptr[-1])
        req = torch.repeat_interleave(rows.long(), to_device(n_pages, rows.device), output_size=total)
        page_no = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(indptr[:-1].long(), n_pages)
        # Pages are whole (token t at page_ids[t // P] * P + t % P): a page's id is the
        # slot of its first token over P.
        first_slot = self.ctx.req_to_token_pool.req_to_token[req, to_device(page_no * p, rows.device)]
        return indptr, (first_slot // p).to(torch.int32), last_page_len

    def _plan(self, wrapper, mode: ForwardMode, rows, seq_lens_cpu, spec_info, extend_lens=None) -> None:
        q_lens, kv_lens = self._lengths(mode, seq_lens_cpu, spec_info, extend_lens)
        kv_indptr, kv_indices, last_page_len = self._page_table(rows, kv_lens)
        if self._decode_wrapper(mode):
            wrapper.plan(kv_indptr, kv_indices, last_page_len, *self.heads, self.page, **self.variant)
        else:
            qo_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(q_lens, 0, dtype=torch.int32)])
            mask, variant = None, self.variant
            if mode is ForwardMode.TARGET_VERIFY and self.sinks is None:  # with sinks: a chain, causal
                mask, window = spec_info.custom_mask, self.variant["window_left"]
                if window >= 0:
                    mask = window_on_positions(mask, seq_lens_cpu, spec_info.draft_token_num, window)
                    variant = dict(self.variant, window_left=-1)
            wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, *self.heads, self.page,
                         causal=mask is None, custom_mask=mask, **variant)
        self.wrapper = wrapper

    def init_forward_metadata(self, batch) -> None:
        mode = batch.forward_mode
        if mode not in self.eager_wrappers:
            self.eager_wrappers[mode] = self._new_wrapper(mode)
        extend_lens = (torch.tensor(batch.extend_seq_lens_cpu, dtype=torch.int32)
                       if mode in EXTEND_LIKE else None)
        bs = batch.batch_size  # request buffers may be longer (a runner's full-capacity views)
        self._plan(self.eager_wrappers[mode], mode, batch.req_pool_indices[:bs], batch.seq_lens_cpu[:bs],
                   batch.spec_info, extend_lens)

    # --- CUDA graphs: one wrapper per batch-size bucket over shared fixed buffers -------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        dev, max_ctx = self.ctx.device, self.ctx.max_context_len
        i32 = lambda n: torch.zeros(n, dtype=torch.int32, device=dev)  # noqa: E731
        self.g_qo_indptr, self.g_kv_indptr, self.g_mask_indptr = i32(max_bs + 1), i32(max_bs + 1), i32(max_bs + 1)
        self.g_last_page_len = i32(max_bs)
        # kv <= max_context tokens a request (TARGET_VERIFY's drafts included), plus the
        # short padded rows: one more page each covers both.
        self.g_kv_indices = i32(max_bs * (-(-max_ctx // self.page) + 1))
        # TARGET_VERIFY mask, bit-packed per request (each rounded up to a byte)
        self.g_mask = torch.zeros(max_num_tokens * max_ctx // 8 + max_bs, dtype=torch.uint8, device=dev)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                 forward_mode, spec_info) -> None:
        wrapper = self.graph_wrappers[(forward_mode, bs)] = self._new_wrapper(forward_mode, graph_bs=bs)
        self._plan(wrapper, forward_mode, req_pool_indices[:bs], seq_lens[:bs].cpu(), spec_info)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                forward_mode, spec_info, seq_lens_cpu) -> None:
        # plan() again before every replay: it rewrites the buffers the graph reads. The request
        # buffers may be the runner's whole static ones (SGLang's draft-extend runner): take bs rows.
        self._plan(self.graph_wrappers[(forward_mode, bs)], forward_mode, req_pool_indices[:bs],
                   seq_lens_cpu[:bs], spec_info)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    # --- attention ----------------------------------------------------------------------------

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
        paged = (k_cache.view(-1, self.page, *k_cache.shape[1:]), v_cache.view(-1, self.page, *v_cache.shape[1:]))
        sinks = () if self.sinks is None else (self.sinks[layer.layer_id],)  # the sink variant's extra tensor
        # fp8 KV: the wrappers were planned with the cache's dtype (kv_data_type); run() descales
        scales = {} if layer.k_scale is None else dict(k_scale=layer.k_scale, v_scale=layer.v_scale)
        out, lse2 = self.wrapper.run(q, paged, *sinks, return_lse=True, **scales)
        return out, lse2 * LN2
