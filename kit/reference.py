"""Independent reference attention, from the fixture's logical token lists.

Never reads the pool, req_to_token or any backend metadata: only the plan
(which keys each query may see, and positions) and the generated q/k/v.
"""
from __future__ import annotations

from typing import Tuple

import torch

from kit.fixture import Fixture
from kit.pools import CASE_LAYER_ID


def visibility(visible: torch.Tensor, q_pos, key_pos, window: int, device) -> torch.Tensor:
    """Structural visibility (causal / tree) intersected with the sliding window (W+1 keys)."""
    vis = visible.to(device)
    if window >= 0:
        qp = torch.tensor(q_pos, device=device).unsqueeze(1)
        kp = torch.tensor(key_pos, device=device).unsqueeze(0)
        vis = vis & (kp >= qp - window) & (kp <= qp)
    return vis


def attention(fixture: Fixture, dtype: torch.dtype = torch.float64, layer_id: int = CASE_LAYER_ID) -> torch.Tensor:
    """[num_tokens, Hq, D] of one layer, in `dtype`. float64 is the golden; the case
    dtype gives the same-dtype reference whose error scales the tolerance."""
    layer = fixture.layers[layer_id]
    q_all = fixture.inputs[layer_id].q.to(dtype)
    group = layer.tp_q_head_num // layer.tp_k_head_num
    outs, n = [], 0
    for req, (k, v) in zip(fixture.plan.requests, fixture.logical_kv(layer_id)):
        q = q_all[n:n + req.n_new]
        n += req.n_new
        k = k.to(dtype).repeat_interleave(group, dim=1)
        v = v.to(dtype).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * layer.scaling
        if layer.logit_cap > 0:
            scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
        vis = visibility(req.visible, req.q_pos, req.key_pos, layer.sliding_window_size, q.device)
        scores = scores.masked_fill(~vis, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs) if outs else q_all.new_zeros(q_all.shape)


def references(fixture: Fixture, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(float64 golden, same-dtype reference) of one layer: computed once per batch and
    process (Fixture.references is shared by every run of the batch), never by a run."""
    if layer_id not in fixture.references:
        fixture.references[layer_id] = (attention(fixture, torch.float64, layer_id),
                                        attention(fixture, fixture.case.torch_dtype, layer_id))
    return fixture.references[layer_id]
