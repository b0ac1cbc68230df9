"""A straightforward PyTorch backend written against the kit's own step description (its profile,
NATIVE: `batch.step`, kit.engine.plan): per request, gather K/V of its keys through req_to_token
and attend with float32 matmuls where the description says each query may see (and the layer's
window). Eager only (no graph hooks). MLA is the same loop over the pool's
latent rows: one KV head, keys the whole row, values its first kv_lora_rank columns
(the pool's get_kv_buffer gives both). An fp8 pool is read as stored (fp8) times the
layer's k_scale / v_scale; its write (the pool's set_kv_buffer) divides by them. Sinks: one more
column of each softmax, dropped after it. It returns each row's log-sum-exp beside the output
(returns_lse), of the same masked logits. DRAFT_DECODE needs nothing of its own: each step's
description has a request a lane, its keys the committed tokens and the lane's columns so far."""
from __future__ import annotations

import torch

from kit.engine.profile import NATIVE
from kit.harness.protocol import AttentionBackend
from kit.modes import MODES


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"
    profile = NATIVE
    modes = tuple(MODES)
    batch_invariant = True  # each request attended alone, in matmuls of its own shapes
    host_mirrors = ()  # it reads no lengths of the batch: the description holds them
    attention_kinds = ("dense", "mla")
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    attention_features = ("sinks",)
    returns_lse = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self._held = {}  # id(request plan) -> (the plan, its tensors on the device): _on_device

    def init_forward_metadata(self, batch) -> None:
        """Nothing to build: forward() reads each step's description."""

    def _on_device(self, request, device):
        """A request's key tokens, mask and positions as device tensors, made at its first forward (a
        graph's warm-up run, before the capture: a captured forward copies nothing from the host)."""
        held = self._held.get(id(request))
        if held is None or held[0] is not request:
            held = (request, torch.as_tensor(request.key_tokens, device=device), request.visible.to(device),
                    torch.as_tensor(request.q_pos, device=device), torch.as_tensor(request.key_pos, device=device))
            self._held[id(request)] = held
        return held[1:]

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.step is None:
            raise ValueError("torch_native reads the step description (batch.step): build its batches under its "
                             "profile (kit.engine.profile.NATIVE)")
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
        r2t = batch.req_to_token_pool.req_to_token
        group = layer.tp_q_head_num // layer.tp_k_head_num
        # Rows no request of the description owns (a graph's padded rows) read zeros.
        out = q.new_zeros(q.shape[:-1] + (layer.v_head_dim,))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        start = 0
        for request in batch.step.requests:
            n_q = request.n_new
            key_tokens, allowed, q_pos, k_pos = self._on_device(request, q.device)
            slots = r2t[request.row, key_tokens.to(r2t.device)].long()
            keys = _read(k_cache[slots], layer.k_scale).repeat_interleave(group, dim=1)
            vals = _read(v_cache[slots], layer.v_scale).repeat_interleave(group, dim=1)
            qs = q[start:start + n_q].float()
            scores = torch.einsum("qhd,khd->hqk", qs, keys) * layer.scaling
            if layer.logit_cap > 0:
                scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
            if layer.sliding_window_size >= 0:
                allowed = allowed & (k_pos[None, :] >= q_pos[:, None] - layer.sliding_window_size)
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[start:start + n_q] = self._attend(scores, vals, layer).to(q.dtype)
            lse[start:start + n_q] = self._lse(scores, layer).transpose(0, 1)
            start += n_q
        return out, lse

    def _attend(self, scores, vals, layer):
        """[q, h, Dv]: softmax of masked scores [h, q, k] (with the layer's sink logits, if any, in
        each denominator) over vals [k, h, Dv]."""
        if layer.sinks:
            probs = torch.cat([scores, _sink_column(scores, layer)], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, vals)

    def _lse(self, scores, layer):
        """[h, q]: the natural log of each softmax's denominator, the sink logits in."""
        if layer.sinks:
            scores = torch.cat([scores, _sink_column(scores, layer)], dim=-1)
        return torch.logsumexp(scores, dim=-1)


def _sink_column(scores, layer):
    """The layer's sink logits as one more column of masked scores [h, q, k]."""
    return layer.sinks_tensor(scores.device).view(-1, 1, 1).expand(scores.shape[:-1] + (1,))


def _read(stored: torch.Tensor, scale) -> torch.Tensor:
    """Cached K or V in float32: a quantized cache's values times the layer's scale."""
    return stored.float() if scale is None else stored.float() * scale
