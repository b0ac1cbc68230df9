"""Mutants of sparse MLA (DeepSeek-V3.2's DSA): each is one bug class of sparse-MLA backends, made by
overriding one method of the in-box torch_sparse_mla backend (its source stays untouched)."""
from __future__ import annotations

import torch

from backends.torch_sparse_mla import TorchSparseMLABackend


class IndexThroughWrongPage(TorchSparseMLABackend):
    """An index's page taken as (index + 1) // page: the last token of each page is read through
    the next page's block (at page 1, every index reads the next token's)."""

    def _page_of(self, indices, page):
        return (indices + 1) // page


class PaddingNotSkipped(TorchSparseMLABackend):
    """A -1 entry attended as if it selected a key (it is read as index 0, the request's first
    token, once more or where it was not selected)."""

    def _valid(self, indices):
        return torch.ones_like(indices, dtype=torch.bool)


class BlockStrideIgnored(TorchSparseMLABackend):
    """The cache's blocks read as block x row wide, their own stride ignored: every block past the
    first is read from rows shifted by the gaps before it (vllm#47783's class)."""

    def _rows(self, pool, layer_id, slots):
        blocks = pool.layer_storage(layer_id)
        return blocks.reshape(-1, blocks.shape[-1])[slots]


class TopkTruncated(TorchSparseMLABackend):
    """Only the first half of each top-k row attended, as a kernel tiled for fewer indices than the
    model's index_topk reads it."""

    def _indices(self, indices):
        return indices[:, :indices.shape[1] // 2]


class PaddingClampedToLength(TorchSparseMLABackend):
    """A -1 entry read as an unsigned index clamped to the request's length: it selects the
    column past the request's last token, which is attended (no mask past the length)."""

    def init_forward_metadata(self, batch):
        super().init_forward_metadata(batch)
        self.token_lens = self._per_token(batch, batch.seq_lens[:batch.batch_size].long())

    def _indices(self, indices):
        return torch.where(indices < 0, self.token_lens[:, None], indices)

    def _valid(self, indices):
        return torch.ones_like(indices, dtype=torch.bool)


class EmptyRowNotZeroed(TorchSparseMLABackend):
    """A row with no index (a padded token's under a graph) softmaxed over no keys: NaN where the
    engines write 0."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out = super().forward(q, k, v, layer, batch, save_kv_cache)
        empty = (batch.topk_indices[:q.shape[0]] == -1).all(-1)
        return out.masked_fill(empty[:, None, None], float("nan"))
