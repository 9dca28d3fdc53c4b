"""The unit bodies of the persistent decode step (one @triton.jit function per kind of unit).

Every body: its weight loads first, then the wait for its inputs (sync.wait_for), the work, the
stores, then its signal (STAGES > 0, the GEMV units: the weights stream through a shared-memory
ring instead of registers, and the wait moves into the GEMV loop after the ring's first STAGES
chunks are issued: gemv_ring.py). Activations written by other programs are read after an
acquire (plain loads: the acquire invalidated the SM's L1; the rare reductions over other
programs' partials read with ".cg", from L2).
Scratch (kernels/persistent/step.py allocates it; model dtype unless said):
    res [B, H]       the residual stream          qkv [B, (Hq + 2 Hkv) D]   qkv GEMM output
    att [B, Hq D]    attention output             mlp [B, I]                silu(gate) * up
    ss_o, ss_d [T, 16] float32: each O / DOWN tile's per-row sum of squares of its new columns
    part [B Hkv S G, D], lse [B Hkv S G] float32: attention split partials
    amax [NHS, 16] float32, aidx [NHS, 16] int32: each LM-head program's per-row argmax
The GEMV units take their weights' format (s_w / z_w: the weight's row-0 scale / zero pointers,
FMT, GS, HZ; gemv_tile.py: model dtype, FP8 with row scales, int4 with group scales and
zeros); FP8's row scales are loaded with the first chunks and multiply the finished tile.
Rounding follows the kernel sequence: each GEMM output, q, the new k, the attention output,
silu(gate) * up and the residual are rounded to the model dtype where the sequence stores them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from graphrt.kernels.persistent.gemv_ring import gemv_ring
from graphrt.kernels.persistent.gemv_tile import (better, first_max_rows, gemv, inv_from_parts, row_scales, row_ss,
                                                   scale_tile, weight_chunk)
from graphrt.kernels.persistent.sync import arrive, signal, wait_for


@triton.jit
def _chunks(w_rows, n_ok, K: tl.constexpr, BK: tl.constexpr, s_rows, z_rows, FMT: tl.constexpr, GS: tl.constexpr,
            HZ: tl.constexpr):
    """The GEMV's first three weight chunks (issued before the unit waits)."""
    return (weight_chunk(w_rows, n_ok, 0, K, BK, s_rows, z_rows, FMT, GS, HZ),
            weight_chunk(w_rows, n_ok, BK, K, BK, s_rows, z_rows, FMT, GS, HZ),
            weight_chunk(w_rows, n_ok, 2 * BK, K, BK, s_rows, z_rows, FMT, GS, HZ))


