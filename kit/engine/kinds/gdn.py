"""Gated delta net (Qwen3-Next, Qwen3.5), a recurrent kind (kit.engine.kinds.recurrent).

The projection is [q | k | v] (2 Hk K + Hv V), the gate inputs `a` (the decay's) and `b` (beta's);
per value head h (key head h // (Hv / Hk)) after the conv and SiLU, q and k L2-normalized, q scaled
by K^-0.5, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b):
    S = exp(g) S;  S = S + beta k (v - k^T S)^T;  o = q^T S"""
from __future__ import annotations

NAME = "gdn"
LABEL = "GDN (gated delta net)"
GATES = ("a", "b")
QWEN3_NEXT = (16, 32)  # (key heads, value heads) of Qwen3-Next-80B-A3B at TP 1; head dims 128, conv width 4


def split(mixed, layer):
    """(query, key, value) rows of the conv's output [..., conv_dim]."""
    return mixed.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)


def gate_widths(case):
    """Each gate input's width per token."""
    return (case.heads[1],) * len(GATES)


def dt_bias_width(case) -> int:
    return case.heads[1]
