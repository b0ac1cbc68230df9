"""Independent reference attention, from a batch's logical token lists.

Never reads the pool, req_to_token or any backend metadata: only the plan
(which keys each query may see, and positions), the model's layers and the
generated q/k/v (`Batch`: a kit.engine.fixture.Fixture is one). The fixture
keeps what is computed here (Fixture.reference). A quantized (fp8) KV cache's
K and V are quantized as the pool's write quantizes them and attended as read
back (`as_read`): the reference is exact on what the pool can hold.

The float64 golden computes the requests together, padded to the longest (a
padded key is masked out, a padded query dropped): a few dozen operations per
batch, not per request.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Protocol, Tuple

import torch

from kit.engine.kv_quant import as_stored, is_quantized
from kit.engine.layer import Layer
from kit.engine.numerics import ENVELOPE_STEPS, NEW_AS_HANDED, P_CAST, P_FP8, P_HALF, Q_CAST, Q_FP8, ROPE_AS_HANDED, TF32
from kit.engine.plan import BatchPlan, RequestPlan
from kit.engine.pools import CASE_LAYER_ID
from kit.engine.sparse import selected
from kit.engine.transfer import to_device


class LayerInputs(Protocol):
    """One layer's random inputs for a batch (kit.engine.fixture.LayerInputs)."""

    q: torch.Tensor  # [num_tokens, Hq, D] new tokens' queries
    k_new: torch.Tensor  # [num_tokens, Hkv, D] new tokens' keys
    v_new: torch.Tensor  # [num_tokens, Hkv, Dv]
    k_old: torch.Tensor  # [sum n_old, Hkv, D] cached tokens' keys, in request order
    v_old: torch.Tensor


class Batch(Protocol):
    """What a reference is computed from."""

    plan: BatchPlan
    layers: Tuple[Layer, ...]  # the model, in layer order (layer_id = index)
    inputs: List[LayerInputs]  # per layer


@dataclasses.dataclass
class _AsRead:
    """A layer's inputs with K and V as a backend reads them back from a quantized pool."""

    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    k_old: torch.Tensor
    v_old: torch.Tensor


def as_read(batch: Batch, layer_id: int, steps: Tuple[str, ...] = ()) -> LayerInputs:
    """One layer's inputs, K and V quantized as the pool stores them (the layer's k_scale /
    v_scale, kit.engine.kv_quant) and read back (float32, exact); the inputs themselves where
    the KV cache is not quantized. With declared numerics' `steps` (kit.engine.numerics) holding
    NEW_AS_HANDED, the new tokens' K and V as handed."""
    x, layer, dtype = batch.inputs[layer_id], batch.layers[layer_id], batch.plan.case.kv_torch_dtype
    if not is_quantized(dtype):
        return x
    k_scale, v_scale = layer.k_scale, layer.v_scale
    handed = NEW_AS_HANDED in steps
    return _AsRead(x.q, x.k_new if handed else as_stored(x.k_new, k_scale, dtype),
                   x.v_new if handed else as_stored(x.v_new, v_scale, dtype),
                   as_stored(x.k_old, k_scale, dtype), as_stored(x.v_old, v_scale, dtype))


def logical_kv(plan: BatchPlan, x: LayerInputs) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Per request, K and V of every logical token of one layer's inputs in order (cached, then new)."""
    out, o, n = [], 0, 0
    for r in plan.requests:
        k = torch.cat([x.k_old[o:o + r.n_old], x.k_new[n:n + r.n_new]])
        v = torch.cat([x.v_old[o:o + r.n_old], x.v_new[n:n + r.n_new]])
        out.append((k, v))
        o, n = o + r.n_old, n + r.n_new
    return out

# Requests are taken in groups whose padded float64 scores stay under this size.
CHUNK_BYTES = 256 << 20


def attended(r: RequestPlan) -> torch.Tensor:
    """The keys each new token attends, before the window: those it sees, or of a sparse layer
    exactly those its indexer selected (the definition: softmax over the selected keys alone)."""
    return r.visible if r.selected is None else selected(r.selected, r.total)


