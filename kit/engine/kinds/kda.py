"""Kimi Delta Attention (Kimi Linear), a recurrent kind (kit.engine.kinds.recurrent): GDN's delta rule
with a decay per key channel, not per head.

The projection is [q | k | v] (2 Hk K + Hv V; the model's three depthwise convs are one over the
three), the gate inputs `g` [T, Hv K] (the decay's, per channel) and `b` [T, Hv] (beta's); after the
conv and SiLU, q and k L2-normalized, q scaled by K^-0.5, g = -exp(A_log[h]) softplus(g + dt_bias)
per channel (dt_bias [Hv K]), beta = sigmoid(b):
    S = diag(exp(g)) S;  S = S + beta k (v - k^T S)^T;  o = q^T S"""
from __future__ import annotations

NAME = "kda"
LABEL = "KDA (Kimi delta attention)"
GATES = ("g", "b")
KIMI_LINEAR = (32, 32)  # Kimi-Linear-48B-A3B's heads (q, k and v alike) at TP 1; head dims 128, conv width 4


def gate_widths(case):
    """Each gate input's width per token."""
    return (case.heads[1] * case.head_k_dim, case.heads[1])


def dt_bias_width(case) -> int:
    return case.heads[1] * case.head_k_dim


def split(mixed, layer):
    """(query, key, value) rows of the conv's output [..., conv_dim]."""
    return mixed.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
