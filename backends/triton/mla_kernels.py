"""Our Triton MLA kernels (absorbed multi-head latent attention): split-KV decode and
extend over the pool's latent rows.

A latent row is [R + P]: the compressed KV c (R = kv_lora_rank) then the rotary key part
(P = rope_dim). A query head is [R + P] too (q_nope . W_UK, then q_pe). The score is
scale * (q[:R] . c + q[R:] . k_pe), both parts accumulated in fp32; the output is the
softmax mix of c, R wide. The two parts are loaded and multiplied separately, so R and P
need only be powers of two (512 + 64), not their sum (576).

As the dense kernels, every length is read from the metadata buffers, so a launch captured
in a CUDA graph stays right when the hooks refill them. Decode merges its KV splits with
kernels.decode_reduce_kernel.
"""
import triton
import triton.language as tl

from backends.triton.kernels import _dot, _softmax_update, dequant, split_range


@triton.jit
def _latent_rows(KV, rows, live, stride_row, r, p, R: tl.constexpr, scale, like, FP8_KV: tl.constexpr):
    """c [N, R] and k_pe [N, P] of the latent rows `rows` (int64 offsets in rows), as `like`'s
    dtype (a quantized latent times its one scale)."""
    c = tl.load(KV + rows[:, None] * stride_row + r[None, :], mask=live[:, None], other=0.0)
    pe = tl.load(KV + rows[:, None] * stride_row + R + p[None, :], mask=live[:, None], other=0.0)
    return dequant(c, scale, like, FP8_KV), dequant(pe, scale, like, FP8_KV)