def visibility(visible: torch.Tensor, q_pos, key_pos, window: int, device) -> torch.Tensor:
    """Structural visibility (causal / tree) intersected with the sliding window (W+1 keys)."""
    vis = to_device(visible, device)
    if window >= 0:
        qp = to_device(q_pos, device).unsqueeze(1)
        kp = to_device(key_pos, device).unsqueeze(0)
        vis = vis & (kp >= qp - window) & (kp <= qp)
    return vis


@dataclasses.dataclass
class _Group:
    """Consecutive requests, padded to [B, Q, K]: where each query and key comes from."""

    q_rows: torch.Tensor  # [B, Q] row of the batch's q (padding: 0)
    k_rows: torch.Tensor  # [B, K] row of cat(k_old, k_new) (padding: 0)
    hidden: torch.Tensor  # [B, Q, K] query may not see key (negated on the host: no device operation)
    out_rows: torch.Tensor  # [tokens] the group's tokens in [B * Q] order
    slices: List[Tuple[int, int, int]]  # per b: (request index, its first and end query row)


def _group(slices: List[Tuple[int, RequestPlan, int, int, int, int]], num_old: int, window: int, device) -> _Group:
    """`slices`: (request index, plan, first old-key row, first new-token row, first and end query row
    of the request taken) each."""
    b = len(slices)
    q, k = max(q1 - q0 for *_, q0, q1 in slices), max(r.total for _, r, *_ in slices)
    q_rows = torch.zeros(b, q, dtype=torch.int64)
    k_rows = torch.zeros(b, k, dtype=torch.int64)
    mask = torch.zeros(b, q, k, dtype=torch.bool)
    out_rows = []
    for i, (_, r, o, n, q0, q1) in enumerate(slices):
        q_rows[i, :q1 - q0] = torch.arange(n + q0, n + q1)
        k_rows[i, :r.n_old] = torch.arange(o, o + r.n_old)
        k_rows[i, r.n_old:r.total] = torch.arange(num_old + n, num_old + n + r.n_new)
        mask[i, :q1 - q0, :r.total] = visibility(attended(r), r.q_pos, r.key_pos, window, "cpu")[q0:q1]
        out_rows += range(i * q, i * q + q1 - q0)
    tensors = (to_device(t, device) for t in (q_rows, k_rows, ~mask, torch.tensor(out_rows, dtype=torch.int64)))
    return _Group(*tensors, [(j, q0, q1) for j, _, _, _, q0, q1 in slices])


