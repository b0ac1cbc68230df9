"""vLLM's sparse MLA backend (DeepSeek-V3.2's DSA) behind the kit's sparse latent contract, through
vLLM's own MLAAttention layer built sparse, as DeepSeek-V3.2's attention builds it.

What the indexer would compute the kit hands as the step's `batch.topk_indices`: per new token its
top-k columns of the request's req_to_token row, -1 padded. That is vLLM's indexer output exactly:
DeepseekV2Model allocates one int32 buffer [max_num_batched_tokens, index_topk] (deepseek_v2.py:1439-1449)
that every sparse layer's impl reads (SharedTopkIndicesBuffer), its rows per token in the batch's
order, each entry a token position in its request (the indexer fills the rows with -1 first,
sparse_attn_indexer.py:604, then writes each row's top-k); the impl converts a position to a cache
row through the request's block table (triton_convert_req_index_to_global_index, sparse_utils.py).
So the adapter copies the kit's rows into that buffer, untranslated (`indexer_rows`), inside
forward, where the indexer writes it (a graph records the copy and replays it over the kit's static
rows).

The layer is built with no indexer of its own (the kit is the indexer) and no MLA prefill backend
(vLLM picks one for the model's widths and finds none for the latent contract's, nope = v = rank:
the sparse layer then attends its prefill rows through the same top-k MQA kernel as its decode
rows, mla_attention.py:623-655). The latent cache is in blocks a row apart, as a cache sharing its
pages with the indexer's keys: the kernels read it through the block stride (flat_kv_row_view).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from backends.vllm.mla import VllmMLABackend


def indexer_rows(batch, num_tokens: int) -> torch.Tensor:
    """The rows vLLM's indexer would write for the batch's first `num_tokens` tokens: the kit's own
    (both are token positions in the request, -1 padded; a graph's padded tokens' rows all -1)."""
    return batch.topk_indices[:num_tokens]


class VllmSparseMLABackend(VllmMLABackend):
    """The protocol over one of vLLM's sparse MLA backends: its layer built sparse, fed the kit's
    top-k rows as the indexer's output."""

    attention_kinds = ("sparse_mla",)
    # The indexer runs in every mode vLLM serves DeepSeek-V3.2 in; the sparse builders declare
    # UNIFORM_BATCH: decode and verify graphs, ragged batches eager (supports_graph).
    modes = ("decode", "extend", "mixed", "target_verify")

    @classmethod
    def _prefill_problem(cls, case) -> Optional[str]:
        """None: the sparse layer attends prefill rows by its top-k MQA kernel where no MLA prefill
        backend takes the model."""
        return None

    def _vllm_layer(self, layer, backend):
        """The sparse layer, once what vLLM's GPU worker sets up before building a model is there: its
        impl asks for the tensor-parallel size and reserves scratch in the workspace manager
        (gpu_worker.py:558)."""
        self.rt.single_rank()
        if not self.rt.is_workspace_manager_initialized():
            self.rt.init_workspace_manager(self.ctx.device)
        return super()._vllm_layer(layer, backend)

    @functools.cached_property
    def topk_indices_buffer(self) -> torch.Tensor:
        """The indexer's output all layers read, as DeepseekV2Model allocates it."""
        rows = self.vllm_config.scheduler_config.max_num_batched_tokens
        return torch.full((rows, self.ctx.layers[0].index_topk), -1, dtype=torch.int32, device=self.ctx.device)

    def _layer_args(self, layer) -> dict:
        """Sparse, reading the indexer's buffer, with vLLM's own choice of prefill backend (none)."""
        return dict(use_sparse=True, topk_indices_buffer=self.topk_indices_buffer)

    def _cache_view(self, storage: torch.Tensor) -> torch.Tensor:
        """The latent [blocks, block (+ gap), rank + rope] as vLLM's runner hands it: [blocks, 1, block,
        rank + rope], the blocks as far apart as the pool keeps them."""
        return storage[:, :self.ctx.page_size].unsqueeze(1)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        t = q.shape[0]
        self.topk_indices_buffer[:t].copy_(indexer_rows(batch, t))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class VllmFlashMLASparseBackend(VllmSparseMLABackend):
    """FLASHMLA_SPARSE (v1/attention/backends/mla/flashmla_sparse.py): DeepSeek's FlashMLA sparse
    kernels (`_flashmla_C`, SM90/SM100): with a bf16 cache, flash_mla_sparse_fwd for every row, the
    query heads padded to 64; per-request top-k positions converted to cache rows by vLLM's Triton
    kernel."""

    name = "vllm_flashmla_sparse"
    vllm_backend = "FLASHMLA_SPARSE"
    cuda_only = True
    # None of the kit's fp8 caches: MLAAttention stores any fp8 cache of FLASHMLA_SPARSE as fp8_ds_mla
    # (mla_attention.py:359-376), 656-byte records of 512 e4m3 values with four float32 scales, one per
    # 128 columns, and the rope in bf16 (flashmla_sparse.py's format note), not one scale per layer.
    kv_dtypes = ()


class VllmFlashAttnMLASparseBackend(VllmSparseMLABackend):
    """FLASH_ATTN_MLA_SPARSE (v1/attention/backends/mla/flashattn_mla_sparse.py): FlashAttention 3's
    varlen kernel over the selected cache rows (SM90), fp16 or bf16; no fp8 cache
    (supported_kv_cache_dtypes)."""

    name = "vllm_flash_attn_mla_sparse"
    vllm_backend = "FLASH_ATTN_MLA_SPARSE"
    cuda_only = True
    kv_dtypes = ()
