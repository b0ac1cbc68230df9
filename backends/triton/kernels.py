"""Our Triton attention kernels: split-KV decode, extend (prefix from the paged pool,
new tokens passed directly; causal or custom mask), and the kv_indices builder.

Attention sinks (HAS_SINK: one logit per query head in every softmax denominator, carrying
no value) join once per query: at the end of the extend kernel's online softmax, and in the
decode's combine of its KV splits, never in a split (each split would count it again).

Every length a kernel needs is read from a device buffer (kv_indptr, qo_indptr,
num_kv_splits, block tables), so a launch captured in a CUDA graph stays right
when the metadata hooks refill those buffers for another batch. Grids depend
only on host ints the hooks are given (bs, token count), never on a device read.
"""
from kit.harness import interpreter

interpreter.choose()  # before Triton's first import: it defines its own helpers then

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def build_kv_indices_kernel(req_to_token, req_pool_indices, kv_lens, kv_indptr, kv_indices, stride_row,
                            lanes, lane_width, lane_keys, BLOCK: tl.constexpr):
    """Row z's keys at kv_indices[kv_indptr[z]:]: request b = z // lanes's first kv_lens[b] columns of
    req_to_token[req_pool_indices[b]], then `lane_keys` columns of its lane z % lanes, which starts
    at column kv_lens[b] + (z % lanes) * lane_width (a draft decode's lanes; otherwise one lane
    with no keys of its own)."""
    z = tl.program_id(0)
    b = z // lanes
    skip = (z % lanes) * lane_width
    row = tl.load(req_pool_indices + b).to(tl.int64)
    n = tl.load(kv_lens + b)
    dst = tl.load(kv_indptr + z)
    for start in range(0, n + lane_keys, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < n + lane_keys
        cols = tl.where(offs < n, offs, offs + skip)
        slots = tl.load(req_to_token + row * stride_row + cols, mask=live)
        tl.store(kv_indices + dst + offs, slots, mask=live)


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    # UPCAST: the interpreter's bf16 tl.dot is wrong, so interpret in fp32.
    # IEEE: fp32 inputs must not be rounded to tf32 on the GPU.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _capped(s, logit_cap, HAS_CAP: tl.constexpr):
    if HAS_CAP:
        # cap * tanh(s / cap), with tanh(x) = 2 * sigmoid(2x) - 1 (no tanh in every Triton)
        s = logit_cap * (2.0 / (1.0 + tl.exp(-2.0 * s / logit_cap)) - 1.0)
    return s


@triton.jit
def _online_step(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap,
                 HAS_CAP: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """One key block of online softmax: scores, mask, running max / sum / output."""
    s = _capped(_dot(q, tl.trans(k), UPCAST, IEEE) * sm_scale, logit_cap, HAS_CAP)
    return _softmax_update(s, v, visible, m_i, l_i, acc, UPCAST, IEEE)


@triton.jit
def _softmax_update(s, v, visible, m_i, l_i, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """A key block's scores `s` (masked by `visible`) into the running max / sum / output (V rows `v`)."""
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST, IEEE)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def dequant(x, scale, like, FP8_KV: tl.constexpr):
    """Values read from a quantized (fp8) cache: stored * scale, in `like`'s dtype (exact: the
    scales are powers of two); an unquantized cache's as loaded."""
    if FP8_KV:
        return (x.to(tl.float32) * scale).to(like.dtype)
    else:
        return x


@triton.jit
def _load_paged_kv(K, V, kv_indices, kv_start, n, live_n, kvh, d, stride_ks, stride_kh, stride_vs, stride_vh,
                   k_scale, v_scale, q, FP8_KV: tl.constexpr):
    """K and V [BLOCK_N, D] of key positions `n` of a request, through its kv_indices, as q's dtype."""
    slots = tl.load(kv_indices + kv_start + n, mask=live_n, other=0).to(tl.int64)
    k = tl.load(K + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=live_n[:, None], other=0.0)
    v = tl.load(V + slots[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=live_n[:, None], other=0.0)
    return dequant(k, k_scale, q, FP8_KV), dequant(v, v_scale, q, FP8_KV)


@triton.jit
def split_range(kv_indptr, b, split, splits):
    """Request b's keys [kv_start, kv_start + kv_len) and split `split`'s part [lo, hi) of them."""
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    chunk = tl.cdiv(kv_len, splits)
    lo = split * chunk
    return kv_start, kv_len, lo, tl.minimum(lo + chunk, kv_len)


@triton.jit
def decode_split_kernel(Q, K, V, kv_indptr, kv_indices, num_kv_splits, Mid_O, Mid_LSE,
                        sm_scale, logit_cap, window, k_scale, v_scale,
                        stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
                        stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                        GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                        HAS_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                        FP8_KV: tl.constexpr):
    """Stage 1: request b, KV head kvh (all GROUP query heads of it at once), KV split s."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    splits = tl.load(num_kv_splits + b)
    if split < splits:
        kv_start, kv_len, lo, hi = split_range(kv_indptr, b, split, splits)
        if HAS_WINDOW:  # the query sits at kv_len - 1 and sees window + 1 keys
            lo = tl.maximum(lo, kv_len - 1 - window)
        hs = tl.arange(0, BLOCK_H)
        heads = kvh * GROUP + hs
        live_h = hs < GROUP
        d = tl.arange(0, D)
        q = tl.load(Q + b * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=live_h[:, None], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live_n = n < hi
            k, v = _load_paged_kv(K, V, kv_indices, kv_start, n, live_n, kvh, d, stride_ks, stride_kh, stride_vs,
                                  stride_vh, k_scale, v_scale, q, FP8_KV)
            m_i, l_i, acc = _online_step(q, k, v, live_h[:, None] & live_n[None, :], m_i, l_i, acc,
                                         sm_scale, logit_cap, HAS_CAP, UPCAST, IEEE)
        seen = l_i > 0  # a split wholly outside the window contributes nothing
        lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
        o = acc / tl.where(seen, l_i, 1.0)[:, None]
        tl.store(Mid_O + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :], o,
                 mask=live_h[:, None])
        tl.store(Mid_LSE + b * stride_lb + heads * stride_lh + split, lse, mask=live_h)


@triton.jit
def decode_reduce_kernel(Mid_O, Mid_LSE, num_kv_splits, Out, Lse, Sinks,
                         stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outt, stride_outh,
                         stride_et, stride_eh,
                         MAX_SPLITS: tl.constexpr, D: tl.constexpr, HAS_SINK: tl.constexpr):
    """Stage 2: merge the splits of (request b, head h) by their log-sum-exp, and the head's sink
    logit once into the denominator; the merged log-sum-exp (natural log, the sink in) to Lse."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    splits = tl.load(num_kv_splits + b)
    s = tl.arange(0, MAX_SPLITS)
    live = s < splits
    d = tl.arange(0, D)
    lse = tl.load(Mid_LSE + b * stride_lb + h * stride_lh + s, mask=live, other=float("-inf"))
    o = tl.load(Mid_O + b * stride_ob + h * stride_oh + s[:, None] * stride_os + d[None, :],
                mask=live[:, None], other=0.0)
    m = tl.max(lse, 0)
    if HAS_SINK:
        sink = tl.load(Sinks + h)
        m = tl.maximum(m, sink)
    w = tl.exp(lse - m)
    denominator = tl.sum(w, 0)
    if HAS_SINK:
        denominator += tl.exp(sink - m)
    out = tl.sum(w[:, None] * o, 0) / denominator
    tl.store(Out + b * stride_outt + h * stride_outh + d, out.to(Out.dtype.element_ty))
    tl.store(Lse + b * stride_et + h * stride_eh, m + tl.log(denominator))


@triton.jit
def extend_kernel(Q, K_new, V_new, K, V, Out, Lse, positions,
                  qo_indptr, kv_indptr, kv_indices, mask, mask_indptr, block_req, block_start, Sinks,
                  sm_scale, logit_cap, window, k_scale, v_scale, out_cache_loc,
                  stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh,
                  stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_et, stride_eh,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  CUSTOM_MASK: tl.constexpr, HAS_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  HAS_SINK: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, FP8_KV: tl.constexpr):
    """Query block t (BLOCK_M new tokens of one request) x query head h.

    Keys: the request's prefix from the pool (through kv_indices), then its new
    tokens from K_new/V_new; with a quantized (FP8_KV) cache, the new tokens' from
    the pool too (through out_cache_loc, written before the launch), so that every
    key is attended as the cache holds it. Visibility: causal among the new tokens, or the
    custom mask ([q_len, prefix + q_len] row-major per request); window on positions. Each row's
    log-sum-exp (natural log, the sink in) to Lse.
    """
    t = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    req = tl.load(block_req + t)
    if req >= 0:
        m0 = tl.load(block_start + t)
        q_start = tl.load(qo_indptr + req)
        q_len = tl.load(qo_indptr + req + 1) - q_start
        kv_start = tl.load(kv_indptr + req)
        prefix = tl.load(kv_indptr + req + 1) - kv_start
        offs_m = m0 + tl.arange(0, BLOCK_M)
        live_m = offs_m < q_len
        tok_m = (q_start + offs_m).to(tl.int64)
        d = tl.arange(0, D)
        q = tl.load(Q + tok_m[:, None] * stride_qt + h * stride_qh + d[None, :], mask=live_m[:, None], other=0.0)
        q_pos = tl.load(positions + tok_m, mask=live_m, other=0)
        mask_row = tl.load(mask_indptr + req) + offs_m.to(tl.int64) * (prefix + q_len)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)

        lo = 0
        if HAS_WINDOW:  # skip prefix blocks wholly left of every query's window
            lo = tl.maximum(tl.min(tl.where(live_m, q_pos, 1 << 30), 0) - window, 0)
            lo = tl.minimum(lo - lo % BLOCK_N, prefix)
        for start in range(lo, prefix, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live_n = n < prefix
            k, v = _load_paged_kv(K, V, kv_indices, kv_start, n, live_n, kvh, d, stride_ks, stride_kh, stride_vs,
                                  stride_vh, k_scale, v_scale, q, FP8_KV)
            visible = live_m[:, None] & live_n[None, :]
            if CUSTOM_MASK:
                allowed = tl.load(mask + mask_row[:, None] + n[None, :], mask=visible, other=0)
                visible = visible & (allowed != 0)
            if HAS_WINDOW:
                visible = visible & (n[None, :] >= q_pos[:, None] - window)
            m_i, l_i, acc = _online_step(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap,
                                         HAS_CAP, UPCAST, IEEE)

        hi = q_len
        if not CUSTOM_MASK:  # causal: no new key after this block's last query
            hi = tl.minimum(q_len, m0 + BLOCK_M)
        for start in range(0, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live_n = n < q_len
            tok_n = (q_start + n).to(tl.int64)
            if FP8_KV:
                k, v = _load_paged_kv(K, V, out_cache_loc, q_start, n, live_n, kvh, d, stride_ks, stride_kh,
                                      stride_vs, stride_vh, k_scale, v_scale, q, FP8_KV)
            else:
                k = tl.load(K_new + tok_n[:, None] * stride_knt + kvh * stride_knh + d[None, :],
                            mask=live_n[:, None], other=0.0)
                v = tl.load(V_new + tok_n[:, None] * stride_vnt + kvh * stride_vnh + d[None, :],
                            mask=live_n[:, None], other=0.0)
            visible = live_m[:, None] & live_n[None, :]
            if CUSTOM_MASK:
                allowed = tl.load(mask + mask_row[:, None] + prefix + n[None, :], mask=visible, other=0)
                visible = visible & (allowed != 0)
            else:
                visible = visible & (n[None, :] <= offs_m[:, None])
            if HAS_WINDOW:
                k_pos = tl.load(positions + tok_n, mask=live_n, other=0)
                visible = visible & (k_pos[None, :] >= q_pos[:, None] - window)
            m_i, l_i, acc = _online_step(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap,
                                         HAS_CAP, UPCAST, IEEE)

        if HAS_SINK:  # one more term of the denominator, with no value
            sink = tl.load(Sinks + h)
            m_fin = tl.maximum(m_i, sink)
            alpha = tl.exp(m_i - m_fin)
            l_i = l_i * alpha + tl.exp(sink - m_fin)
            acc = acc * alpha[:, None]
            m_i = m_fin
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + tok_m[:, None] * stride_ot + h * stride_oh + d[None, :], o.to(Out.dtype.element_ty),
                 mask=live_m[:, None])
        tl.store(Lse + tok_m * stride_et + h * stride_eh, m_i + tl.log(l_i), mask=live_m)


# Without CUDA the definitions above loaded Triton's interpreter: its redundant set-up is removed
# before a first launch (kit.harness.interpreter; the runner does it again for each run, a no-op).
interpreter.install()