def _groups(plan: BatchPlan, num_heads: int, window: int, device) -> List[_Group]:
    """The plan's requests in order, in groups of padded scores under CHUNK_BYTES, seen
    through a layer's sliding window; a request whose scores alone exceed it in slices of its
    query rows (a long prefill of many heads: its float64 scores would take gigabytes)."""
    num_old = sum(r.n_old for r in plan.requests)
    slices, o, n = [], 0, 0
    for j, r in enumerate(plan.requests):
        rows = max(1, CHUNK_BYTES // (max(r.total, 1) * num_heads * 8))
        slices += [(j, r, o, n, q0, min(q0 + rows, r.n_new)) for q0 in range(0, r.n_new, rows)] or [(j, r, o, n, 0, 0)]
        o, n = o + r.n_old, n + r.n_new
    groups, current = [], []
    for piece in slices:
        grown = current + [piece]
        size = len(grown) * max(q1 - q0 for *_, q0, q1 in grown) * max(x[1].total for x in grown) * num_heads * 8
        if current and size > CHUNK_BYTES:
            groups.append(_group(current, num_old, window, device))
            grown = [piece]
        current = grown
    if current:
        groups.append(_group(current, num_old, window, device))
    return groups


def _logits(scores: torch.Tensor, hidden: torch.Tensor, layer, sinks: Optional[torch.Tensor]) -> torch.Tensor:
    """Scaled (and capped) scores, those hidden -inf (last axis); with `sinks`, shaped to broadcast over
    the scores but their last axis, the layer's sink logits as one more column."""
    scores = scores * layer.scaling
    if layer.logit_cap > 0:
        scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is None:
        return scores
    return torch.cat([scores, sinks.to(scores.dtype).expand(scores.shape[:-1] + (1,))], dim=-1)


def _probs(scores: torch.Tensor, hidden: torch.Tensor, layer, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax of scaled (and capped) scores over the keys not hidden (last axis). `sinks`: the
    layer's sink logits, one more term of each denominator that carries no value (its column is
    dropped after the softmax)."""
    probs = torch.softmax(_logits(scores, hidden, layer, sinks), dim=-1)
    return probs if sinks is None else probs[..., :-1]


def _softmax(scores: torch.Tensor, hidden: torch.Tensor, layer,
             sinks: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(_probs(), the log-sum-exp of the same logits, the contract's: natural log of each
    denominator, sinks in), from one reduction."""
    logits = _logits(scores, hidden, layer, sinks)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.exp(logits - lse)
    return (probs if sinks is None else probs[..., :-1]), lse.squeeze(-1)


def _sinks(layer, shape, device) -> Optional[torch.Tensor]:
    """The layer's sink logits (float64) viewed as `shape` (its query-head axes), or None without sinks."""
    return torch.tensor(layer.sinks, dtype=torch.float64, device=device).view(shape) if layer.sinks else None


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x (float64) as a tensor core takes a float32 operand of a TF32 dot: its mantissa truncated to
    10 bits. Triton hands tl.dot's float32 operands to the tensor cores unrounded (rounding them
    first is an option of later Triton, triton-lang/triton#9295), and truncation's error leans one
    way, which a rounded emulation's envelope does not cover."""
    bits = x.to(torch.float32).view(torch.int32)
    return (bits & ~0x1FFF).view(torch.float32).to(x.dtype)


def _p_fp8(probs: torch.Tensor) -> torch.Tensor:
    """Probabilities as an fp8 PV product takes them (FA3, vLLM's Triton kernel): each row's
    exp(s - max) (here, the row's largest probability is 1) scaled by 2^8 into fp8 e4m3's range and
    quantized, the row's sum unrounded."""
    top = probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return (probs / top * 256).to(torch.float8_e4m3fn).to(probs.dtype) / 256 * top


def _p_cast(probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Probabilities cast to the cache's fp8 `dtype` with no scale (SGLang's p.to(v.dtype)): each row's
    exp(s - max) rounded, small ones flushed, the row's sum unrounded."""
    top = probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return (probs / top).to(dtype).to(probs.dtype) * top


def _p_half(probs: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Probabilities as FlashInfer's prefill kernels keep them: each row's exp(s - max) rounded to the
    model's `dtype`, and the row's sum taken over the rounded values (a sink's share, what the row's
    probabilities leave of 1, unrounded). Returns (the rounded values over that sum, the sum as a share
    of the exact denominator: the log-sum-exp grows by its log)."""
    top = probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    rounded = (probs / top).to(dtype).to(probs.dtype) * top
    total = rounded.sum(dim=-1, keepdim=True) + (1 - probs.sum(dim=-1, keepdim=True))
    return rounded / total, total.squeeze(-1)


def _queries(q: torch.Tensor, layer, dtype: torch.dtype, steps: Tuple[str, ...]) -> torch.Tensor:
    """The queries as they meet a key the cache holds: quantized to its fp8 `dtype` with q_scale =
    k_scale (Q_FP8), cast to it (Q_CAST), else as handed; an MLA query's rope columns as handed
    with ROPE_AS_HANDED."""
    if Q_FP8 not in steps and Q_CAST not in steps:
        return q
    stored = as_stored(q, layer.k_scale if Q_FP8 in steps else 1.0, dtype)
    if ROPE_AS_HANDED in steps:
        return torch.cat([stored[..., :layer.kv_lora_rank], q[..., layer.kv_lora_rank:].to(stored.dtype)], dim=-1)
    return stored


def _attend(group: _Group, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer,
            steps: Tuple[str, ...] = (), q_stored: Optional[torch.Tensor] = None,
            kv_dtype: Optional[torch.dtype] = None,
            model_dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
    """([group tokens, Hq, Dv] output, [group tokens, Hq] log-sum-exp); q: the batch's queries, k/v: cat(old, new) keys and values (MLA:
    k the latent rows, v their first kv_lora_rank columns, so that a score is
    q_latent . c_kv + q_rope . k_rope and the output a mix of c_kv). Declared numerics
    (kit.engine.numerics): `q_stored`, the queries as they meet keys read from the cache (the new
    tokens' too unless `steps` hold NEW_AS_HANDED); the envelope steps of `steps` the products take
    (P_CAST casts to the cache's `kv_dtype`, P_HALF to the case's `model_dtype`)."""
    b, nq = group.q_rows.shape
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    round_in = _tf32 if TF32 in steps else (lambda x: x)
    kg, vg = round_in(k[group.k_rows]), round_in(v[group.k_rows])

    def scores(queries: torch.Tensor) -> torch.Tensor:
        qg = round_in(queries[group.q_rows].view(b, nq, hkv, hq // hkv, d))  # a query head's KV head: h // group
        return torch.einsum("bqhgd,bkhd->bhgqk", qg, kg)
    s = scores(q if q_stored is None else q_stored)
    if q_stored is not None and NEW_AS_HANDED in steps:  # the new tokens' keys meet q as handed
        new_key = (group.k_rows >= k.shape[0] - q.shape[0])[:, None, None, None, :]
        s = torch.where(new_key, scores(q), s)
    sinks = _sinks(layer, (1, hkv, hq // hkv, 1, 1), q.device)
    probs, lse = _softmax(s, group.hidden[:, None, None], layer, sinks)
    if P_FP8 in steps:
        probs = _p_fp8(probs)
    elif P_CAST in steps:
        probs = _p_cast(probs, kv_dtype)
    elif P_HALF in steps:
        probs, total = _p_half(probs, model_dtype)
        lse = lse + torch.log(total)
    out = torch.einsum("bhgqk,bkhd->bqhgd", round_in(probs), vg)
    lse = lse.permute(0, 3, 1, 2).reshape(b * nq, hq)  # [b, h, g, q] -> [b * q, h * g]
    # padded queries (every key masked) dropped
    return out.reshape(b * nq, hq, v.shape[-1])[group.out_rows], lse[group.out_rows]


def golden(batch: Batch, layer_id: int = CASE_LAYER_ID,
           groups: Optional[List[_Group]] = None, steps: Tuple[str, ...] = ()) -> torch.Tensor:
    """[num_tokens, Hq, Dv] float64 attention of one layer, every request at once; with declared
    numerics' `steps` (kit.engine.numerics), in that precision."""
    return golden_lse(batch, layer_id, groups, steps)[0]


def golden_lse(batch: Batch, layer_id: int = CASE_LAYER_ID, groups: Optional[List[_Group]] = None,
               steps: Tuple[str, ...] = ()) -> Tuple[torch.Tensor, torch.Tensor]:
    """(golden(), [num_tokens, Hq] its float64 log-sum-exp), from one pass."""
    layer, kv_dtype = batch.layers[layer_id], batch.plan.case.kv_torch_dtype
    x = as_read(batch, layer_id, steps)
    q = x.q.to(torch.float64)
    q_stored = _queries(x.q, layer, kv_dtype, steps).to(torch.float64) if is_quantized(kv_dtype) else None
    if groups is None:
        groups = _groups(batch.plan, layer.tp_q_head_num, layer.sliding_window_size, q.device)
    k, v = torch.cat([x.k_old, x.k_new]).to(torch.float64), torch.cat([x.v_old, x.v_new]).to(torch.float64)
    attended = [_attend(g, q, k, v, layer, steps, q_stored, kv_dtype, batch.plan.case.torch_dtype) for g in groups]
    if not attended:
        return q.new_zeros(q.shape[:-1] + v.shape[-1:]), q.new_zeros(q.shape[:-1])
    return torch.cat([out for out, _ in attended]), torch.cat([lse for _, lse in attended])


def _request_hidden(requests: List[RequestPlan], groups: List[_Group]) -> List[torch.Tensor]:
    """Per request, [n_new, total]: what its queries may not see, from the groups' slices."""
    rows: List[List[torch.Tensor]] = [[] for _ in requests]
    for g in groups:
        for h, (j, q0, q1) in zip(g.hidden, g.slices):
            rows[j].append(h[:q1 - q0, :requests[j].total])
    return [torch.cat(r) for r in rows]


def attention(batch: Batch, dtype: torch.dtype = torch.float64, layer_id: int = CASE_LAYER_ID,
              groups: Optional[List[_Group]] = None) -> torch.Tensor:
    """[num_tokens, Hq, D] of one layer, in `dtype`. float64 is the golden (computed by
    golden()); the case dtype gives the same-dtype reference whose error scales the
    tolerance. That one is computed request by request, always with the same matrix shapes:
    a half-precision matmul's rounding depends on the kernel the shape selects (on CPUs
    with AMX measurably), and the tolerance must not move with it. `groups`: the layer's
    (golden's), whose masks say what each request's queries may not see."""
    if dtype == torch.float64:
        return golden(batch, layer_id, groups)
    layer = batch.layers[layer_id]
    q_all = batch.inputs[layer_id].q.to(dtype)
    if groups is None:
        groups = _groups(batch.plan, layer.tp_q_head_num, layer.sliding_window_size, q_all.device)
    hidden = _request_hidden(batch.plan.requests, groups)
    group = layer.tp_q_head_num // layer.tp_k_head_num
    sinks = _sinks(layer, (-1, 1, 1), q_all.device)
    outs, n = [], 0
    for req, (k, v), req_hidden in zip(batch.plan.requests, logical_kv(batch.plan, as_read(batch, layer_id)), hidden):
        q = q_all[n:n + req.n_new]
        n += req.n_new
        k = k.to(dtype).repeat_interleave(group, dim=1)
        v = v.to(dtype).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k)
        outs.append(torch.einsum("hqk,khd->qhd", _probs(scores, req_hidden, layer, sinks), v))
    return torch.cat(outs) if outs else q_all.new_zeros(q_all.shape[:-1] + (layer.v_head_dim,))


def _by_window(batch: Batch) -> Dict[int, List[_Group]]:
    """The requests' groups through each window of the model's layers (a hybrid model's differ)."""
    heads = max(x.tp_q_head_num for x in batch.layers)
    device = batch.inputs[CASE_LAYER_ID].q.device
    windows = {layer.sliding_window_size for layer in batch.layers}
    return {w: _groups(batch.plan, heads, w, device) for w in sorted(windows)}


def lse_key(layer_id: int) -> Tuple[str, int]:
    """Where references() and declared() keep a layer's log-sum-exp, beside its outputs by layer id."""
    return ("lse", layer_id)


def references(batch: Batch) -> Dict[object, Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Per layer id, the (float64 golden, same-dtype reference) of every layer of the model; per
    lse_key(layer id), (the golden's log-sum-exp, None), from the golden's pass."""
    by_window = _by_window(batch)
    found = {}
    for layer in batch.layers:
        groups = by_window[layer.sliding_window_size]
        out, lse = golden_lse(batch, layer.layer_id, groups)
        found[layer.layer_id] = (out, attention(batch, batch.plan.case.torch_dtype, layer.layer_id, groups))
        found[lse_key(layer.layer_id)] = (lse, None)
    return found


def declared(batch: Batch, steps: Tuple[str, ...]) -> Dict[object, Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Per layer id, the float64 references of declared numerics' `steps` (kit.engine.numerics): the
    emulation of their exact steps, which a run is judged against, and, where they hold envelope
    steps, the emulation of all of them, whose distance from the first widens the tolerance (None
    where they hold none); per lse_key(layer id), the same pair's log-sum-exps."""
    by_window = _by_window(batch)
    exact_steps = tuple(s for s in steps if s not in ENVELOPE_STEPS)
    found = {}
    for layer in batch.layers:
        groups = by_window[layer.sliding_window_size]
        emulated = golden_lse(batch, layer.layer_id, groups, exact_steps)
        envelope = golden_lse(batch, layer.layer_id, groups, steps) if exact_steps != steps else (None, None)
        found[layer.layer_id] = (emulated[0], envelope[0])
        found[lse_key(layer.layer_id)] = (emulated[1], envelope[1])
    return found
