"""A graph-capable toy backend in plain PyTorch.

Fixed shapes (every request gathers a whole req_to_token row, masked by length)
and metadata filled in place, so its forward can be captured in a CUDA graph.
DECODE, TARGET_VERIFY and DRAFT_EXTEND_V2 only.
"""
from __future__ import annotations

import dataclasses

import torch

from kit.engine.profile import SGLANG
from kit.modes import ForwardMode
from kit.harness.protocol import AttentionBackend


@dataclasses.dataclass
class _Metadata:
    rows: torch.Tensor  # int64 [bs]
    prefix: torch.Tensor  # int64 [bs]: cached tokens per request
    kv_len: torch.Tensor  # int64 [bs]
    mask_start: torch.Tensor  # int64 [bs]: offset of each request's custom-mask block
    mask: torch.Tensor  # bool: TARGET_VERIFY custom mask, copied in

    @classmethod
    def empty(cls, bs: int, mask_len: int, device) -> "_Metadata":
        z = lambda n: torch.zeros(n, dtype=torch.int64, device=device)
        return cls(z(bs), z(bs), z(bs), z(bs), torch.zeros(max(mask_len, 1), dtype=torch.bool, device=device))


class DenseGraphBackend(AttentionBackend):
    name = "toy_dense"
    profile = SGLANG

    @classmethod
    def supports(cls, case):
        if case.mode is ForwardMode.EXTEND:
            return "toy: fixed tokens per request only"
        if case.mode is ForwardMode.TARGET_VERIFY and case.window >= 0:
            return "toy: no sliding window with a custom mask"
        return None

    def __init__(self, ctx):
        super().__init__(ctx)
        self.md = None
        self.graph_md = None

    @staticmethod
    def _tokens_per_req(mode, spec_info) -> int:
        return 1 if mode is ForwardMode.DECODE else spec_info.draft_token_num

    def _fill(self, md: _Metadata, bs, req_pool_indices, seq_lens, mode, spec_info) -> None:
        t = self._tokens_per_req(mode, spec_info)
        seq_lens = seq_lens[:bs].long()
        if mode is ForwardMode.DECODE:
            prefix = seq_lens - 1
        elif mode is ForwardMode.TARGET_VERIFY:
            prefix = seq_lens
        else:  # DRAFT_EXTEND_V2: seq_lens count the drafts; padded rows would go negative
            prefix = (seq_lens - spec_info.extend_seq_lens_tensor[:bs].long()).clamp(min=0)
        md.rows[:bs].copy_(req_pool_indices[:bs])
        md.prefix[:bs].copy_(prefix)
        md.kv_len[:bs].copy_(prefix + t)
        if mode is ForwardMode.TARGET_VERIFY:
            sizes = t * md.kv_len[:bs]
            md.mask_start[:bs].copy_(torch.cumsum(sizes, 0) - sizes)
            n = spec_info.custom_mask.numel()
            md.mask[:n].copy_(spec_info.custom_mask)

    def init_forward_metadata(self, batch) -> None:
        bs = batch.batch_size
        md = _Metadata.empty(bs, batch.spec_info.custom_mask.numel() if batch.forward_mode is ForwardMode.TARGET_VERIFY else 0,
                             self.ctx.device)
        self._fill(md, bs, batch.req_pool_indices, batch.seq_lens, batch.forward_mode, batch.spec_info)
        self.md = md

    def init_cuda_graph_state(self, max_bs, max_num_tokens) -> None:
        self.graph_md = _Metadata.empty(max_bs, max_num_tokens * self.ctx.max_context_len, self.ctx.device)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                 forward_mode, spec_info) -> None:
        self._fill(self.graph_md, bs, req_pool_indices, seq_lens, forward_mode, spec_info)
        self.md = self.graph_md

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                forward_mode, spec_info, seq_lens_cpu) -> None:
        self._fill(self.graph_md, bs, req_pool_indices, seq_lens, forward_mode, spec_info)
        self.md = self.graph_md

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
        bs = batch.batch_size
        t = q.shape[0] // bs
        md = self.md
        ctx_len = self.ctx.max_context_len
        dev = q.device
        slots = batch.req_to_token_pool.req_to_token[md.rows[:bs]].long()  # [bs, L]
        keys, vals = k_cache[slots].float(), v_cache[slots].float()  # [bs, L, Hkv, D]
        hkv, d = keys.shape[2], keys.shape[3]
        qs = q.float().view(bs, t, hkv, -1, d)  # [bs, t, Hkv, group, D]
        scores = torch.einsum("btkgd,blkd->bkgtl", qs, keys) * layer.scaling
        if layer.logit_cap > 0:
            scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
        kpos = torch.arange(ctx_len, device=dev).view(1, 1, -1)
        qidx = (md.prefix[:bs].view(-1, 1) + torch.arange(t, device=dev).view(1, -1)).unsqueeze(-1)  # [bs, t, 1]
        allowed = kpos < md.kv_len[:bs].view(-1, 1, 1)
        if batch.forward_mode is ForwardMode.TARGET_VERIFY:
            row = torch.arange(t, device=dev).view(1, -1, 1) * md.kv_len[:bs].view(-1, 1, 1)
            flat = (md.mask_start[:bs].view(-1, 1, 1) + row + kpos).clamp(max=md.mask.numel() - 1)
            allowed = allowed & md.mask[flat]
        else:
            allowed = allowed & (kpos <= qidx)
            if layer.sliding_window_size >= 0:
                allowed = allowed & (kpos >= qidx - layer.sliding_window_size)
        scores = scores.masked_fill(~allowed.view(bs, 1, 1, t, ctx_len), float("-inf"))
        out = torch.einsum("bkgtl,blkd->btkgd", scores.softmax(-1), vals)
        return out.reshape(q.shape).to(q.dtype)


class StaleReplayBackend(DenseGraphBackend):
    """Planted graph bug: replay leaves the capture-time metadata in place."""

    name = "toy_stale_replay"

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs) -> None:
        self.md = self.graph_md


class CiSubsetBackend(DenseGraphBackend):
    """A backend that names its CPU CI subset: one decode case."""

    name = "toy_ci_subset"
    ci_cases = {"decode": ("mqa_p1_shuf",)}
