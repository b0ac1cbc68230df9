"""A toy backend of another engine's conventions (its profile): one KV buffer a layer with each head's
K and V interleaved ([blocks, block, heads, 2 * head_dim]), padded tokens given no slot (-1: no
write), padded requests empty (seq_len 0, no query token; a token graph's requests padded to its
count), and metadata built from the engine-neutral step description
(`batch.common`: query_start_loc, seq_lens, block_table, slot_mapping), as vLLM's builders build
theirs. Plain PyTorch of fixed shapes (a graph can record it), DECODE and EXTEND. The planted bugs
below write through padded rows."""
from __future__ import annotations

import torch

from kit.engine.profile import BUILDER, COMMON, NO_WRITE, EngineProfile
from kit.harness.protocol import AttentionBackend
from kit.modes import ForwardMode

PROFILE = EngineProfile("toy-interleaved", storage={"dense": "interleaved"}, batch=COMMON, padded_slot=NO_WRITE,
                        padded_seq_len=0, padded_query_len=0, pads_token_graph_requests=True, hooks=BUILDER)


class InterleavedBackend(AttentionBackend):
    name = "toy_interleaved"
    profile = PROFILE
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND)

    @classmethod
    def supports(cls, case):
        if case.window >= 0 or case.cap > 0 or case.hybrid or case.sinks or case.kv_dtype:
            return "toy: plain causal attention only"
        return None

    def init_cuda_graph_state(self, max_bs, max_num_tokens) -> None:
        pass

    def build_for_capture(self, batch) -> None:
        self.init_forward_metadata(batch)

    def init_forward_metadata(self, batch) -> None:
        """The description's device tensors, kept as they are: a graph's are the driver's static
        buffers, refilled before each replay."""
        c = batch.common
        self.query_start_loc, self.seq_lens = c.query_start_loc, c.seq_lens
        self.block_table, self.slot_mapping = c.block_table, c.slot_mapping

    @staticmethod
    def _rows(kv: torch.Tensor) -> torch.Tensor:
        return kv.view(-1, kv.shape[2], kv.shape[3])  # [slots, heads, 2 * head_dim]

    def _write(self, kv: torch.Tensor, k, v, slots: torch.Tensor) -> None:
        """The new tokens' K and V into each head's halves of their slots; a padded token (-1)
        writes back what slot 0 holds (no change, and no host sync: a graph can record it)."""
        rows, d, n = self._rows(kv), k.shape[-1], slots.shape[0]
        safe = slots.clamp(min=0)
        new = torch.cat([k[:n], v[:n]], dim=-1).to(kv.dtype)
        rows[safe] = torch.where((slots >= 0).view(-1, 1, 1), new, rows[safe])

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        kv = batch.token_to_kv_pool.layer_storage(layer.layer_id)  # [blocks, block, heads, 2 * head_dim]
        if save_kv_cache:
            self._write(kv, k, v, self.slot_mapping)
        block, d, n = kv.shape[1], layer.head_dim, q.shape[0]
        qsl, seq_lens = self.query_start_loc.long(), self.seq_lens.long()
        tokens = torch.arange(n, device=q.device)
        req = torch.searchsorted(qsl[1:], tokens, right=True).clamp(max=seq_lens.shape[0] - 1)
        real = tokens < qsl[-1]  # tokens past the last request's: padding
        pos = seq_lens[req] - (qsl[req + 1] - qsl[req]) + (tokens - qsl[req])
        kpos = torch.arange(self.block_table.shape[1] * block, device=q.device)
        slots = self.block_table[req][:, kpos // block].long() * block + kpos % block  # [n, keys]
        rows = self._rows(kv)[slots].float()  # [n, keys, heads, 2d]
        group = layer.tp_q_head_num // layer.tp_k_head_num
        keys, vals = rows[..., :d].repeat_interleave(group, dim=2), rows[..., d:].repeat_interleave(group, dim=2)
        scores = torch.einsum("nhd,nkhd->nhk", q.float(), keys) * layer.scaling
        seen = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] < seq_lens[req][:, None])
        seen = seen | ~real[:, None]  # a padded token attends anything: finite, never judged
        probs = scores.masked_fill(~seen[:, None, :], float("-inf")).softmax(-1)
        out = torch.einsum("nhk,nkhd->nhd", probs, vals)
        return torch.where(real.view(-1, 1, 1), out, 0.0).to(q.dtype)


class WritesPaddedRows(InterleavedBackend):
    """Planted bug: a padded token's KV is written where its slot -1 points (the buffer's last slot)."""

    name = "toy_interleaved_writes_padded"

    def _write(self, kv, k, v, slots):
        n = slots.shape[0]
        self._rows(kv)[slots] = torch.cat([k[:n], v[:n]], dim=-1).to(kv.dtype)


class ClampsPaddedRows(InterleavedBackend):
    """Planted bug: a padded token's slot -1 clamped to 0 and written there (the null block, whose
    slot 0 is no scratch slot in this engine)."""

    name = "toy_interleaved_clamps_padded"

    def _write(self, kv, k, v, slots):
        super()._write(kv, k, v, slots.clamp(min=0))


class PlansAtFirstForward(InterleavedBackend):
    """Right, as FlashMLA is: each build's metadata holds a plan that the first forward on it makes (a device
    copy of the request lengths, FlashMLASchedMeta's tile schedule) and later forwards reuse; a capture
    records the plan only if its run is the metadata's first forward, as vLLM's runner has it (a build for
    each warm-up run and for the capture)."""

    def init_forward_metadata(self, batch) -> None:
        super().init_forward_metadata(batch)
        self.plan = {}

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if "seq_lens" not in self.plan:
            self.plan["seq_lens"] = self.seq_lens.clone()
        planned, self.seq_lens = self.seq_lens, self.plan["seq_lens"]
        try:
            return super().forward(q, k, v, layer, batch, save_kv_cache)
        finally:
            self.seq_lens = planned
