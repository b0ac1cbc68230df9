"""Linear attention with a recurrent state, from the models' definitions (Qwen3-Next's GatedDeltaNet,
Mamba2's mixer, Kimi Linear's KDA), one request at a time: kit.engine.kinds.gdn, .mamba2 and .kda
write them.

Never reads a pool or a backend's metadata: a request's projection rows, gate inputs, the layer's
weights and the state it starts from. Token by token after a causal depthwise conv1d (over the
window's rows and the request's) and SiLU, in `dtype` (float64: the golden; float32: what a correct
kernel's arithmetic gives, whose error scales the tolerance). States are in the kit's [Hv, K, V]
arithmetic (kit.engine.kinds.recurrent); it returns the state after every token, so that a
speculative step's per-draft states (and so the state of a request that keeps n drafts) are the
reference's too. A kind in CHUNKED takes STATE_CAST chunk by chunk, as its engines' chunked prefill
kernels compute (Mamba2's SSD), its state after a token the state of a chunk ending there.
"""
from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

from kit.engine.kinds.mamba2 import CHUNK_SIZE
from kit.engine.kinds.recurrent import RecurrentLayer
from kit.engine.numerics import CONV_CAST, CONV_PRODUCTS, QK_CAST, STATE_CAST


@dataclasses.dataclass
class RecurrentRun:
    """What a request's tokens give, in the reference's dtype."""

    out: torch.Tensor  # [n, Hv, V]
    states: List[torch.Tensor]  # after each token, [Hv, K, V]
    windows: List[torch.Tensor]  # the conv window after each token, [conv_dim, width - 1] (the raw rows)


def conv_windows(window: torch.Tensor, rows: torch.Tensor) -> List[torch.Tensor]:
    """The conv window ([conv_dim, width - 1], oldest row first) after each of `rows` [n, conv_dim]."""
    seq = torch.cat([window, rows.t().to(window.dtype)], dim=1)
    w = window.shape[1]
    return [seq[:, i + 1:i + 1 + w] for i in range(rows.shape[0])]


def _delta_rule(layer: RecurrentLayer, q, k, v, decay, b, dtype, cast):
    """GDN's and KDA's: (the state's update (state, t) -> state, the output (state, t) -> [Hv, V]);
    decay [n, Hv, K] (GDN's the same along K)."""
    q = cast(F.normalize(q, dim=-1), QK_CAST) * layer.head_k_dim ** -0.5
    k = cast(F.normalize(k, dim=-1), QK_CAST)
    beta = torch.sigmoid(b.to(dtype))

    def update(s, t):
        s = s * decay[t][:, :, None]
        delta = (v[t] - torch.einsum("hk,hkv->hv", k[t], s)) * beta[t][:, None]
        return s + k[t][:, :, None] * delta[:, None, :]
    return update, lambda s, t: torch.einsum("hk,hkv->hv", q[t], cast(s, STATE_CAST))


def _gdn(layer: RecurrentLayer, q, k, v, gates, dtype, cast):
    a, b = gates
    decay = (-layer.A_log.to(dtype).exp() * F.softplus(a.to(dtype) + layer.dt_bias.to(dtype))).exp()
    return _delta_rule(layer, q, k, v, decay[:, :, None].expand(-1, -1, layer.head_k_dim), b, dtype, cast)


def _kda(layer: RecurrentLayer, q, k, v, gates, dtype, cast):
    g, b = gates
    hv, dk = layer.num_v_heads, layer.head_k_dim
    softplus = F.softplus((g.to(dtype) + layer.dt_bias.to(dtype)).unflatten(-1, (hv, dk)))
    return _delta_rule(layer, q, k, v, (-layer.A_log.to(dtype).exp()[:, None] * softplus).exp(), b, dtype, cast)


def _mamba2_dt(layer: RecurrentLayer, gates, dtype):
    """Mamba2's dt = softplus(dt + dt_bias) [n, H] and its log-decay dt A (A = -exp(A_log))."""
    dt = F.softplus(gates[0].to(dtype) + layer.dt_bias.to(dtype))
    return dt, -layer.A_log.to(dtype).exp() * dt


def _mamba2(layer: RecurrentLayer, c, b, x, gates, dtype, cast):
    dt, log_decay = _mamba2_dt(layer, gates, dtype)
    decay = log_decay.exp()

    def update(s, t):
        return s * decay[t][:, None, None] + dt[t][:, None, None] * b[t][:, :, None] * x[t][:, None, :]
    return update, lambda s, t: torch.einsum("hk,hkv->hv", c[t], s) + layer.D.to(dtype)[:, None] * x[t]


def ssd_chunks(position: int, n: int) -> List[Tuple[int, int]]:
    """[start, end) of each SSD chunk of a request's n new tokens after its `position` saved ones: chunk
    boundaries on multiples of CHUNK_SIZE of the request's positions (vLLM's chunk metadata; SGLang's
    chunks of a batch's stream of prefill tokens fall there for its first request)."""
    bounds, t = [], 0
    while t < n:
        end = min(n, t + CHUNK_SIZE - (position + t) % CHUNK_SIZE)
        bounds.append((t, end))
        t = end
    return bounds


