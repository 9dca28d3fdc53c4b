"""The GEMV tile of the persistent step: [BM, BN] = x[BM, K] @ w[BN, K]^T in float32.

    wa = weight_chunk(w_rows, n_ok, 0, K, BK)          # the first DEPTH = 3 chunks: issued
    wb = weight_chunk(w_rows, n_ok, BK, K, BK)         # before the unit waits for x, so its
    wc = weight_chunk(w_rows, n_ok, 2 * BK, K, BK)     # weight stream starts at once
    ... wait ...
    acc = gemv(x_ptr, x_off, XA, m_ok, inv, g_ptr, w_rows, n_ok, wa, wb, wc, K, BM, BN, BK, NORM, FMA, ...)

w_rows: [BN, 1] pointers to BN weight rows (row-major, K contiguous); the activation rows start
at x_ptr + x_off (x_off [BM] int64 element offsets, each a multiple of XA, a power of 2 the
vectorised loads may assume; rows m_ok live). The K loop keeps DEPTH weight chunks in
flight ahead of the one it multiplies (loaded into registers, three iterations early) and the
activation chunk one iteration early, so neither the HBM nor the L2 latency sits between two
chunks. Chunks: [BN, BK] with BN * BK the same element count for every tile (one register budget).

FMA = n (1..4 live rows): multiply-add into a [BN, BK] float32 accumulator per row, reduced over
K once at the end (no shuffle or barrier inside the loop); the activation chunk is loaded in the
weight chunk's own layout (a [BN, BK] broadcast: each warp reads the same L1 lines, no layout
conversion). FMA = 0: one tl.dot per chunk over 16 rows (the tensor cores' smallest tile).
NORM: x is the residual stream, normalised as it is used: round(x * inv * g) in x's dtype
(inv [BM] the rows' rsqrt(mean(x^2) + eps), g the RMSNorm weight), as `rms_norm` writes it.

Activations written by other programs of the same launch are read with plain (L1) loads: every
consumer reaches them through an acquire (sync.wait_for), which invalidates the SM's L1 (PTX
memory model; sm_70+ emits CCTL.IVALL), so no line cached before the producer's release is hit.

Weight formats (FMT, a constexpr; formats.py names them): one loop body, the format replaces
what a chunk is (`weight_chunk`), how it becomes the product's operand (`dequant` for tl.dot,
`dequant_f32` for the multiply-add) and what scales the dot's partial (`scale_part`):
- 0, model dtype (bf16 / fp16 / float32): a [BN, BK] chunk, converted as it is used.
- 1, FP8 e4m3 with one float32 scale per output row (per-channel, or per-tensor stored per
  channel): the chunk is [BN, BK] e4m3, converted exactly to the activations' dtype (bf16 /
  fp16 / float32 hold every e4m3 value) in registers; the unit multiplies the finished
  [BM, BN] float32 tile by the rows' scales (`row_scales` / `scale_tile`, loaded with the first
  chunks, before the wait). Activations stay in the model dtype (W8A16), see step.py.
The format travels as explicit arguments (s_rows, z_rows: [BN] pointers to each weight row's
first scale / zero; FMT, GS (int4's group size), HZ (int4 zeros) constexprs), the model-dtype
build compiling to the code it had before the formats existed.
- 2, int4 (graphrt's layout, model/quant/int4.py): the chunk is (words [BN, BK / 8] int32,
  scale [BN] float32, zero [BN] int32) of one group (BK divides the group size: the step caps
  the chunk width); `int4_tile` (kernels/gemv_int4.py) unpacks q - zero, exact small integers in
  the activations' dtype (packed-register PTX on CUDA for bf16 / fp16, shifts elsewhere); the
  dot's partial is multiplied by the group scale (per row), the multiply-add's chunk by it
  before the accumulation ((q - zero) * scale in float32: the reference's dequantized value).

Also `first_max_rows`: torch.argmax's rule (first NaN, else the maximum, lowest id among ties;
kernels/argmax.py's `first_max`) along axis 1 of a [R, C] tile, one answer per row.
"""
from __future__ import annotations

import triton
import triton.language as tl

from graphrt.kernels.gemv_int4 import int4_tile