@triton.jit
def _latent_step(q_c, q_pe, c, pe, visible, m_i, l_i, acc, sm_scale, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """One key block of online softmax over latent rows: both score parts, then c as V."""
    s = (_dot(q_c, tl.trans(c), UPCAST, IEEE) + _dot(q_pe, tl.trans(pe), UPCAST, IEEE)) * sm_scale
    return _softmax_update(s, c, visible, m_i, l_i, acc, UPCAST, IEEE)


@triton.jit
def mla_decode_split_kernel(Q, KV, kv_indptr, kv_indices, num_kv_splits, Mid_O, Mid_LSE, sm_scale, kv_scale,
                            stride_qt, stride_qh, stride_kv,
                            stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                            NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                            R: tl.constexpr, P: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                            FP8_KV: tl.constexpr):
    """Stage 1: request b, BLOCK_H query heads (all read the one latent row), KV split s: the
    split's partial output (normalized) and its log-sum-exp."""
    b = tl.program_id(0)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    splits = tl.load(num_kv_splits + b)
    if split < splits:
        kv_start, kv_len, lo, hi = split_range(kv_indptr, b, split, splits)
        heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        live_h = heads < NUM_HEADS
        r = tl.arange(0, R)
        p = tl.arange(0, P)
        q_row = Q + b * stride_qt + heads[:, None] * stride_qh
        q_c = tl.load(q_row + r[None, :], mask=live_h[:, None], other=0.0)
        q_pe = tl.load(q_row + R + p[None, :], mask=live_h[:, None], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, R], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            live_n = n < hi
            slots = tl.load(kv_indices + kv_start + n, mask=live_n, other=0).to(tl.int64)
            c, pe = _latent_rows(KV, slots, live_n, stride_kv, r, p, R, kv_scale, q_c, FP8_KV)
            m_i, l_i, acc = _latent_step(q_c, q_pe, c, pe, live_h[:, None] & live_n[None, :], m_i, l_i, acc,
                                         sm_scale, UPCAST, IEEE)
        seen = l_i > 0  # an empty split (more splits than keys) contributes nothing
        lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
        o = acc / tl.where(seen, l_i, 1.0)[:, None]
        tl.store(Mid_O + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + r[None, :], o,
                 mask=live_h[:, None])
        tl.store(Mid_LSE + b * stride_lb + heads * stride_lh + split, lse, mask=live_h)


@triton.jit
def mla_extend_kernel(Q, KV_new, KV, Out, Lse, qo_indptr, kv_indptr, kv_indices, mask, mask_indptr, block_req,
                      block_start, sm_scale, kv_scale, out_cache_loc,
                      stride_qt, stride_qh, stride_knt, stride_kv, stride_ot, stride_oh, stride_et, stride_eh,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
                      CUSTOM_MASK: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, FP8_KV: tl.constexpr):
    """Query rows [block_start + sub * BLOCK_M, + BLOCK_M) of query block t x query head h (a
    block of the metadata's table is split in sub-blocks: an R-wide accumulator per row).

    Keys: the request's prefix, latent rows from the pool (through kv_indices), then its new
    tokens' rows from KV_new (a quantized latent: from the pool, through out_cache_loc, as the
    cache holds them). Visibility: causal among the new tokens, or the custom mask
    ([q_len, prefix + q_len] row-major per request). Each row's log-sum-exp (natural log) to Lse."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    sub = tl.program_id(2)
    req = tl.load(block_req + t)
    if req >= 0:
        m0 = tl.load(block_start + t) + sub * BLOCK_M
        q_start = tl.load(qo_indptr + req)
        q_len = tl.load(qo_indptr + req + 1) - q_start
        if m0 < q_len:
            kv_start = tl.load(kv_indptr + req)
            prefix = tl.load(kv_indptr + req + 1) - kv_start
            offs_m = m0 + tl.arange(0, BLOCK_M)
            live_m = offs_m < q_len
            tok_m = (q_start + offs_m).to(tl.int64)
            r = tl.arange(0, R)
            p = tl.arange(0, P)
            q_row = Q + tok_m[:, None] * stride_qt + h * stride_qh
            q_c = tl.load(q_row + r[None, :], mask=live_m[:, None], other=0.0)
            q_pe = tl.load(q_row + R + p[None, :], mask=live_m[:, None], other=0.0)
            mask_row = tl.load(mask_indptr + req) + offs_m.to(tl.int64) * (prefix + q_len)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, R], tl.float32)

            for start in range(0, prefix, BLOCK_N):
                n = start + tl.arange(0, BLOCK_N)
                live_n = n < prefix
                slots = tl.load(kv_indices + kv_start + n, mask=live_n, other=0).to(tl.int64)
                c, pe = _latent_rows(KV, slots, live_n, stride_kv, r, p, R, kv_scale, q_c, FP8_KV)
                visible = live_m[:, None] & live_n[None, :]
                if CUSTOM_MASK:
                    allowed = tl.load(mask + mask_row[:, None] + n[None, :], mask=visible, other=0)
                    visible = visible & (allowed != 0)
                m_i, l_i, acc = _latent_step(q_c, q_pe, c, pe, visible, m_i, l_i, acc, sm_scale, UPCAST, IEEE)

            hi = q_len
            if not CUSTOM_MASK:  # causal: no new key after this sub-block's last query
                hi = tl.minimum(q_len, m0 + BLOCK_M)
            for start in range(0, hi, BLOCK_N):
                n = start + tl.arange(0, BLOCK_N)
                live_n = n < q_len
                if FP8_KV:
                    slots = tl.load(out_cache_loc + q_start + n, mask=live_n, other=0).to(tl.int64)
                    c, pe = _latent_rows(KV, slots, live_n, stride_kv, r, p, R, kv_scale, q_c, FP8_KV)
                else:
                    c, pe = _latent_rows(KV_new, (q_start + n).to(tl.int64), live_n, stride_knt, r, p, R, kv_scale,
                                         q_c, FP8_KV)
                visible = live_m[:, None] & live_n[None, :]
                if CUSTOM_MASK:
                    allowed = tl.load(mask + mask_row[:, None] + prefix + n[None, :], mask=visible, other=0)
                    visible = visible & (allowed != 0)
                else:
                    visible = visible & (n[None, :] <= offs_m[:, None])
                m_i, l_i, acc = _latent_step(q_c, q_pe, c, pe, visible, m_i, l_i, acc, sm_scale, UPCAST, IEEE)

            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(Out + tok_m[:, None] * stride_ot + h * stride_oh + r[None, :], o.to(Out.dtype.element_ty),
                     mask=live_m[:, None])
            tl.store(Lse + tok_m * stride_et + h * stride_eh, m_i + tl.log(l_i), mask=live_m)
