"""Mamba2's SSD (state space duality), a recurrent kind (kit.engine.kinds.recurrent), in GDN's geometry:
groups are key heads, d_state the key width, head_dim the value width.

The projection is [x | B | C] (H P + 2 G N), the gate input `dt`; after the conv and SiLU, per head h
(group h // (H / G)), dt = softplus(dt + dt_bias), A = -exp(A_log):
    h = exp(dt A) h + dt x B^T;  y = h C + D x"""
from __future__ import annotations

NAME = "mamba2"
LABEL = "Mamba2 (SSD)"
GATES = ("dt",)
# The SSD scan's chunk the engines' adapters configure: mamba_chunk_size of Mamba2-2.7B's and Nemotron-H's configs.
CHUNK_SIZE = 256


def split(mixed, layer):
    """(query, key, value) rows of the conv's output: (C, B, x)."""
    x, b, c = mixed.split([layer.v_dim, layer.k_dim, layer.q_dim], dim=-1)
    return c, b, x


def gate_widths(case):
    """Each gate input's width per token."""
    return (case.heads[1],)


def dt_bias_width(case) -> int:
    return case.heads[1]
