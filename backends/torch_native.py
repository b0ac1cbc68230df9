"""A straightforward PyTorch backend: per request, gather K/V through req_to_token
and attend with float32 matmuls. Eager only (no graph hooks): it syncs the host
to read lengths, as a reference backend may. MLA is the same loop over the pool's
latent rows: one KV head, keys the whole row, values its first kv_lora_rank columns
(the pool's get_kv_buffer gives both). An fp8 pool is read as stored (fp8) times the
layer's k_scale / v_scale; its write (the pool's set_kv_buffer) divides by them. Sinks: one more
column of each softmax, dropped after it. DRAFT_DECODE: one query row a lane, its keys the
request's committed tokens and the lane's columns so far (kit/engine/modes/draft_decode.py)."""
from __future__ import annotations

import torch

from kit.engine.modes import rules_for
from kit.engine.modes.draft_decode import lane_columns
from kit.engine.profile import SGLANG
from kit.harness.protocol import AttentionBackend
from kit.modes import MODES, ForwardMode


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"
    profile = SGLANG  # SGLang's batch and pool conventions
    modes = tuple(MODES)
    batch_invariant = True  # each request attended alone, in matmuls of its own shapes
    host_mirrors = ()  # it reads the device's lengths itself (a wait of its own)
    attention_kinds = ("dense", "mla")
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    attention_features = ("sinks",)

    def init_forward_metadata(self, batch) -> None:
        # Each request's cached and new tokens, as its mode's rules read them from the batch (every
        # mode the kit has: DRAFT_EXTEND_V2's seq_lens already count the drafts, say).
        self.rows = batch.req_pool_indices[:batch.batch_size].tolist()
        if batch.forward_mode is ForwardMode.DRAFT_DECODE:  # per step, in forward()
            self.seq_lens = batch.seq_lens[:batch.batch_size].tolist()
            return
        prefix, q_lens = rules_for(batch.forward_mode).query_lens(batch)
        self.prefix, self.q_lens = prefix.tolist(), q_lens.tolist()

    def _key_columns(self, batch):
        """Per query row group: (req_to_token row, its keys' columns, new tokens, cached keys)."""
        if batch.forward_mode is not ForwardMode.DRAFT_DECODE:
            return [(row, range(n_prefix + n_q), n_q, n_prefix)
                    for row, n_q, n_prefix in zip(self.rows, self.q_lens, self.prefix)]
        spec = batch.spec_info
        step = spec.draft_step
        return [(row, list(range(seq_len)) + lane_columns(seq_len, k, spec.num_steps, step + 1), 1, seq_len + step)
                for row, seq_len in zip(self.rows, self.seq_lens) for k in range(spec.topk)]

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
        r2t = batch.req_to_token_pool.req_to_token
        group = layer.tp_q_head_num // layer.tp_k_head_num
        tree = batch.forward_mode is ForwardMode.TARGET_VERIFY
        out = q.new_empty(q.shape[:-1] + (layer.v_head_dim,))
        start = mask_start = 0
        for row, columns, n_q, n_prefix in self._key_columns(batch):
            n_kv = n_prefix + n_q
            slots = r2t[row, torch.as_tensor(columns, device=r2t.device)].long()
            keys = _read(k_cache[slots], layer.k_scale).repeat_interleave(group, dim=1)
            vals = _read(v_cache[slots], layer.v_scale).repeat_interleave(group, dim=1)
            qs = q[start:start + n_q].float()
            scores = torch.einsum("qhd,khd->hqk", qs, keys) * layer.scaling
            if layer.logit_cap > 0:
                scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
            q_pos = batch.positions[start:start + n_q] if tree else n_prefix + torch.arange(n_q, device=q.device)
            if tree:
                allowed = batch.spec_info.custom_mask[mask_start:mask_start + n_q * n_kv].view(n_q, n_kv)
                mask_start += n_q * n_kv
                k_pos = torch.cat([torch.arange(n_prefix, device=q.device), q_pos])
            else:
                k_pos = torch.arange(n_kv, device=q.device)
                allowed = k_pos[None, :] <= q_pos[:, None]
            if layer.sliding_window_size >= 0:
                allowed = allowed & (k_pos[None, :] >= q_pos[:, None] - layer.sliding_window_size)
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[start:start + n_q] = self._attend(scores, vals, layer).to(q.dtype)
            start += n_q
        return out

    def _attend(self, scores, vals, layer):
        """[q, h, Dv]: softmax of masked scores [h, q, k] (with the layer's sink logits, if any, in
        each denominator) over vals [k, h, Dv]."""
        if layer.sinks:
            sinks = layer.sinks_tensor(scores.device).view(-1, 1, 1).expand(scores.shape[:-1] + (1,))
            probs = torch.cat([scores, sinks], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, vals)


def _read(stored: torch.Tensor, scale) -> torch.Tensor:
    """Cached K or V in float32: a quantized cache's values times the layer's scale."""
    return stored.float() if scale is None else stored.float() * scale