@triton.jit
def _rows(w_tile, K: tl.constexpr, BN: tl.constexpr, FMT: tl.constexpr):
    """[BN, 1] pointers to the first element (int4: word) of BN consecutive weight rows from w_tile."""
    if FMT == 2:
        return w_tile + tl.arange(0, BN)[:, None] * (K // 8)
    else:
        return w_tile + tl.arange(0, BN)[:, None] * K


@triton.jit
def residual_unit(n0, tile, x_ptr, x_off, XA: tl.constexpr, m_ok, w_tile, K: tl.constexpr, src_rows, res_ptr,
                  ss_out, ctr_w, target, ctr_s, count, err_ptr, ts, H: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr, SPIN,
                  FMA: tl.constexpr, STAGES: tl.constexpr, TIMELINE: tl.constexpr, s_w, z_w, FMT: tl.constexpr,
                  GS: tl.constexpr, HZ: tl.constexpr):
    """O / DOWN: res[:, n0:n0+BN] = round(src[:, n0:n0+BN] + round(x @ w[n0:n0+BN].T)) (w_tile:
    row n0 of w; x rows at x_ptr + x_off; s_w / z_w: w's row-0 scale / zero, FMT .. HZ its
    format, gemv_tile.py); the tile's
    per-row sum of squares of the new values into ss_out[tile]."""
    rn = n0 + tl.arange(0, BN)
    n_ok = rn < H
    w_rows = _rows(w_tile, K, BN, FMT)
    G: tl.constexpr = (K + GS - 1) // GS if FMT == 2 else 1    # scales a row
    s_rows = s_w + rn * G
    z_rows = z_w + rn * G
    cs = row_scales(s_rows, n_ok, FMT)
    if STAGES == 0:
        wa, wb, wc = _chunks(w_rows, n_ok, K, BK, s_rows, z_rows, FMT, GS, HZ)
        wait_for(ctr_w, target, err_ptr, SPIN, ts, TIMELINE)
        acc = gemv(x_ptr, x_off, XA, m_ok, 1.0, x_ptr, w_rows, n_ok, wa, wb, wc, K, BM, BN, BK, False, FMA,
                   DOT_F32, PREC, s_rows, z_rows, FMT, GS, HZ)
    else:
        acc = gemv_ring(x_ptr, x_off, XA, m_ok, 1.0, False, False, ss_out, 1, 1, 1, 0.0, x_ptr, w_rows, n_ok, ctr_w,
                        target, err_ptr, SPIN, ts, K, BM, BN, BK, FMA, DOT_F32, PREC, STAGES, TIMELINE, s_rows,
                        z_rows, FMT, GS, HZ)
    acc = scale_tile(acc, cs, FMT)
    dt = res_ptr.dtype.element_ty
    mask = m_ok[:, None] & n_ok[None, :]
    old = tl.load(src_rows + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    new = (acc.to(dt).to(tl.float32) + old).to(dt)
    rm = tl.arange(0, BM)
    tl.store(res_ptr + rm[:, None] * H + rn[None, :], new, mask=mask)
    nf = tl.where(mask, new.to(tl.float32), 0.0)
    tl.store(ss_out + tile * BM + rm, tl.sum(nf * nf, axis=1))
    signal(ctr_s, count)


@triton.jit
def qkv_unit(layer, n0, res_ptr, emb_ptr, emb_off, XA: tl.constexpr, m_ok, w_tile, bias_ptr, g_ptr, ss_parts,
             qkv_out, ctr_w, target, ctr_s, count, err_ptr, ts, eps, B: tl.constexpr, H: tl.constexpr,
             QKVW: tl.constexpr, NT: tl.constexpr, NTP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr, SPIN,
             FMA: tl.constexpr, STAGES: tl.constexpr, TIMELINE: tl.constexpr, s_w, z_w, FMT: tl.constexpr,
                  GS: tl.constexpr, HZ: tl.constexpr):
    """qkv[:, n0:n0+BN] = round(rmsnorm(x) @ w[n0:n0+BN].T (+ bias)); layer 0's x is the
    embedding rows (emb_ptr + emb_off, sums of squares by a full pass), later layers' the
    residual stream (sums of squares from the DOWN tiles' partials). s_w .. HZ: w's format."""
    rn = n0 + tl.arange(0, BN)
    n_ok = rn < QKVW
    w_rows = _rows(w_tile, H, BN, FMT)
    G: tl.constexpr = (H + GS - 1) // GS if FMT == 2 else 1    # scales a row
    s_rows = s_w + rn * G
    z_rows = z_w + rn * G
    cs = row_scales(s_rows, n_ok, FMT)
    rm = tl.arange(0, BM)
    if STAGES == 0:
        wa, wb, wc = _chunks(w_rows, n_ok, H, BK, s_rows, z_rows, FMT, GS, HZ)
        wait_for(ctr_w, target, err_ptr, SPIN, ts, TIMELINE)
        if layer == 0:
            inv = tl.rsqrt(row_ss(emb_ptr + emb_off[:, None], m_ok, H, BM, BK) / H + eps)
            acc = gemv(emb_ptr, emb_off, XA, m_ok, inv, g_ptr, w_rows, n_ok, wa, wb, wc, H, BM, BN, BK, True, FMA,
                       DOT_F32, PREC, s_rows, z_rows, FMT, GS, HZ)
        else:
            inv = inv_from_parts(ss_parts, NT, NTP, BM, B, H, eps)
            acc = gemv(res_ptr, rm.to(tl.int64) * H, XA, m_ok, inv, g_ptr, w_rows, n_ok, wa, wb, wc, H, BM, BN, BK,
                       True, FMA, DOT_F32, PREC, s_rows, z_rows, FMT, GS, HZ)
    else:                                              # one ring loop for both sources of x
        x_base = res_ptr
        x_off = rm.to(tl.int64) * H
        inv = tl.full((BM,), 1.0, tl.float32)
        if layer == 0:                                 # the embedding rows: their norm needs no wait
            x_base = emb_ptr
            x_off = emb_off
            inv = tl.rsqrt(row_ss(emb_ptr + emb_off[:, None], m_ok, H, BM, BK) / H + eps)
        acc = gemv_ring(x_base, x_off, XA, m_ok, inv, layer != 0, True, ss_parts, NT, NTP, B, eps, g_ptr, w_rows,
                        n_ok, ctr_w, target, err_ptr, SPIN, ts, H, BM, BN, BK, FMA, DOT_F32, PREC, STAGES, TIMELINE,
                        s_rows, z_rows, FMT, GS, HZ)
    acc = scale_tile(acc, cs, FMT)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(qkv_out + rm[:, None] * QKVW + rn[None, :], acc.to(qkv_out.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])
    signal(ctr_s, count)


@triton.jit
def gate_up_unit(n0, res_ptr, XA: tl.constexpr, m_ok, w_ptr, g_off, u_off, g_ptr, ss_parts, mlp_out, ctr_w, target,
                 ctr_s, count, err_ptr, ts, eps, B: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
                 NT: tl.constexpr, NTP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 DOT_F32: tl.constexpr, PREC: tl.constexpr, SPIN, FMA: tl.constexpr, STAGES: tl.constexpr,
                 TIMELINE: tl.constexpr, s_w, z_w, FMT: tl.constexpr, GS: tl.constexpr, HZ: tl.constexpr):
    """mlp[:, n0:n0+BN] = round(silu(round(gate)) * round(up)) of the normed residual stream
    (w_ptr + g_off / u_off: gate_up rows n0 and I + n0, element offsets (int4: words); s_w ..
    HZ: gate_up's format), one GEMV over 2 BN rows: gate row n0 + i at 2 i, up row n0 + i at 2 i + 1."""
    r = tl.arange(0, 2 * BN)
    rn = n0 + r // 2
    n_ok = rn < I
    # (arithmetic, not a select: the alignment analysis keeps a multiple of 8 through it)
    if FMT == 2:
        w_rows = w_ptr + (g_off + (r % 2) * (u_off - g_off) + (r // 2) * (H // 8))[:, None]
    else:
        w_rows = w_ptr + (g_off + (r % 2) * (u_off - g_off) + (r // 2) * H)[:, None]
    G: tl.constexpr = (H + GS - 1) // GS if FMT == 2 else 1    # scales a row
    s_rows = s_w + (rn + (r % 2) * I) * G
    z_rows = z_w + (rn + (r % 2) * I) * G
    cs = row_scales(s_rows, n_ok, FMT)
    rm = tl.arange(0, BM)
    if STAGES == 0:
        wa, wb, wc = _chunks(w_rows, n_ok, H, BK, s_rows, z_rows, FMT, GS, HZ)
        wait_for(ctr_w, target, err_ptr, SPIN, ts, TIMELINE)
        inv = inv_from_parts(ss_parts, NT, NTP, BM, B, H, eps)
        acc = gemv(res_ptr, rm.to(tl.int64) * H, XA, m_ok, inv, g_ptr, w_rows, n_ok, wa, wb, wc, H, BM, 2 * BN, BK,
                   True, FMA, DOT_F32, PREC, s_rows, z_rows, FMT, GS, HZ)
    else:
        acc = gemv_ring(res_ptr, rm.to(tl.int64) * H, XA, m_ok, 1.0, True, True, ss_parts, NT, NTP, B, eps, g_ptr,
                        w_rows, n_ok, ctr_w, target, err_ptr, SPIN, ts, H, BM, 2 * BN, BK, FMA, DOT_F32, PREC, STAGES,
                        TIMELINE, s_rows, z_rows, FMT, GS, HZ)
    acc = scale_tile(acc, cs, FMT)
    dt = mlp_out.dtype.element_ty
    gate, up = tl.split(tl.reshape(acc, (BM, BN, 2)))
    gate = gate.to(dt).to(tl.float32)
    up = up.to(dt).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    cols = n0 + tl.arange(0, BN)
    tl.store(mlp_out + rm[:, None] * I + cols[None, :], y.to(dt), mask=m_ok[:, None] & (cols < I)[None, :])
    signal(ctr_s, count)


@triton.jit
def head_unit(n0, res_ptr, XA: tl.constexpr, m_ok, w_tile, g_ptr, ss_parts, logits_ptr, amax_ptr, aidx_ptr,
              out_ptr, best_v, best_i, slot, ctr_w, target, ctr_arr, count, err_ptr, ts, eps, B: tl.constexpr,
              H: tl.constexpr, V: tl.constexpr, NT: tl.constexpr, NTP: tl.constexpr, NH: tl.constexpr,
              NHS, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RT: tl.constexpr,
              DOT_F32: tl.constexpr, PREC: tl.constexpr, SPIN, FMA: tl.constexpr, STAGES: tl.constexpr,
              TIMELINE: tl.constexpr, s_w, z_w, FMT: tl.constexpr, GS: tl.constexpr, HZ: tl.constexpr):
    """Logits of vocabulary rows [n0, n0 + BN) of the final-normed stream (model dtype; s_w ..
    HZ: the head's format); returns
    the program's running per-row argmax (best_v, best_i [BM]) with this tile's folded in.
    count > 0 (the program's last tile): the program's answer into amax / aidx[slot], its count
    tiles arrive, and the arrival that completes the NH reduces the NHS programs' answers into
    out[b] = argmax of row b (torch.argmax's rule: order-independent, `better`)."""
    rn = n0 + tl.arange(0, BN)
    n_ok = rn < V
    w_rows = _rows(w_tile, H, BN, FMT)
    G: tl.constexpr = (H + GS - 1) // GS if FMT == 2 else 1    # scales a row
    s_rows = s_w + rn * G
    z_rows = z_w + rn * G
    cs = row_scales(s_rows, n_ok, FMT)
    rm = tl.arange(0, BM)
    if STAGES == 0:
        wa, wb, wc = _chunks(w_rows, n_ok, H, BK, s_rows, z_rows, FMT, GS, HZ)
        wait_for(ctr_w, target, err_ptr, SPIN, ts, TIMELINE)
        inv = inv_from_parts(ss_parts, NT, NTP, BM, B, H, eps)
        acc = gemv(res_ptr, rm.to(tl.int64) * H, XA, m_ok, inv, g_ptr, w_rows, n_ok, wa, wb, wc, H, BM, BN, BK, True,
                   FMA, DOT_F32, PREC, s_rows, z_rows, FMT, GS, HZ)
    else:
        acc = gemv_ring(res_ptr, rm.to(tl.int64) * H, XA, m_ok, 1.0, True, True, ss_parts, NT, NTP, B, eps, g_ptr,
                        w_rows, n_ok, ctr_w, target, err_ptr, SPIN, ts, H, BM, BN, BK, FMA, DOT_F32, PREC, STAGES,
                        TIMELINE, s_rows, z_rows, FMT, GS, HZ)
    acc = scale_tile(acc, cs, FMT)
    logit = acc.to(logits_ptr.dtype.element_ty)
    valid = m_ok[:, None] & n_ok[None, :]
    tl.store(logits_ptr + rm[:, None] * V + rn[None, :], logit, mask=valid)
    ids = rn[None, :] + rm[:, None] * 0
    v, i = first_max_rows(logit.to(tl.float32), ids, valid)
    take = better(v, i, best_v, best_i)
    best_v = tl.where(take, v, best_v)
    best_i = tl.where(take, i, best_i)
    if count > 0:
        tl.store(amax_ptr + slot * BM + rm, best_v)
        tl.store(aidx_ptr + slot * BM + rm, best_i)
        if arrive(ctr_arr, count) + count == NH:         # the last arrival: reduce the programs' answers
            fv = tl.full((BM,), float("-inf"), tl.float32)
            fi = tl.full((BM,), 2147483647, tl.int32)
            for t0 in range(0, NHS, RT):
                t = t0 + tl.arange(0, RT)
                ok = m_ok[:, None] & (t < NHS)[None, :]
                cv = tl.load(amax_ptr + t[None, :] * BM + rm[:, None], mask=ok, other=float("-inf"),
                             cache_modifier=".cg")
                ci = tl.load(aidx_ptr + t[None, :] * BM + rm[:, None], mask=ok, other=2147483647,
                             cache_modifier=".cg")
                cv, ci = first_max_rows(cv, ci, ok)          # this chunk's answer per row
                take = better(cv, ci, fv, fi)
                fv = tl.where(take, cv, fv)
                fi = tl.where(take, ci, fi)
            tl.store(out_ptr + rm, fi.to(tl.int64), mask=rm < B)
    return best_v, best_i


@triton.jit
def _kv_block(k_ptr, v_ptr, bt_row, start, hi, kvh, PAGE: tl.constexpr, S_PAGE: tl.constexpr,
              S_SLOT: tl.constexpr, S_HEAD: tl.constexpr, BKV: tl.constexpr, HALF: tl.constexpr):
    """Keys / values of cached positions start .. start + BKV (< hi) of one kv head: the two
    halves of k and v ([BKV, HALF] each, 0 past hi) and the live keys [BKV]."""
    kp = start + tl.arange(0, BKV)
    j = tl.arange(0, HALF)
    ok = kp < hi
    page = tl.load(bt_row + kp // PAGE, mask=ok, other=0)
    off = page.to(tl.int64) * S_PAGE + (kp % PAGE) * S_SLOT + kvh * S_HEAD
    k1 = tl.load(k_ptr + off[:, None] + j[None, :], mask=ok[:, None], other=0.0)
    k2 = tl.load(k_ptr + off[:, None] + HALF + j[None, :], mask=ok[:, None], other=0.0)
    v1 = tl.load(v_ptr + off[:, None] + j[None, :], mask=ok[:, None], other=0.0)
    v2 = tl.load(v_ptr + off[:, None] + HALF + j[None, :], mask=ok[:, None], other=0.0)
    return k1, k2, v1, v2, ok


@triton.jit
def attention_unit(b, kvh, sp, qkv_ptr, att_ptr, cs_ptr, qn_ptr, kn_ptr, k_ptr, v_ptr, bt_ptr, bt_stride,
                   lens_ptr, num_pages, part_ptr, lse_ptr, ctr_w, target, ctr_arr, ctr_s, err_ptr, ts, eps,
                   qk_scale, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                   S_PAGE: tl.constexpr, S_SLOT: tl.constexpr, S_HEAD: tl.constexpr, S: tl.constexpr,
                   MERGE_S: tl.constexpr, BMA: tl.constexpr, GP: tl.constexpr, BKV: tl.constexpr,
                   MIN_KEYS: tl.constexpr, QK_NORM: tl.constexpr, DOT_F32: tl.constexpr,
                   PREC: tl.constexpr, SPIN, TIMELINE: tl.constexpr):
    """Row b, kv head kvh, split sp of S: RoPE (and Qwen3's q / k norm) of the group's q heads
    and of the new k from the qkv scratch; the split's keys of the cache (positions < seq - 1),
    split 0 also the new key (and it writes the new k, v into the cache); the partial (S > 1)
    or the output (S == 1). The last split to arrive merges and signals. The cached keys are
    the previous steps' (no wait): the first block's loads go out before the unit waits, and
    each block's loads one block ahead of its arithmetic."""
    G: tl.constexpr = HQ // HKV
    HALF: tl.constexpr = D // 2
    QKVW: tl.constexpr = (HQ + 2 * HKV) * D
    seq = tl.load(lens_ptr + b)
    live = seq > 0
    pos = tl.maximum(seq - 1, 0)                        # the new token's position = keys cached
    n_blocks = tl.cdiv(pos, BKV)
    if S > 1:
        want = tl.minimum(tl.maximum(tl.cdiv(pos, MIN_KEYS), 1), S)
        per = tl.maximum(tl.cdiv(n_blocks, want), 1)
    else:
        per = n_blocks
    lo = sp * per * BKV
    hi = tl.minimum(lo + per * BKV, pos)
    bt_row = bt_ptr + b.to(tl.int64) * bt_stride
    page_new = tl.load(bt_row + pos // PAGE)                             # the new token's page
    kk1, kk2, vv1, vv2, key_ok = _kv_block(k_ptr, v_ptr, bt_row, lo, hi, kvh, PAGE, S_PAGE, S_SLOT, S_HEAD, BKV,
                                           HALF)
    wait_for(ctr_w, target, err_ptr, SPIN, ts, TIMELINE)
    m = tl.arange(0, BMA)
    g_ok = m < G
    j = tl.arange(0, HALF)
    row = qkv_ptr + b.to(tl.int64) * QKVW
    cs_row = cs_ptr + pos.to(tl.int64) * D
    c = tl.load(cs_row + j)
    s = tl.load(cs_row + HALF + j)
    hq = kvh * G + m
    qm = g_ok[:, None]
    x1 = tl.load(row + hq[:, None] * D + j[None, :], mask=qm, other=0.0, cache_modifier=".cg").to(tl.float32)
    x2 = tl.load(row + hq[:, None] * D + HALF + j[None, :], mask=qm, other=0.0,
                 cache_modifier=".cg").to(tl.float32)
    k1 = tl.load(row + (HQ + kvh) * D + j, cache_modifier=".cg").to(tl.float32)
    k2 = tl.load(row + (HQ + kvh) * D + HALF + j, cache_modifier=".cg").to(tl.float32)
    v1 = tl.load(row + (HQ + HKV + kvh) * D + j, cache_modifier=".cg")
    v2 = tl.load(row + (HQ + HKV + kvh) * D + HALF + j, cache_modifier=".cg")
    if QK_NORM:
        qi = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)[:, None]
        x1 = x1 * qi * tl.load(qn_ptr + j).to(tl.float32)[None, :]
        x2 = x2 * qi * tl.load(qn_ptr + HALF + j).to(tl.float32)[None, :]
        ki = tl.rsqrt((tl.sum(k1 * k1, axis=0) + tl.sum(k2 * k2, axis=0)) / D + eps)
        k1 = k1 * ki * tl.load(kn_ptr + j).to(tl.float32)
        k2 = k2 * ki * tl.load(kn_ptr + HALF + j).to(tl.float32)
    dt = att_ptr.dtype.element_ty
    q1 = (x1 * c[None, :] - x2 * s[None, :]).to(dt)
    q2 = (x2 * c[None, :] + x1 * s[None, :]).to(dt)
    nk1 = (k1 * c - k2 * s).to(dt)
    nk2 = (k2 * c + k1 * s).to(dt)
    has_new = (sp == 0) & live
    if has_new & (page_new >= 0) & (page_new < num_pages):   # the new k, v into the cache
        dst = page_new.to(tl.int64) * S_PAGE + (pos % PAGE) * S_SLOT + kvh * S_HEAD
        tl.store(k_ptr + dst + j, nk1.to(k_ptr.dtype.element_ty))
        tl.store(k_ptr + dst + HALF + j, nk2.to(k_ptr.dtype.element_ty))
        tl.store(v_ptr + dst + j, v1.to(v_ptr.dtype.element_ty))
        tl.store(v_ptr + dst + HALF + j, v2.to(v_ptr.dtype.element_ty))
    q1f = q1.to(tl.float32)
    q2f = q2.to(tl.float32)
    s_new = (tl.sum(q1f * nk1.to(tl.float32)[None, :], axis=1)
             + tl.sum(q2f * nk2.to(tl.float32)[None, :], axis=1)) * qk_scale
    newf = has_new.to(tl.float32)
    m_i = tl.where(has_new, s_new, -1.0e30)
    l_i = tl.zeros((BMA,), tl.float32) + newf
    acc1 = newf * tl.zeros((BMA, HALF), tl.float32) + newf * v1.to(tl.float32)[None, :]
    acc2 = newf * tl.zeros((BMA, HALF), tl.float32) + newf * v2.to(tl.float32)[None, :]
    for start in range(lo, hi, BKV):
        xk1, xk2, xv1, xv2, x_ok = _kv_block(k_ptr, v_ptr, bt_row, start + BKV, hi, kvh, PAGE, S_PAGE, S_SLOT,
                                             S_HEAD, BKV, HALF)                 # the next block, early
        if DOT_F32:
            sc = tl.dot(q1f, tl.trans(kk1.to(tl.float32)), input_precision="ieee") \
                + tl.dot(q2f, tl.trans(kk2.to(tl.float32)), input_precision="ieee")
        else:
            sc = tl.dot(q1, tl.trans(kk1.to(dt)), input_precision=PREC, out_dtype=tl.float32) \
                + tl.dot(q2, tl.trans(kk2.to(dt)), input_precision=PREC, out_dtype=tl.float32)
        sc = tl.where(key_ok[None, :], sc * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_F32:
            acc1 = acc1 * alpha[:, None] + tl.dot(p, vv1.to(tl.float32), input_precision="ieee")
            acc2 = acc2 * alpha[:, None] + tl.dot(p, vv2.to(tl.float32), input_precision="ieee")
        else:
            acc1 = acc1 * alpha[:, None] + tl.dot(p.to(dt), vv1.to(dt), input_precision=PREC, out_dtype=tl.float32)
            acc2 = acc2 * alpha[:, None] + tl.dot(p.to(dt), vv2.to(dt), input_precision=PREC, out_dtype=tl.float32)
        m_i = m_new
        kk1 = xk1
        kk2 = xk2
        vv1 = xv1
        vv2 = xv2
        key_ok = x_ok
    inv_l = 1.0 / tl.maximum(l_i, 1e-30)
    out_row = att_ptr + (b.to(tl.int64) * HQ + hq[:, None]) * D
    if S == 1:
        tl.store(out_row + j[None, :], (acc1 * inv_l[:, None]).to(dt), mask=qm)
        tl.store(out_row + HALF + j[None, :], (acc2 * inv_l[:, None]).to(dt), mask=qm)
        signal(ctr_s, 1)
    else:
        pair = b * HKV + kvh
        slot = ((pair * S + sp) * G + m).to(tl.int64)
        tl.store(part_ptr + slot[:, None] * D + j[None, :], acc1 * inv_l[:, None], mask=qm)
        tl.store(part_ptr + slot[:, None] * D + HALF + j[None, :], acc2 * inv_l[:, None], mask=qm)
        tl.store(lse_ptr + slot, m_i + tl.log2(tl.maximum(l_i, 1e-30)), mask=g_ok)
        if arrive(ctr_arr, 1) == S - 1:                 # the last split: merge the S partials
            tl.store(ctr_arr, 0)
            g = tl.arange(0, GP)
            mx = tl.full((GP,), -1.0e30, tl.float32)
            wsum = tl.zeros((GP,), tl.float32)
            o1 = tl.zeros((GP, HALF), tl.float32)
            o2 = tl.zeros((GP, HALF), tl.float32)
            for c0 in range(0, S, MERGE_S):
                si = c0 + tl.arange(0, MERGE_S)
                ok = (si[:, None] < S) & (g[None, :] < G)                       # [MERGE_S, GP]
                sl = ((pair * S + si[:, None]) * G + g[None, :]).to(tl.int64)
                lse = tl.load(lse_ptr + sl, mask=ok, other=float("-inf"), cache_modifier=".cg")
                p1 = tl.load(part_ptr + sl[:, :, None] * D + j[None, None, :], mask=ok[:, :, None],
                             other=0.0, cache_modifier=".cg")
                p2 = tl.load(part_ptr + sl[:, :, None] * D + HALF + j[None, None, :], mask=ok[:, :, None],
                             other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(mx, tl.max(lse, axis=0))
                alpha = tl.exp2(mx - m_new)
                w = tl.exp2(lse - m_new[None, :])
                o1 = o1 * alpha[:, None] + tl.sum(w[:, :, None] * p1, axis=0)
                o2 = o2 * alpha[:, None] + tl.sum(w[:, :, None] * p2, axis=0)
                wsum = wsum * alpha + tl.sum(w, axis=0)
                mx = m_new
            inv_w = 1.0 / tl.maximum(wsum, 1e-30)
            orow = att_ptr + (b.to(tl.int64) * HQ + kvh * G + g[:, None]) * D
            om = (g < G)[:, None]
            tl.store(orow + j[None, :], (o1 * inv_w[:, None]).to(dt), mask=om)
            tl.store(orow + HALF + j[None, :], (o2 * inv_w[:, None]).to(dt), mask=om)
            signal(ctr_s, 1)


__all__ = ["residual_unit", "qkv_unit", "gate_up_unit", "head_unit", "attention_unit"]
