"""The gated delta net, from its definition (Qwen3-Next's GatedDeltaNet), one request at a time.

Never reads a pool or a backend's metadata: a request's projection rows, gate inputs, the layer's
weights and the state it starts from. Token by token, per value head h (its key head h // (Hv / Hk)):

    x_t   = silu(causal depthwise conv1d over the window's rows and this one)   (q, k, v split from it)
    q, k  = l2-normalized per head; q *= head_k_dim ** -0.5
    g     = -exp(A_log) * softplus(a + dt_bias);  beta = sigmoid(b)
    S     = exp(g) S;  S = S + beta k (v - k^T S)^T;  o = q^T S

computed in `dtype` (float64: the golden; float32: what a correct kernel's arithmetic gives, whose
error scales the tolerance). It returns the state after every token, so that a speculative step's
per-draft states (and so the state of a request that keeps n drafts) are the reference's too.
"""
from __future__ import annotations

import dataclasses
from typing import List

import torch
import torch.nn.functional as F

from kit.engine.kinds.gdn import GdnLayer


@dataclasses.dataclass
class GdnRun:
    """What a request's tokens give, in the reference's dtype."""

    out: torch.Tensor  # [n, Hv, V]
    states: List[torch.Tensor]  # after each token, [Hv, K, V]
    windows: List[torch.Tensor]  # the conv window after each token, [conv_dim, width - 1] (the raw rows)


def conv_windows(window: torch.Tensor, rows: torch.Tensor) -> List[torch.Tensor]:
    """The conv window ([conv_dim, width - 1], oldest row first) after each of `rows` [n, conv_dim]."""
    seq = torch.cat([window, rows.t().to(window.dtype)], dim=1)
    w = window.shape[1]
    return [seq[:, i + 1:i + 1 + w] for i in range(rows.shape[0])]


def gates(w: GdnLayer, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype):
    """(g, beta) [n, Hv]: the log-decay and the write strength."""
    g = -w.A_log.to(dtype).exp() * F.softplus(a.to(dtype) + w.dt_bias.to(dtype))
    return g, torch.sigmoid(b.to(dtype))


def run_request(w: GdnLayer, rows: torch.Tensor, a: torch.Tensor, b: torch.Tensor, window: torch.Tensor,
                state: torch.Tensor, dtype: torch.dtype = torch.float64) -> GdnRun:
    """One request's n tokens (`rows` [n, conv_dim], `a`/`b` [n, Hv]) from `window` and `state`."""
    hk, hv, dk, dv = w.num_k_heads, w.num_v_heads, w.head_k_dim, w.head_v_dim
    seq = torch.cat([window.to(dtype), rows.t().to(dtype)], dim=1)  # [conv_dim, width - 1 + n]
    mixed = F.silu(F.conv1d(seq[None], w.conv_weights.to(dtype)[:, None, :], groups=seq.shape[0])[0].t())  # [n, conv_dim]
    q, k, v = mixed.split([hk * dk, hk * dk, hv * dv], dim=-1)
    q = F.normalize(q.reshape(-1, hk, dk), dim=-1) * dk ** -0.5
    k = F.normalize(k.reshape(-1, hk, dk), dim=-1)
    q, k = q.repeat_interleave(hv // hk, dim=1), k.repeat_interleave(hv // hk, dim=1)  # value head h reads key head h // group
    v = v.reshape(-1, hv, dv)
    g, beta = gates(w, a, b, dtype)
    s = state.to(dtype)
    outs, states = [], []
    for t in range(rows.shape[0]):
        s = s * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hk,hkv->hv", k[t], s)) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q[t], s))
        states.append(s)
    out = torch.stack(outs) if outs else rows.new_zeros((0, hv, dv), dtype=dtype)
    return GdnRun(out, states, conv_windows(window, rows))
