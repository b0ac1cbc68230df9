"""Independent reference attention, from the fixture's logical token lists.

Never reads the pool, req_to_token or any backend metadata: only the plan
(which keys each query may see, and positions) and the generated q/k/v.
"""
from __future__ import annotations

import torch

from kit.fixture import Fixture


def visibility(visible: torch.Tensor, q_pos, key_pos, window: int, device) -> torch.Tensor:
    """Structural visibility (causal / tree) intersected with the sliding window (W+1 keys)."""
    vis = visible.to(device)
    if window >= 0:
        qp = torch.tensor(q_pos, device=device).unsqueeze(1)
        kp = torch.tensor(key_pos, device=device).unsqueeze(0)
        vis = vis & (kp >= qp - window) & (kp <= qp)
    return vis


def attention(fixture: Fixture, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[num_tokens, Hq, D] in `dtype`. float64 is the golden; the case dtype gives
    the same-dtype reference whose error scales the tolerance."""
    case = fixture.case
    q_all = fixture.q.to(dtype)
    group = case.num_q_heads // case.num_kv_heads
    outs, n = [], 0
    for req, (k, v) in zip(fixture.plan.requests, fixture.logical_kv()):
        q = q_all[n:n + req.n_new]
        n += req.n_new
        k = k.to(dtype).repeat_interleave(group, dim=1)
        v = v.to(dtype).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.sm_scale
        if case.cap > 0:
            scores = case.cap * torch.tanh(scores / case.cap)
        vis = visibility(req.visible, req.q_pos, req.key_pos, case.window, q.device)
        scores = scores.masked_fill(~vis, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs) if outs else q_all.new_zeros(q_all.shape)
