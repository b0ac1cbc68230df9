"""FlashInfer MLA backend: flashinfer-python 0.7's BatchMLAPagedAttentionWrapper behind the kit's
protocol, for MLA (latent attention) cases.

One wrapper kind for every mode (the absorbed path SGLang's FlashInferMLAAttnBackend runs):
plan() takes a CSR page table over the kit's req_to_token rows (page ids, kv lengths) and the
query rows per request; run() reads the kit's latent buffer in place, split into its compressed
part (ckv = buffer[..., :R]) and its rope part (kpe = buffer[..., R:]), as the query is split
into q_nope·W_UK and q_pe. Its mask is causal and bottom-right aligned (kv - q + i), which is
EXTEND, MIXED, DRAFT_EXTEND_V2 and a verify chain; there is no custom mask, so no tree verify.
DECODE plans non-causal (one query row sees its whole sequence), as SGLang does.

The wrapper is pinned to its fa2 kernels: one kernel family for every mode (the library's
"auto" picks among fa2/fa3 and others by shape), and fa2 plans may be re-planned under a
captured CUDA graph (its plan capabilities say so), which bucket replays need.

Page table, query and kv lengths per mode, and the graph hooks (a wrapper per batch-size
bucket over fixed buffers, planned again before each replay) are the dense FlashInfer
backend's: only the wrapper, its plan and its run differ. So is its log-sum-exp, which the kit
judges (returns_lse): the MLA wrapper gives it in the natural base when its plan asks for it
(lse_mode "basee"), and its kernels sum rounded probabilities as the dense ones do (mla.cuh:
m16k16_rowsum_f16f16f32 over p_f16), the inherited p_half.
"""
from __future__ import annotations

from typing import Optional

import torch

from backends import flashinfer as dense
from kit.modes import ForwardMode

FA_CKV_MULTIPLE, FA_KPE_MULTIPLE = 128, 64


class FlashInferMLABackend(dense.FlashInferBackend):
    name = "flashinfer_mla"
    attention_kinds = ("mla",)  # fp8 KV as the dense backend: the latent's one scale for both parts

    @classmethod
    def supports(cls, case) -> Optional[str]:
        if case.mode is ForwardMode.DRAFT_DECODE:
            return dense.NO_DRAFT_DECODE
        if case.dtype not in dense.DTYPES:
            return f"{case.dtype}: FlashInfer's MLA kernels take fp16/bf16 (or fp8 KV), no fp32"
        if case.kv_lora_rank % FA_CKV_MULTIPLE or case.rope_dim % FA_KPE_MULTIPLE:
            return (f"kv_lora_rank {case.kv_lora_rank}, rope_dim {case.rope_dim}: FlashInfer's fa2/fa3 MLA kernels "
                    f"need the compressed width a multiple of {FA_CKV_MULTIPLE} and the rope width of "
                    f"{FA_KPE_MULTIPLE} (DeepSeek: 512 and 64)")
        if case.kv_dtype == "fp8_e5m2":
            return ("fp8_e5m2 KV: FlashInfer's MLA planner takes fp16, bf16 or fp8_e4m3 latents "
                    "(mla/_batch_mla/_backends/_fa_common.py:142 raises _BackendPlanUnsupportedError)")
        if case.mode is ForwardMode.TARGET_VERIFY and case.topk > 1:
            return ("tree verify (topk > 1): BatchMLAPagedAttentionWrapper has no custom mask, only causal "
                    "(SGLang's FlashInfer MLA backend plans verify causal too: topk=1 only)")
        if dense.UNAVAILABLE is not None:
            return dense.UNAVAILABLE
        if not torch.cuda.is_available():
            return "FlashInfer runs on CUDA GPUs only; no CUDA device here"
        return None

    def __init__(self, ctx):
        dense.AttentionBackend.__init__(self, ctx)
        layer = ctx.layers[0]  # MLA cases have no hybrid layers
        self.page = ctx.page_size
        self.rank = layer.kv_lora_rank
        self.variant = dict(num_heads=layer.tp_q_head_num, head_dim_ckv=layer.kv_lora_rank,
                            head_dim_kpe=layer.rope_dim, page_size=ctx.page_size, sm_scale=layer.scaling,
                            q_data_type=ctx.dtype, kv_data_type=ctx.kv_cache_dtype,
                            query_layout="split", kv_cache_layout="split", lse_mode="basee")
        self.workspace = torch.zeros(dense.WORKSPACE_BYTES, dtype=torch.uint8, device=ctx.device)
        self.eager_wrappers, self.graph_wrappers = {}, {}
        self.wrapper = None

    def _new_wrapper(self, mode: ForwardMode, graph_bs: Optional[int] = None):
        g = graph_bs
        # The dense backend's int32 [max_bs] last-page-length buffer holds the kv lengths MLA plans.
        kw = {} if g is None else dict(
            use_cuda_graph=True, qo_indptr=self.g_qo_indptr[:g + 1], kv_indptr=self.g_kv_indptr[:g + 1],
            kv_indices=self.g_kv_indices, kv_len_arr=self.g_last_page_len[:g])
        return dense.flashinfer.mla.BatchMLAPagedAttentionWrapper(self.workspace, backend="fa2", **kw)

    def _plan(self, wrapper, mode: ForwardMode, rows, seq_lens_cpu, spec_info, extend_lens=None) -> None:
        q_lens, kv_lens = self._lengths(mode, seq_lens_cpu, spec_info, extend_lens)
        kv_indptr, kv_indices, _ = self._page_table(rows, kv_lens)
        qo_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(q_lens, 0, dtype=torch.int32)])
        metadata = dense.flashinfer.mla.MLAPlanMetadata.csr(
            qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_lens)
        wrapper.plan(metadata=metadata, causal=mode is not ForwardMode.DECODE, **self.variant)
        self.wrapper = wrapper

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        latent = pool.get_key_buffer(layer.layer_id)
        paged = latent.view(-1, self.page, latent.shape[-1])  # [pages, page, R + P]: one KV head
        r = self.rank
        scales = {} if layer.k_scale is None else dict(ckv_scale=layer.k_scale, kpe_scale=layer.k_scale)
        return self.wrapper.run(query=(q[..., :r], q[..., r:]), kv_cache=(paged[..., :r], paged[..., r:]),
                                return_lse=True, return_lse_base_on_e=True, **scales)
