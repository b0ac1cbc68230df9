"""Sparse MLA in PyTorch (the in-box implementation of DeepSeek-V3.2's DSA attention): each query
attends the latent rows of the keys its indexer selected (`batch.topk_indices`, kit.engine.sparse),
softmax over those alone, in float32. An index is converted to its KV slot as the engines' kernels
do it, through the request's block table (its page's block, then the offset in the page), and the
row is read from the cache's blocks through their strides: its profile keeps the latent in blocks a
row's gap apart (kit.engine.storage `latent_strided_blocks`), as a cache sharing its allocation
with the indexer's keys has. -1 entries are skipped; a row of none (a padded token's) gives 0.
Graphs in SGLang's two-phase style: the token rows are copied into a static buffer before each
replay. An fp8 cache is read as stored times the layer's k_scale."""
from __future__ import annotations

import torch

from kit.engine.profile import SGLANG, EngineProfile
from kit.engine.sparse import PAD
from kit.harness.protocol import AttentionBackend
from kit.modes import ForwardMode

# Tokens one matmul takes, the last chunk padded: every token is computed in a product of the same
# shape whatever its batch (batch invariance on GPUs, whose kernels depend on the shapes), and a
# chunk's gathered rows stay small.
CHUNK = 16
PROFILE = EngineProfile("torch_sparse_mla", storage={"sparse_mla": "latent_strided_blocks"}, drafts=SGLANG.drafts)


class TorchSparseMLABackend(AttentionBackend):
    name = "torch_sparse_mla"
    profile = PROFILE
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)
    attention_kinds = ("sparse_mla",)
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    batch_invariant = True  # each query attended in products of one shape (CHUNK tokens)
    host_mirrors = ()  # it reads the device's lengths itself

    def init_forward_metadata(self, batch) -> None:
        self.token_rows = self._token_rows(batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graph_rows = torch.zeros(max_num_tokens, dtype=torch.int64, device=self.ctx.device)

    def init_forward_metadata_out_graph(self, batch, in_capture: bool = False) -> None:
        """The token rows copied into the graph's buffer; a padded token past the requests' gets
        row 0 (its indexer row holds no index)."""
        rows = self._token_rows(batch)
        self.graph_rows[:rows.shape[0]].copy_(rows)
        self.graph_rows[rows.shape[0]:].zero_()
        self.token_rows = self.graph_rows[:batch.out_cache_loc.shape[0]]

    def _token_rows(self, batch) -> torch.Tensor:
        """Per token of the batch's requests, its request's req_to_token row (vLLM's req_id_per_token)."""
        return self._per_token(batch, batch.req_pool_indices[:batch.batch_size].long())

    @staticmethod
    def _per_token(batch, values: torch.Tensor) -> torch.Tensor:
        """A value per request repeated for each of its tokens, as the mode lays them out: one in a
        decode, the drafts in a verify, the extend lengths in a prefill (MIXED's decode rows too)."""
        mode = batch.forward_mode
        if mode is ForwardMode.DECODE:
            return values
        if mode is ForwardMode.TARGET_VERIFY:
            return values.repeat_interleave(batch.spec_info.draft_token_num)
        return values.repeat_interleave(batch.extend_seq_lens[:batch.batch_size].long())

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        indices = self._indices(batch.topk_indices[:q.shape[0]].long())
        valid = self._valid(indices)
        slots = self._slots(batch, indices.clamp(min=0))
        out = q.new_empty(q.shape[:-1] + (layer.kv_lora_rank,))
        for start in range(0, q.shape[0], CHUNK):
            end = min(start + CHUNK, q.shape[0])
            pad = CHUNK - (end - start)
            chunk = self._attend(_padded(q[start:end], pad, 0), _padded(slots[start:end], pad, 0),
                                 _padded(valid[start:end], pad, False), pool, layer)
            out[start:end] = chunk[:end - start].to(q.dtype)
        return out

    def _attend(self, q, slots, valid, pool, layer) -> torch.Tensor:
        """[CHUNK, h, rank]: each query's softmax over the latent rows of its selected slots."""
        rows = self._rows(pool, layer.layer_id, slots).float()  # [CHUNK, k, rank + rope]
        if layer.k_scale is not None:
            rows = rows * layer.k_scale
        scores = torch.einsum("thd,tkd->thk", q.float(), rows) * layer.scaling
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        # a row with no index (a padded token's) attends nothing: 0, as vLLM's sparse MLA writes it
        probs = torch.where(valid.any(-1)[:, None, None], scores.softmax(-1), 0.0)
        return torch.einsum("thk,tkd->thd", probs, rows[..., :layer.kv_lora_rank])

    def _indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows of top-k indices attended (all of them)."""
        return indices

    def _valid(self, indices: torch.Tensor) -> torch.Tensor:
        """Which entries select a key: all but the padding."""
        return indices != PAD

    def _page_of(self, indices: torch.Tensor, page: int) -> torch.Tensor:
        """The block-table column of each index: its page in the request."""
        return indices // page

    def _slots(self, batch, indices: torch.Tensor) -> torch.Tensor:
        """KV slots of [T, k] column indices: the block of the index's page, then its offset."""
        page = batch.token_to_kv_pool.page_size
        r2t = batch.req_to_token_pool.req_to_token
        block_table = r2t[:, ::page].long() // page
        blocks = block_table[self.token_rows[:, None], self._page_of(indices, page)]
        return blocks * page + indices % page

    def _rows(self, pool, layer_id: int, slots: torch.Tensor) -> torch.Tensor:
        """The latent rows of `slots`, from the layer's blocks as the cache holds them."""
        blocks = pool.layer_storage(layer_id)  # [blocks, block + gap, rank + rope]
        return blocks[slots // pool.block, slots % pool.block]


def _padded(t: torch.Tensor, rows: int, value) -> torch.Tensor:
    """`t` with `rows` more rows of `value` at the end."""
    if not rows:
        return t
    return torch.cat([t, t.new_full((rows,) + tuple(t.shape[1:]), value)])
