"""The GEMV tile of the persistent step: [BM, BN] = x[BM, K] @ w[BN, K]^T in float32.

    w = first_chunk(w_rows, n_ok, K, BK)          # issued before the unit waits for x
    ... wait ...
    acc = gemv_acc(x_rows, m_ok, inv, g_ptr, w_rows, n_ok, w, K, BK, NORM, DOT_F32, PREC)

w_rows: [BN, 1] pointers to BN weight rows (row-major, K contiguous); x_rows: [BM, 1]
pointers to the activation rows (rows m_ok live). FMA = 0: one tl.dot per chunk (BM = 16 rows,
the tensor cores' smallest tile); FMA = n (1..4): rows 0 .. n - 1 by multiply-add and a
reduction over K, the form for 1-4 live rows. The K loop keeps one weight chunk in flight
ahead of the one it multiplies (register double buffering); the first chunk is loaded by the
caller before it waits, so a unit's weight stream starts before its inputs are ready.
NORM: x is the residual stream, normalised as it is loaded: round(x * inv * g) in x's dtype
(inv [BM] the rows' rsqrt(mean(x^2) + eps), g the RMSNorm weight), as `rms_norm` writes it.

Weight formats: `dequant` turns a loaded chunk into the dot's input dtype. Model-dtype weights
(bf16 / fp16 / float32) are the format implemented; an FP8 (per-channel scale: the scale
multiplies the finished tile) or int4 (packed nibbles + group scales) variant replaces
`first_chunk` / `dequant` and the byte count of the schedule's prefetch, not the loop.

Also `first_max_rows`: torch.argmax's rule (first NaN, else the maximum, lowest id among ties;
kernels/argmax.py's `first_max`) along axis 1 of a [R, C] tile, one answer per row.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def first_chunk(w_rows, n_ok, K: tl.constexpr, BK: tl.constexpr):
    rk = tl.arange(0, BK)
    return tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & (rk < K)[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def dequant(w, x):
    """A loaded weight chunk as the dot's input (x's dtype): a no-op for model-dtype weights."""
    return w.to(x.dtype)


@triton.jit
def gemv_acc(x_rows, m_ok, inv, g_ptr, w_rows, n_ok, w_first, K: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, DOT_F32: tl.constexpr,
             PREC: tl.constexpr, FMA: tl.constexpr):
    rk = tl.arange(0, BK)
    rm = tl.arange(0, BM)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    w = w_first
    for k0 in tl.range(0, K, BK, loop_unroll_factor=1):
        kn = k0 + BK + rk                                            # the next chunk, in flight
        w_next = tl.load(w_rows + kn[None, :], mask=n_ok[:, None] & (kn < K)[None, :], other=0.0,
                         eviction_policy="evict_first")
        k_ok = (k0 + rk) < K
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0,
                    cache_modifier=".cg")
        if NORM:
            g = tl.load(g_ptr + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) * inv[:, None] * g[None, :]).to(x.dtype)
        wq = dequant(w, x)
        if FMA > 0:    # rows 0 .. FMA - 1 by multiply-add and a reduction over K (no tensor core:
            wf = wq.to(tl.float32)                  # at 1-4 rows tl.dot's 16-row tile is idle work)
            xf = x.to(tl.float32)
            for m in tl.static_range(FMA):
                xm = tl.sum(tl.where(rm[:, None] == m, xf, 0.0), axis=0)              # [BK] row m
                part = tl.sum(wf * xm[None, :], axis=1)                               # [BN]
                acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
        elif DOT_F32:  # the CPU interpreter's tl.dot multiplies bf16's raw storage (Triton 3.9)
            acc += tl.dot(x.to(tl.float32), tl.trans(wq.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(wq), input_precision=PREC, out_dtype=tl.float32)
        w = w_next
    return acc


@triton.jit
def row_ss(x_rows, m_ok, K: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """[BM] float32 sum of squares of the rows (a full pass over K)."""
    rk = tl.arange(0, BK)
    ss = tl.zeros((BM,), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, loop_unroll_factor=1):
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & ((k0 + rk) < K)[None, :], other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return ss


@triton.jit
def inv_from_parts(ss_ptr, NT: tl.constexpr, NTP: tl.constexpr, BM: tl.constexpr, H: tl.constexpr, eps):
    """Rows' rsqrt(mean(x^2) + eps) from NT tiles' partial sums of squares ss[t, m] ([NT, BM])."""
    t = tl.arange(0, NTP)
    m = tl.arange(0, BM)
    parts = tl.load(ss_ptr + t[:, None] * BM + m[None, :], mask=(t < NT)[:, None], other=0.0,
                    cache_modifier=".cg")
    return tl.rsqrt(tl.sum(parts, axis=0) / H + eps)


@triton.jit
def first_max_rows(v, ids, valid):
    """Per row of float32 v [R, C] with int32 ids [R, C] (valid lanes): (max, NaN if any NaN;
    lowest id holding it, the lowest NaN id if any) -> ([R] float32, [R] int32); no valid lane:
    (-inf, 2^31 - 1)."""
    nan = valid & (v != v)
    any_nan = tl.max(nan.to(tl.int32), axis=1) > 0
    w = tl.where(valid & (v == v), v, float("-inf"))
    m = tl.max(w, axis=1)
    hit = tl.where(any_nan[:, None], nan, valid & (w == m[:, None]))
    tok = tl.min(tl.where(hit, ids, 2147483647), axis=1)
    return tl.where(any_nan, float("nan"), m), tok


__all__ = ["first_chunk", "dequant", "gemv_acc", "row_ss", "inv_from_parts", "first_max_rows"]
