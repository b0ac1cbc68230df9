"""Launches of our Triton MLA kernels (mla_kernels.py) on the backend's metadata: the same
buffers, grids and two-phase hooks as the dense kernels (backend.py), over the pool's
latent rows."""
from __future__ import annotations

from typing import Optional

from backends.triton.metadata import BLOCK_M, MAX_KV_SPLITS, Metadata, cdiv

DECODE_BLOCK_H = 16  # query heads per decode program (tl.dot needs 16 rows); 128 heads: 8 programs
DECODE_BLOCK_N = 32
EXTEND_BLOCK_M = 16  # query rows per extend program: an R-wide fp32 accumulator each (R = 512: 32 KiB)
# The interpreter pays per program, not per row: one program per block of the metadata's table.
INTERPRETED_BLOCK_M = BLOCK_M
EXTEND_BLOCK_N = 32
LAUNCH = dict(num_warps=4, num_stages=2)
MIN_DOT = 16  # tl.dot's smallest inner dimension


def unsupported(case) -> Optional[str]:
    """Why our MLA kernels do not run the case, or None."""
    for what, width in (("kv_lora_rank", case.kv_lora_rank), ("rope_dim", case.rope_dim)):
        if width < MIN_DOT or width & (width - 1):
            return f"MLA {what} {width} is not a power of two >= {MIN_DOT} (tl.arange and tl.dot need one)"
    return None


def head_blocks(num_heads: int) -> int:
    """Decode programs per request and KV split."""
    return cdiv(num_heads, DECODE_BLOCK_H)


def decode(md: Metadata, q, kv, out, lse, layer, flags: dict) -> None:
    """Split-KV decode over every key of each request, then the splits merged by log-sum-exp."""
    from backends.triton import kernels, mla_kernels  # here: a kernel's definition chooses Triton's interpreter
    b = md.bufs
    mla_kernels.mla_decode_split_kernel[(md.rows, head_blocks(layer.tp_q_head_num), md.max_splits)](
        q, kv, b.kv_indptr, b.kv_indices, b.num_kv_splits, b.mid_o, b.mid_lse, layer.scaling, _kv_scale(layer),
        q.stride(0), q.stride(1), kv.stride(0),
        b.mid_o.stride(0), b.mid_o.stride(1), b.mid_o.stride(2), b.mid_lse.stride(0), b.mid_lse.stride(1),
        NUM_HEADS=layer.tp_q_head_num, BLOCK_H=DECODE_BLOCK_H, BLOCK_N=DECODE_BLOCK_N,
        R=layer.kv_lora_rank, P=layer.rope_dim, FP8_KV=layer.k_scale is not None, **LAUNCH, **flags)
    kernels.decode_reduce_kernel[(md.rows, layer.tp_q_head_num)](
        b.mid_o, b.mid_lse, b.num_kv_splits, out, lse, b.mid_lse,  # MLA has no sinks: a pointer never read
        b.mid_o.stride(0), b.mid_o.stride(1), b.mid_o.stride(2), b.mid_lse.stride(0), b.mid_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1), MAX_SPLITS=MAX_KV_SPLITS, D=layer.kv_lora_rank,
        HAS_SINK=False)


def extend(md: Metadata, q, k, kv, out, lse, out_cache_loc, layer, flags: dict) -> None:
    """The prefix from the pool and the new tokens' latent rows from k (a quantized latent: from the
    pool, at out_cache_loc), causal or custom mask."""
    from backends.triton import mla_kernels
    b = md.bufs
    custom = md.mask is not None
    block_m = INTERPRETED_BLOCK_M if q.device.type == "cpu" else EXTEND_BLOCK_M
    mla_kernels.mla_extend_kernel[(md.num_blocks, layer.tp_q_head_num, BLOCK_M // block_m)](
        q, k, kv, out, lse, b.qo_indptr, b.kv_indptr, b.kv_indices, md.mask if custom else b.mask, b.mask_indptr,
        b.block_req, b.block_start, layer.scaling, _kv_scale(layer), out_cache_loc,
        q.stride(0), q.stride(1), k.stride(0), kv.stride(0), out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        BLOCK_M=block_m, BLOCK_N=EXTEND_BLOCK_N, R=layer.kv_lora_rank, P=layer.rope_dim,
        CUSTOM_MASK=custom, FP8_KV=layer.k_scale is not None, **LAUNCH, **flags)


def _kv_scale(layer) -> float:
    """The scale a quantized latent's values are multiplied by (its one, k_scale); 1 unquantized."""
    return 1.0 if layer.k_scale is None else layer.k_scale