def _mamba2_chunked(layer: RecurrentLayer, c, b, x, gates, dtype, cast, state, position):
    """Mamba2's prefill as the engines' chunked SSD kernels compute it (outputs [n, H, V], the state
    after each token), taking STATE_CAST as their tiles round to the model's dtype: a chunk's B scaled
    by its decay to the token and dt before the product with x (chunk_state), C B^T scaled likewise
    before the product with x (chunk_scan), and the state at the chunk's start where it meets C."""
    dt, log_decay = _mamba2_dt(layer, gates, dtype)
    skip = layer.D.to(dtype)[:, None]
    outs, states = [], []
    for start, end in ssd_chunks(position, x.shape[0]):
        cum = log_decay[start:end].cumsum(0)  # [L, H]
        cc, bb, xx = c[start:end], b[start:end], x[start:end]
        causal = torch.ones(end - start, end - start, dtype=torch.bool, device=x.device).tril()[:, :, None]
        # token m's weight of token k's write (k <= m): its decay since then, times its dt; [m, k, H]
        weight = torch.where(causal, (cum[:, None] - cum[None]).clamp_max(0).exp() * dt[None, start:end], 0)
        scores = torch.einsum("mhn,khn->mkh", cc, bb) * weight
        outs.append(torch.einsum("mhn,hnp->mhp", cc, cast(state, STATE_CAST)) * cum.exp()[:, :, None]
                    + torch.einsum("mkh,khp->mhp", cast(scores, STATE_CAST), xx) + skip * xx)
        first = state
        for m in range(end - start):
            written = cast(bb[:m + 1] * weight[m, :m + 1, :, None], STATE_CAST)  # [k, H, N]
            states.append(first * cum[m].exp()[:, None, None] + torch.einsum("khn,khp->hnp", written, xx[:m + 1]))
        state = states[-1]
    return torch.cat(outs), states


STEPS = {"gdn": _gdn, "mamba2": _mamba2, "kda": _kda}
# The kinds whose STATE_CAST is their chunked prefill form's (in place of the token scan's state cast at q).
CHUNKED = {"mamba2": _mamba2_chunked}


def _cast(x: torch.Tensor, step: str, model: torch.dtype, casts: Sequence[str]) -> torch.Tensor:
    """x as a kernel that takes `step` stores it: in the model's dtype, read back in x's."""
    return x.to(model).to(x.dtype) if step in casts else x


def causal_conv(window: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype = torch.float64,
                casts: Sequence[str] = ()) -> torch.Tensor:
    """The depthwise causal conv and SiLU of `rows` [n, conv_dim] after `window` [conv_dim, width - 1]
    ([n, conv_dim], in `dtype`), taking CONV_PRODUCTS and CONV_CAST of `casts` to the rows' dtype."""
    seq = torch.cat([window.to(dtype), rows.t().to(dtype)], dim=1)  # [conv_dim, width - 1 + n]
    # As taps times weights: torch's float64 depthwise conv1d is slow on CPU.
    taps = seq.unfold(1, weights.shape[1], 1)  # [conv_dim, n, width]
    products = _cast(taps * weights.to(dtype)[:, None, :], CONV_PRODUCTS, rows.dtype, casts)
    return _cast(F.silu(products.sum(-1).t()), CONV_CAST, rows.dtype, casts)


def run_request(layer: RecurrentLayer, rows: torch.Tensor, gates: Sequence[torch.Tensor], window: torch.Tensor,
                state: torch.Tensor, dtype: torch.dtype = torch.float64, casts: Sequence[str] = (),
                position: int = 0) -> RecurrentRun:
    """One request's n tokens (`rows` [n, conv_dim], each gate [n, Hv]) from `window` and `state` [Hv, K, V]
    after `position` tokens, taking the declared `casts` (kit.engine.numerics: CONV_PRODUCTS, CONV_CAST,
    QK_CAST, STATE_CAST) to the rows' dtype."""
    def cast(x, step):
        return _cast(x, step, rows.dtype, casts)
    hk, hv = layer.num_k_heads, layer.num_v_heads
    mixed = causal_conv(window, rows, layer.conv_weights, dtype, casts)
    q, k, v = layer.spec.split(mixed, layer)
    # value head h reads key head h // (Hv / Hk)
    q, k = (t.unflatten(-1, (hk, layer.head_k_dim)).repeat_interleave(hv // hk, dim=1) for t in (q, k))
    v = v.unflatten(-1, (hv, layer.head_v_dim))
    s = state.to(dtype)
    if STATE_CAST in casts and layer.kind in CHUNKED and rows.shape[0]:
        out, states = CHUNKED[layer.kind](layer, q, k, v, gates, dtype, cast, s, position)
        return RecurrentRun(out, states, conv_windows(window, rows))
    update, output = STEPS[layer.kind](layer, q, k, v, gates, dtype, cast)
    outs, states = [], []
    for t in range(rows.shape[0]):
        s = update(s, t)
        outs.append(output(s, t))
        states.append(s)
    out = torch.stack(outs) if outs else rows.new_zeros((0, hv, layer.head_v_dim), dtype=dtype)
    return RecurrentRun(out, states, conv_windows(window, rows))