@triton.jit
def weight_chunk(w_rows, n_ok, k0, K: tl.constexpr, BK: tl.constexpr, s_rows, z_rows, FMT: tl.constexpr,
                 GS: tl.constexpr, HZ: tl.constexpr):
    """Weight columns k0 .. k0 + BK of the tile's rows (0 past K or past the last row): a [BN, BK]
    tensor (model dtype, FP8), or for int4 (words [BN, BK / 8] int32, the chunk's group scale
    [BN] float32, its zero [BN] int32). w_rows: [BN, 1] pointers to each row's first element
    (int4: first word); s_rows / z_rows: [BN] pointers to each row's first scale / zero (int4;
    unused otherwise); FMT, GS, HZ: the format, int4's group size and whether it has zeros."""
    if FMT == 2:
        kw = k0 // 8 + tl.arange(0, BK // 8)
        words = tl.load(w_rows + kw[None, :], mask=n_ok[:, None] & (kw < K // 8)[None, :], other=0,
                        eviction_policy="evict_first")
        g_ok = n_ok & (k0 < K)
        s = tl.load(s_rows + k0 // GS, mask=g_ok, other=0.0).to(tl.float32)
        if HZ:
            z = tl.load(z_rows + k0 // GS, mask=g_ok, other=0).to(tl.int32)
        else:
            z = tl.full(s.shape, 8, tl.int32)
        return words, s, z
    else:
        kk = k0 + tl.arange(0, BK)
        return tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0,
                       eviction_policy="evict_first")


@triton.jit
def _int4_codes(w, DT: tl.constexpr, ASM: tl.constexpr):
    """An int4 chunk's q - zero: [BN, BK] in DT (exact small integers)."""
    words, s, z = w
    BN: tl.constexpr = words.shape[0]
    BK: tl.constexpr = words.shape[1] * 8
    return tl.reshape(int4_tile(tl.expand_dims(words, 0), tl.expand_dims(tl.expand_dims(z, 0), 2), DT, ASM),
                      (BN, BK))


@triton.jit
def dequant(w, x, FMT: tl.constexpr, DOT_F32: tl.constexpr):
    """A loaded weight chunk as the dot's input (x's dtype): a conversion for model-dtype and FP8
    weights (exact for FP8), q - zero for int4 (its scale goes on the partial: `scale_part`)."""
    if FMT == 2:
        ASM: tl.constexpr = (not DOT_F32) and (x.dtype == tl.bfloat16 or x.dtype == tl.float16)
        return _int4_codes(w, x.dtype, ASM)
    else:
        return w.to(x.dtype)


@triton.jit
def dequant_f32(w, FMT: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr):
    """A loaded weight chunk as float32 [BN, BK] for the multiply-add: the value itself (model
    dtype; FP8 before its row scale), (q - zero) * scale for int4. DT: the activations' dtype
    (int4's packed unpacking on CUDA)."""
    if FMT == 2:
        ASM: tl.constexpr = (not DOT_F32) and (DT == tl.bfloat16 or DT == tl.float16)
        words, s, z = w
        return _int4_codes(w, DT, ASM).to(tl.float32) * s[:, None]
    else:
        return w.to(tl.float32)


@triton.jit
def scale_part(part, w, FMT: tl.constexpr):
    """A chunk's [BM, BN] float32 dot product with its scale applied: int4's group scale per
    weight row; the product itself otherwise."""
    if FMT == 2:
        words, s, z = w
        return part * s[None, :]
    else:
        return part


@triton.jit
def row_scales(s_rows, n_ok, FMT: tl.constexpr):
    """FP8: the tile rows' float32 scales [BN] (s_rows [BN] pointers; 0 past the last row); else
    1.0 (unused)."""
    if FMT == 1:
        return tl.load(s_rows, mask=n_ok, other=0.0)
    else:
        return 1.0


@triton.jit
def scale_tile(acc, cs, FMT: tl.constexpr):
    """The finished [BM, BN] float32 tile times FP8's row scales cs [BN] (other formats: acc)."""
    if FMT == 1:
        return acc * cs[None, :]
    else:
        return acc


@triton.jit
def bcast_row(ptr, rn, k0, K: tl.constexpr, BK: tl.constexpr):
    """Columns k0 .. k0 + BK of one row at ptr, broadcast over BN rows: [BN, BK]."""
    kk = k0 + tl.arange(0, BK)
    return tl.load(ptr + rn[:, None] * 0 + kk[None, :], mask=(rn >= 0)[:, None] & (kk < K)[None, :], other=0.0)


@triton.jit
def rows_chunk(rows, m_ok, k0, K: tl.constexpr, BK: tl.constexpr):
    """Columns k0 .. k0 + BK of the BM rows whose [BM, 1] pointers are `rows`: [BM, BK]."""
    kk = k0 + tl.arange(0, BK)
    return tl.load(rows + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)


@triton.jit
def normed(x, inv, g, NORM: tl.constexpr):
    """float32 x, or round(x * inv * g) in x's dtype as float32 (NORM)."""
    if NORM:
        return (x.to(tl.float32) * inv * g.to(tl.float32)).to(x.dtype).to(tl.float32)
    return x.to(tl.float32)


@triton.jit
def row_of(v, rm, m):
    """Element m of a [BM] vector (a scalar)."""
    return tl.sum(tl.where(rm == m, v, 0), axis=0)


@triton.jit
def aligned_mult(o, XA: tl.constexpr):
    """o, declared a multiple of XA (vectorised loads; o // XA * XA: the compiler's alignment
    analysis keeps it, where tl.multiple_of on a reduced scalar is lost)."""
    if XA > 1:
        o = (o // XA) * XA
    return o


@triton.jit
def gemv(x_ptr, x_off, XA: tl.constexpr, m_ok, inv, g_ptr, w_rows, n_ok, wa, wb, wc, K: tl.constexpr,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, FMA: tl.constexpr,
         DOT_F32: tl.constexpr, PREC: tl.constexpr, s_rows, z_rows, FMT: tl.constexpr, GS: tl.constexpr,
         HZ: tl.constexpr):
    """[BM, BN] float32 = norm(x) @ w.T (see the module docstring); wa, wb, wc: chunks 0, 1, 2
    (`weight_chunk`, with s_rows .. HZ: the weights' format; FP8: before the row scales,
    `scale_tile`)."""
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    if FMA > 0:
        p0 = x_ptr + aligned_mult(row_of(x_off, rm, 0), XA)
        p1 = x_ptr + aligned_mult(row_of(x_off, rm, 1), XA)
        p2 = x_ptr + aligned_mult(row_of(x_off, rm, 2), XA)
        p3 = x_ptr + aligned_mult(row_of(x_off, rm, 3), XA)
        inv0 = row_of(inv, rm, 0)
        inv1 = row_of(inv, rm, 1)
        inv2 = row_of(inv, rm, 2)
        inv3 = row_of(inv, rm, 3)
        acc0 = tl.zeros((BN, BK), tl.float32)
        acc1 = tl.zeros((BN, BK), tl.float32)
        acc2 = tl.zeros((BN, BK), tl.float32)
        acc3 = tl.zeros((BN, BK), tl.float32)
        x0 = bcast_row(p0, rn, 0, K, BK)
        x1 = x0
        x2 = x0
        x3 = x0
        if FMA > 1:
            x1 = bcast_row(p1, rn, 0, K, BK)
        if FMA > 2:
            x2 = bcast_row(p2, rn, 0, K, BK)
        if FMA > 3:
            x3 = bcast_row(p3, rn, 0, K, BK)
        g = x0
        if NORM:
            g = bcast_row(g_ptr, rn, 0, K, BK)
        for k0 in tl.range(0, K, BK, loop_unroll_factor=1):
            wd = weight_chunk(w_rows, n_ok, k0 + 3 * BK, K, BK, s_rows, z_rows, FMT, GS, HZ)   # DEPTH ahead
            y0 = bcast_row(p0, rn, k0 + BK, K, BK)                         # the next activations
            y1 = y0
            y2 = y0
            y3 = y0
            if FMA > 1:
                y1 = bcast_row(p1, rn, k0 + BK, K, BK)
            if FMA > 2:
                y2 = bcast_row(p2, rn, k0 + BK, K, BK)
            if FMA > 3:
                y3 = bcast_row(p3, rn, k0 + BK, K, BK)
            h = g
            if NORM:
                h = bcast_row(g_ptr, rn, k0 + BK, K, BK)
            wf = dequant_f32(wa, FMT, x0.dtype, DOT_F32)
            acc0 += wf * normed(x0, inv0, g, NORM)
            if FMA > 1:
                acc1 += wf * normed(x1, inv1, g, NORM)
            if FMA > 2:
                acc2 += wf * normed(x2, inv2, g, NORM)
            if FMA > 3:
                acc3 += wf * normed(x3, inv3, g, NORM)
            wa = wb
            wb = wc
            wc = wd
            x0 = y0
            x1 = y1
            x2 = y2
            x3 = y3
            g = h
        acc = tl.where(rm[:, None] == 0, tl.sum(acc0, axis=1)[None, :], 0.0)
        if FMA > 1:
            acc += tl.where(rm[:, None] == 1, tl.sum(acc1, axis=1)[None, :], 0.0)
        if FMA > 2:
            acc += tl.where(rm[:, None] == 2, tl.sum(acc2, axis=1)[None, :], 0.0)
        if FMA > 3:
            acc += tl.where(rm[:, None] == 3, tl.sum(acc3, axis=1)[None, :], 0.0)
        return acc
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        rk = tl.arange(0, BK)
        rows = x_ptr + aligned_mult(x_off, XA)[:, None]
        x = rows_chunk(rows, m_ok, 0, K, BK)
        g = rk
        if NORM:
            g = tl.load(g_ptr + rk, mask=rk < K, other=0.0)
        for k0 in tl.range(0, K, BK, loop_unroll_factor=1):
            wd = weight_chunk(w_rows, n_ok, k0 + 3 * BK, K, BK, s_rows, z_rows, FMT, GS, HZ)   # DEPTH ahead
            y = rows_chunk(rows, m_ok, k0 + BK, K, BK)                          # the next activations
            h = g
            if NORM:
                h = tl.load(g_ptr + k0 + BK + rk, mask=k0 + BK + rk < K, other=0.0)
                xn = (x.to(tl.float32) * inv[:, None] * g.to(tl.float32)[None, :]).to(x.dtype)
            else:
                xn = x
            wq = dequant(wa, xn, FMT, DOT_F32)
            if DOT_F32:  # the CPU interpreter's tl.dot multiplies bf16's raw storage (Triton 3.9)
                acc += scale_part(tl.dot(xn.to(tl.float32), tl.trans(wq.to(tl.float32)), input_precision="ieee"),
                                  wa, FMT)
            else:
                acc += scale_part(tl.dot(xn, tl.trans(wq), input_precision=PREC, out_dtype=tl.float32), wa, FMT)
            wa = wb
            wb = wc
            wc = wd
            x = y
            g = h
        return acc


@triton.jit
def row_ss(x_rows, m_ok, K: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """[BM] float32 sum of squares of the rows (a full pass over K)."""
    rk = tl.arange(0, BK)
    ss = tl.zeros((BM,), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, loop_unroll_factor=1):
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & ((k0 + rk) < K)[None, :],
                    other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return ss


@triton.jit
def inv_from_parts(ss_ptr, NT: tl.constexpr, NTP: tl.constexpr, BM: tl.constexpr, B: tl.constexpr,
                   H: tl.constexpr, eps):
    """Rows' rsqrt(mean(x^2) + eps) from NT tiles' partial sums of squares ss[t, m] ([NT, BM];
    the B live rows read)."""
    t = tl.arange(0, NTP)
    m = tl.arange(0, BM)
    parts = tl.load(ss_ptr + t[:, None] * BM + m[None, :], mask=(t < NT)[:, None] & (m < B)[None, :], other=0.0)
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


@triton.jit
def better(v, i, bv, bi):
    """Whether the candidates (v, i) beat (bv, bi) elementwise under torch.argmax's rule, in any
    order: a NaN over a number, then the larger value, then (equal, or both NaN) the lower id."""
    vn = v != v
    bn = bv != bv
    same = (vn & bn) | (~vn & ~bn & (v == bv))
    return (vn & ~bn) | (~vn & ~bn & (v > bv)) | (same & (i < bi))


__all__ = ["aligned_mult", "bcast_row", "better", "dequant", "dequant_f32", "first_max_rows", "gemv",
           "inv_from_parts", "normed", "row_of", "row_scales", "row_ss", "rows_chunk", "scale_part", "scale_tile",
           "weight_chunk"]
