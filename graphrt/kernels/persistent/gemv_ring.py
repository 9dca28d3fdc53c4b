"""The GEMV tile with its weight chunks in a shared-memory ring (the launch option `stages` > 0).

    acc = gemv_ring(x_ptr, x_off, XA, m_ok, inv, parts, NORM, ss_parts, NT, NTP, B, eps, g_ptr,
                    w_rows, n_ok, ctr_w, target, err_ptr, SPIN, ts, K, BM, BN, BK, FMA, DOT_F32,
                    PREC, STAGES, TIMELINE)      # after waiting for *ctr_w >= target

The product of gemv_tile.gemv ([BM, BN] float32 = norm(x) @ w.T; the same chunks and the same
float32 operations in the same order, so the same bits: tests/kernels/test_persistent_step.py),
with the unit's wait inside. gemv_tile keeps DEPTH = 3 chunks in flight in registers, rotated by
hand, and the register budget caps the depth (~24 KB in flight a program, where Little's law at
~1-1.5 us of DRAM latency under load asks 30-50 KB). Here the K loop is a plain
`tl.range(0, K, BK, num_stages=STAGES + 1)`: Triton's software pipeliner turns its weight load
into a ring of STAGES [BN, BK] buffers in shared memory filled by cp.async (16-byte copies,
evict_first), STAGES chunks in flight (8 KB each at the default tiles); a chunk costs a
cp.async.wait_group, two CTA barriers (the wait's and the one before its buffer is refilled) and
a read back from shared memory. The depth costs shared memory, not registers: at 1 row the sm_90
build takes ~197 registers at any depth (206 for the register form), and STAGES x the chunk of
shared memory (plus one chunk at 16 rows, tl.dot's activation operand). Explicit cp.async in
inline PTX was not needed; packing bf16 pairs into int32 words to carry more chunks in registers
would buy one or two chunks where the ring buys any depth.

The wait. The pipeliner issues the first STAGES chunks (its prologue) just before the loop, so a
wait before the loop would put the whole latency of the weight stream behind the dependency.
The wait runs inside the loop instead, in its first iteration (sync.wait_in_loop: a spin in
inline PTX, since a loop inside the loop would stop the pipeliner), followed in that branch by
everything that reads other programs' results: the RMSNorm factors and the first activation
chunk. Only the weights may be pipelined: the pipeliner takes loads whose values the iteration
itself consumes, so the activation (and RMSNorm weight) chunks are loaded one iteration ahead and
carried (as in gemv_tile) or inside the first iteration's branch, where it does not look; either
would otherwise be hoisted above the wait. tests/kernels/test_persistent_compile.py checks both on
the sm_90 build (STAGES copies before each GEMV loop, the spin before any load in it). The step
marks its unit loop `disable_licm` when STAGES > 0: LLVM otherwise hoists every ring's shared-
memory addresses out of the unit loop and keeps them live through the kernel (246 registers at
16 rows instead of 186).

NORM: x is RMSNormed as it is used (g_ptr the norm weight) with the factors read after the wait
from ss_parts [NT, BM] (gemv_tile.inv_from_parts over K = the hidden size, B live rows) where
`parts` (a bool, may be a runtime value), else inv [BM] (the embedding rows' row pass, which
needs no wait: one ring loop serves the QKV units of layer 0 and of the later layers). DOT_F32
(the interpreter): tl.dot in float32 and the wait is sync.wait_for; num_stages means nothing
there, so the CPU tests check the arithmetic and the sm_90 build the ring.
"""
from __future__ import annotations

import triton
import triton.language as tl

from graphrt.kernels.persistent.gemv_tile import (aligned_mult, bcast_row, dequant, dequant_f32, inv_from_parts,
                                                   normed, row_of, rows_chunk, scale_part, weight_chunk)
from graphrt.kernels.persistent.sync import wait_in_loop


@triton.jit
def _inv(inv, parts, NORM: tl.constexpr, ss_parts, NT: tl.constexpr, NTP: tl.constexpr, BM: tl.constexpr,
         B: tl.constexpr, K: tl.constexpr, eps):
    """[BM] float32 RMSNorm factors: from the tiles' sums of squares where `parts`, else inv."""
    iv = tl.zeros((BM,), tl.float32) + inv
    if NORM:
        iv = tl.where(parts, inv_from_parts(ss_parts, NT, NTP, BM, B, K, eps), iv)
    return iv


@triton.jit
def gemv_ring(x_ptr, x_off, XA: tl.constexpr, m_ok, inv, parts, NORM: tl.constexpr, ss_parts, NT: tl.constexpr,
              NTP: tl.constexpr, B: tl.constexpr, eps, g_ptr, w_rows, n_ok, ctr_w, target, err_ptr, SPIN, ts,
              K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FMA: tl.constexpr,
              DOT_F32: tl.constexpr, PREC: tl.constexpr, STAGES: tl.constexpr, TIMELINE: tl.constexpr,
              s_rows, z_rows, FMT: tl.constexpr, GS: tl.constexpr, HZ: tl.constexpr):
    """[BM, BN] float32 = norm(x) @ w.T after waiting for *ctr_w >= target (see the module docstring;
    s_rows .. HZ: the weights' format, gemv_tile.py: the same chunks, dequantization and scales)."""
    NS: tl.constexpr = STAGES + 1
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    dt = x_ptr.dtype.element_ty
    gt = g_ptr.dtype.element_ty
    iv = tl.zeros((BM,), tl.float32)                                    # set after the wait
    if FMA > 0:
        p0 = x_ptr + aligned_mult(row_of(x_off, rm, 0), XA)
        p1 = x_ptr + aligned_mult(row_of(x_off, rm, 1), XA)
        p2 = x_ptr + aligned_mult(row_of(x_off, rm, 2), XA)
        p3 = x_ptr + aligned_mult(row_of(x_off, rm, 3), XA)
        inv0 = tl.full((), 0.0, tl.float32)
        inv1 = inv0
        inv2 = inv0
        inv3 = inv0
        acc0 = tl.zeros((BN, BK), tl.float32)
        acc1 = tl.zeros((BN, BK), tl.float32)
        acc2 = tl.zeros((BN, BK), tl.float32)
        acc3 = tl.zeros((BN, BK), tl.float32)
        x0 = tl.zeros((BN, BK), dt)
        x1 = x0
        x2 = x0
        x3 = x0
        g = tl.zeros((BN, BK), gt)
        for k0 in tl.range(0, K, BK, num_stages=NS, loop_unroll_factor=1):
            w = weight_chunk(w_rows, n_ok, k0, K, BK, s_rows, z_rows, FMT, GS, HZ)    # the ring
            if k0 == 0:                                                   # the wait, then what it guards
                wait_in_loop(ctr_w, target, err_ptr, SPIN, ts, TIMELINE, DOT_F32)
                iv = _inv(inv, parts, NORM, ss_parts, NT, NTP, BM, B, K, eps)
                inv0 = row_of(iv, rm, 0)
                inv1 = row_of(iv, rm, 1)
                inv2 = row_of(iv, rm, 2)
                inv3 = row_of(iv, rm, 3)
                x0 = bcast_row(p0, rn, 0, K, BK)
                if FMA > 1:
                    x1 = bcast_row(p1, rn, 0, K, BK)
                if FMA > 2:
                    x2 = bcast_row(p2, rn, 0, K, BK)
                if FMA > 3:
                    x3 = bcast_row(p3, rn, 0, K, BK)
                if NORM:
                    g = bcast_row(g_ptr, rn, 0, K, BK)
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
            wf = dequant_f32(w, FMT, dt, DOT_F32)
            acc0 += wf * normed(x0, inv0, g, NORM)
            if FMA > 1:
                acc1 += wf * normed(x1, inv1, g, NORM)
            if FMA > 2:
                acc2 += wf * normed(x2, inv2, g, NORM)
            if FMA > 3:
                acc3 += wf * normed(x3, inv3, g, NORM)
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
        x = tl.zeros((BM, BK), dt)
        g = tl.zeros((BK,), gt)
        for k0 in tl.range(0, K, BK, num_stages=NS, loop_unroll_factor=1):
            w = weight_chunk(w_rows, n_ok, k0, K, BK, s_rows, z_rows, FMT, GS, HZ)    # the ring
            if k0 == 0:                                                   # the wait, then what it guards
                wait_in_loop(ctr_w, target, err_ptr, SPIN, ts, TIMELINE, DOT_F32)
                iv = _inv(inv, parts, NORM, ss_parts, NT, NTP, BM, B, K, eps)
                x = rows_chunk(rows, m_ok, 0, K, BK)
                if NORM:
                    g = tl.load(g_ptr + rk, mask=rk < K, other=0.0)
            y = rows_chunk(rows, m_ok, k0 + BK, K, BK)                          # the next activations
            h = g
            if NORM:
                h = tl.load(g_ptr + k0 + BK + rk, mask=k0 + BK + rk < K, other=0.0)
                xn = (x.to(tl.float32) * iv[:, None] * g.to(tl.float32)[None, :]).to(x.dtype)
            else:
                xn = x
            wq = dequant(w, xn, FMT, DOT_F32)
            if DOT_F32:  # the CPU interpreter's tl.dot multiplies bf16's raw storage (Triton 3.9)
                acc += scale_part(tl.dot(xn.to(tl.float32), tl.trans(wq.to(tl.float32)), input_precision="ieee"),
                                  w, FMT)
            else:
                acc += scale_part(tl.dot(xn, tl.trans(wq), input_precision=PREC, out_dtype=tl.float32), w, FMT)
            x = y
            g = h
        return acc


__all__ = ["gemv_ring"]
