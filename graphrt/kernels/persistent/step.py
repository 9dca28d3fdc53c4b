"""The persistent decode step: one launch runs a whole decoder step of one bucket (1-16 rows).

    step = PersistentStep(weights, kv_caches, cos_sin, geometry=g, rows=4, eps=1e-5)
    step.launch(tokens, seq_lens, block_table, out, device_error)   # out [B] int64 greedy tokens
    step.logits                                                      # [B, V] model dtype

weights: a graphrt ModelWeights (embed, final_norm, lm_head, layers with input_norm,
post_attn_norm, qkv, qkv_bias, q_norm, k_norm, o, gate_up, down; read by attribute), the
embedding, norms and biases contiguous in one model dtype (bfloat16, float16 or float32), the
linear weights (qkv, o, gate_up, down) in one format of formats.py: the model dtype, FP8 e4m3
with per-channel (or per-tensor) scales, or int4 (graphrt's layout, no act-order); the LM head
in the model dtype or that format (`unsupported` says what is refused). FP8 runs W8A16: the
activations stay in the model dtype, each e4m3 chunk converts exactly to it in registers and
the channel scale multiplies the finished float32 tile, so the step computes the dequantized
model (the kernel sequence's W8A8 GEMMs also round each activation row to e4m3: its logits
differ from these by that rounding). int4 unpacks q - zero in registers and scales each
group's partial (gemv_tile.py). kv_caches: one paged cache
per layer (.k, .v, .layout "NHD" / "HND") in the model dtype; cos_sin [max_positions, D]
float32 (graphrt.model.rope). Launch inputs (device): tokens [B] int64, seq_lens [B] int32
counting the new token (0: a padding row), block_table [>= B, W] int32, out [B] int64,
device_error [>= 1] int32 (sticky: ERR_STALL when a wait hit the watchdog).

The kernel (`_step_kernel`): grid = `programs` (the SM count on a GPU, launched cooperatively
so the driver refuses a grid that cannot be co-resident instead of letting it hang;
cooperative=False launches it plainly); program p
walks its units of the static schedule (schedule.py) in order, dispatching on the op
(units.py). Pointers to per-layer tensors are one model-dtype base pointer (and, for quantized
linears, a data, a scale and a zero base pointer) plus an int64 element offset per (layer,
field) read from a device table (tables.py); each unit row also
carries a later unit's weight tile, which a GPU program prefetches into L2 as the unit starts
(`prefetch` units ahead, cp.async.bulk.prefetch; prefetch=0: off). The GEMV units stream
their weight chunks through registers, three in flight (stages=0, gemv_tile.py), or through a
shared-memory ring of `stages` chunks (gemv_ring.py). A program reads the next unit's row
while it runs the current one. The last program to finish zeroes every counter for
the next launch: no host reset, capturable in a CUDA graph.

With programs=1 (the CPU interpreter) the one program runs every unit in schedule order and
no wait spins: tests compare it with a float32 reference and with the kernel sequence.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.persistent.formats import FMT_MODEL, WeightFormat, weight_format
from graphrt.kernels.persistent.schedule import MAX_ROWS, MAX_STAGES, Geometry, Schedule, Tiles, build_schedule
from graphrt.kernels.persistent.sync import SPIN_LIMIT, prefetch_l2, timer
from graphrt.kernels.persistent import tables
from graphrt.kernels.persistent.tables import NF, build_tables
from graphrt.kernels.persistent.units import attention_unit, gate_up_unit, head_unit, qkv_unit, residual_unit

FMA_MAX_ROWS = 4            # the multiply-add GEMV below this many rows (tl.dot's tile is 16)
# the shared-memory ring (stages > 0) at most: with one more chunk (the dot's activation operand)
# and the kernel's scratch it stays within the 227 KB an H100 / H200 SM gives one program
RING_BYTES = 160 << 10
# the offset table's scale and zero columns (tables.py)
W_SQKV, W_SO, W_SGU, W_SDOWN = (tl.constexpr(c) for c in (tables.W_SQKV, tables.W_SO, tables.W_SGU, tables.W_SDOWN))
W_ZQKV, W_ZO, W_ZGU, W_ZDOWN = (tl.constexpr(c) for c in (tables.W_ZQKV, tables.W_ZO, tables.W_ZGU, tables.W_ZDOWN))
PREFETCH_BYTES = 128 << 10  # L2 prefetch of a later unit's tile: at most this many bytes of it
TS = 4                      # timeline int64 per unit row: start, waited, end, program


@triton.jit
def _aligned(o, ALIGN: tl.constexpr):
    """An element offset known to be a multiple of ALIGN (16-byte aligned tensors and tiles:
    vectorised weight loads; o // ALIGN * ALIGN: the alignment analysis keeps it, where
    tl.multiple_of on a loaded or reduced scalar is lost)."""
    if ALIGN > 1:
        o = (o // ALIGN) * ALIGN
    return o


@triton.jit
def _woff(offs, k: tl.constexpr, ALIGN: tl.constexpr):
    """Element offset k of a layer's row of the offset table."""
    return _aligned(tl.load(offs + k), ALIGN)


@triton.jit
def _fields(units_ptr, u, ok):
    """Unit row u's fields (schedule.F_*; 0 when not ok) as scalars."""
    r = units_ptr + u * 16                                    # u: int64 (the starts table)
    return (tl.load(r + 0, mask=ok, other=0), tl.load(r + 1, mask=ok, other=0), tl.load(r + 2, mask=ok, other=0),
            tl.load(r + 3, mask=ok, other=0), tl.load(r + 4, mask=ok, other=0), tl.load(r + 5, mask=ok, other=0),
            tl.load(r + 6, mask=ok, other=0), tl.load(r + 7, mask=ok, other=0), tl.load(r + 8, mask=ok, other=0),
            tl.load(r + 9, mask=ok, other=0), tl.load(r + 10, mask=ok, other=0), tl.load(r + 12, mask=ok, other=0),
            tl.load(r + 13, mask=ok, other=0), tl.load(r + 14, mask=ok, other=0), tl.load(r + 15, mask=ok, other=0))


@triton.jit
def _qoff(offs, k: tl.constexpr, FMT: tl.constexpr):
    """Column k of a layer's offset-table row where the linears are quantized (a scale or zero
    offset, tables.py), else 0 (no load)."""
    if FMT == 0:
        return 0
    else:
        return tl.load(offs + k)


@triton.jit(do_not_specialize=["SPIN", "programs", "nunits", "nhs"])
def _step_kernel(units_ptr, starts_ptr, ctr_ptr, err_ptr, w_ptr, q_ptr, s_ptr, z_ptr, hs_ptr, hz_ptr, woffs_ptr,
                 embed_ptr, fnorm_ptr,
                 cs_ptr, tok_ptr, lens_ptr, bt_ptr, bt_stride, num_pages, out_ptr, logits_ptr, res_ptr,
                 qkv_ptr, att_ptr, mlp_ptr, ss_o_ptr, ss_d_ptr, part_ptr, lse_ptr, amax_ptr, aidx_ptr, ts_ptr,
                 programs, nunits, nhs, eps, qk_scale,
                 B: tl.constexpr, H: tl.constexpr, I: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                 D: tl.constexpr, V: tl.constexpr, PAGE: tl.constexpr, S_PAGE: tl.constexpr,
                 S_SLOT: tl.constexpr, S_HEAD: tl.constexpr, S: tl.constexpr, MERGE_S: tl.constexpr,
                 NO: tl.constexpr, NOP: tl.constexpr, NDOWN: tl.constexpr, NDP: tl.constexpr,
                 NHEAD: tl.constexpr, QKV_BN: tl.constexpr, O_BN: tl.constexpr, GU_BN: tl.constexpr,
                 DOWN_BN: tl.constexpr, HEAD_BN: tl.constexpr, BK: tl.constexpr, BKV: tl.constexpr,
                 MIN_KEYS: tl.constexpr, BMA: tl.constexpr, GP: tl.constexpr, RT: tl.constexpr,
                 ARR: tl.constexpr, HEAD_CTR: tl.constexpr, DONE: tl.constexpr, NCTR: tl.constexpr,
                 HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, PREFETCH: tl.constexpr,
                 DOT_F32: tl.constexpr, PREC: tl.constexpr, SPIN, ALIGN: tl.constexpr, XA: tl.constexpr,
                 FMA: tl.constexpr, STAGES: tl.constexpr, TIMELINE: tl.constexpr, FMT: tl.constexpr,
                 HFMT: tl.constexpr, GS: tl.constexpr, HZ: tl.constexpr, QA: tl.constexpr, GK: tl.constexpr,
                 NF: tl.constexpr):
    BM: tl.constexpr = 16
    QKVW: tl.constexpr = (HQ + 2 * HKV) * D
    # elements per weight chunk: BK columns of a 16-row tile (half that for 3-4 multiply-add rows:
    # their accumulators hold the registers); wider tiles take fewer columns
    CH: tl.constexpr = BK * 16 if FMA <= 2 else BK * 8
    # (int4: a chunk lies in one group, at most GK columns; GK is large for the other formats)
    QKV_BK: tl.constexpr = min(CH // QKV_BN, GK)
    O_BK: tl.constexpr = min(CH // O_BN, GK)
    GU_BK: tl.constexpr = min(CH // (2 * GU_BN), GK)
    DOWN_BK: tl.constexpr = min(CH // DOWN_BN, GK)
    HEAD_BK: tl.constexpr = min(CH // HEAD_BN, GK) if HFMT == 2 else CH // HEAD_BN
    # the layers' linear weights: model-dtype tiles from w_ptr, quantized ones (FP8 bytes, int4
    # words) from q_ptr, element offsets of their own type (QA: 16 bytes of them)
    lw_ptr = w_ptr if FMT == 0 else q_ptr
    LA: tl.constexpr = ALIGN if FMT == 0 else QA
    hw_ptr = w_ptr if HFMT == 0 else q_ptr
    HA: tl.constexpr = ALIGN if HFMT == 0 else QA
    pid = tl.program_id(0)
    lo = tl.load(starts_ptr + pid)
    hi = tl.load(starts_ptr + pid + 1)
    if TIMELINE:
        tl.store(ts_ptr + (nunits + pid) * 4, timer(pid))
    rm = tl.arange(0, BM)
    m_ok = rm < B
    emb_off = tl.maximum(tl.load(tok_ptr + rm, mask=m_ok, other=0), 0) * H     # [BM] the embedding rows
    emb_rows = embed_ptr + emb_off[:, None]
    res_rows = res_ptr + rm[:, None] * H                         # [BM, 1] the residual stream
    best_v = tl.full((BM,), float("-inf"), tl.float32)            # this program's LM-head argmax so far
    best_i = tl.full((BM,), 2147483647, tl.int32)
    op, layer, a, b, c, wt, tgt, sg, cnt, w0, w1, p0, pb0, p1, pb1 = _fields(units_ptr, lo, lo < hi)
    for u in tl.range(lo, hi, disable_licm=STAGES > 0):      # the ring: see gemv_ring.py
        nxt = _fields(units_ptr, u + 1, u + 1 < hi)               # the next row's fields, early
        ts = ts_ptr + u * 4
        if TIMELINE:
            tl.store(ts, timer(pid))
            tl.store(ts + 3, pid.to(tl.int64))
        if PREFETCH > 0:                                         # a later unit's tile into L2
            if FMT == 0:
                if pb0 > 0:
                    prefetch_l2(w_ptr + _aligned(p0, ALIGN), pb0.to(tl.int32))
                if pb1 > 0:
                    prefetch_l2(w_ptr + _aligned(p1, ALIGN), pb1.to(tl.int32))
            else:                                                # quantized: byte offsets from w_ptr
                wb_ptr = w_ptr.to(tl.pointer_type(tl.int8), bitcast=True)
                if pb0 > 0:
                    prefetch_l2(wb_ptr + _aligned(p0, 16), pb0.to(tl.int32))
                if pb1 > 0:
                    prefetch_l2(wb_ptr + _aligned(p1, 16), pb1.to(tl.int32))
        a = a.to(tl.int32)
        ctr_w = ctr_ptr + tl.maximum(wt, 0)
        target = tgt.to(tl.int32)
        ctr_s = ctr_ptr + tl.maximum(sg, 0)
        count = cnt.to(tl.int32)
        offs = woffs_ptr + layer * NF
        wt0 = lw_ptr + _aligned(w0, LA)                         # the unit's weight tile (gate for GU)
        if op == 1:                                              # QKV
            qkv_unit(layer, a, res_ptr, embed_ptr, emb_off, XA, m_ok, wt0, w_ptr + _woff(offs, 1, ALIGN),
                     w_ptr + _woff(offs, 5, ALIGN), ss_d_ptr, qkv_ptr, ctr_w, target, ctr_s, count, err_ptr, ts,
                     eps, B, H, QKVW, NDOWN, NDP, BM, QKV_BN, QKV_BK, HAS_BIAS, DOT_F32, PREC, SPIN, FMA, STAGES,
                     TIMELINE, s_ptr + _qoff(offs, W_SQKV, FMT), z_ptr + _qoff(offs, W_ZQKV, FMT), FMT, GS, HZ)
        elif op == 2:                                            # ATT
            attention_unit(a, b.to(tl.int32), c.to(tl.int32), qkv_ptr, att_ptr, cs_ptr,
                           w_ptr + _woff(offs, 7, ALIGN), w_ptr + _woff(offs, 8, ALIGN), w_ptr + _woff(offs, 9, ALIGN),
                           w_ptr + _woff(offs, 10, ALIGN), bt_ptr, bt_stride, lens_ptr, num_pages, part_ptr, lse_ptr,
                           ctr_w, target, ctr_ptr + ARR + a * HKV + b, ctr_s, err_ptr, ts, eps, qk_scale, HQ, HKV,
                           D, PAGE, S_PAGE, S_SLOT, S_HEAD, S, MERGE_S, BMA, GP, BKV, MIN_KEYS, QK_NORM, DOT_F32,
                           PREC, SPIN, TIMELINE)
        elif op == 3:                                            # O: residual += attention @ o.T
            if layer == 0:
                src = emb_rows
            else:
                src = res_rows
            residual_unit(a, a // O_BN, att_ptr, rm.to(tl.int64) * (HQ * D), XA, m_ok, wt0, HQ * D, src, res_ptr,
                          ss_o_ptr, ctr_w, target, ctr_s, count, err_ptr, ts, H, BM, O_BN, O_BK, DOT_F32, PREC,
                          SPIN, FMA, STAGES, TIMELINE, s_ptr + _qoff(offs, W_SO, FMT), z_ptr + _qoff(offs, W_ZO, FMT),
                          FMT, GS, HZ)
        elif op == 4:                                            # GU
            gate_up_unit(a, res_ptr, XA, m_ok, lw_ptr, _aligned(w0, LA), _aligned(w1, LA),
                         w_ptr + _woff(offs, 6, ALIGN), ss_o_ptr, mlp_ptr, ctr_w, target, ctr_s, count, err_ptr, ts,
                         eps, B, H, I, NO, NOP, BM, GU_BN, GU_BK, DOT_F32, PREC, SPIN, FMA, STAGES, TIMELINE,
                         s_ptr + _qoff(offs, W_SGU, FMT), z_ptr + _qoff(offs, W_ZGU, FMT), FMT, GS, HZ)
        elif op == 5:                                            # DOWN: residual += mlp @ down.T
            residual_unit(a, a // DOWN_BN, mlp_ptr, rm.to(tl.int64) * I, XA, m_ok, wt0, I, res_rows, res_ptr,
                          ss_d_ptr, ctr_w, target, ctr_s, count, err_ptr, ts, H, BM, DOWN_BN, DOWN_BK, DOT_F32,
                          PREC, SPIN, FMA, STAGES, TIMELINE, s_ptr + _qoff(offs, W_SDOWN, FMT),
                          z_ptr + _qoff(offs, W_ZDOWN, FMT), FMT, GS, HZ)
        elif op == 6:                                            # HEAD
            best_v, best_i = head_unit(a, res_ptr, XA, m_ok, hw_ptr + _aligned(w0, HA), fnorm_ptr, ss_d_ptr,
                                       logits_ptr, amax_ptr, aidx_ptr, out_ptr, best_v, best_i, c, ctr_w, target,
                                       ctr_ptr + HEAD_CTR, count, err_ptr, ts, eps, B, H, V, NDOWN, NDP, NHEAD, nhs, BM,
                                       HEAD_BN, HEAD_BK, RT, DOT_F32, PREC, SPIN, FMA, STAGES, TIMELINE, hs_ptr, hz_ptr,
                                       HFMT, GS, HZ)
        if TIMELINE:
            tl.store(ts + 2, timer(pid))
        op, layer, a, b, c, wt, tgt, sg, cnt, w0, w1, p0, pb0, p1, pb1 = nxt
    tl.debug_barrier()
    if TIMELINE:
        tl.store(ts_ptr + (nunits + pid) * 4 + 1, timer(pid))
        tl.store(ts_ptr + (nunits + pid) * 4 + 3, pid.to(tl.int64))
    if tl.atomic_add(ctr_ptr + DONE, 1, sem="acq_rel", scope="gpu") == programs - 1:
        cz = tl.arange(0, 1024)                                  # the last program: counters to zero
        for c0 in range(0, NCTR, 1024):
            tl.store(ctr_ptr + c0 + cz, tl.zeros((1024,), tl.int32), mask=c0 + cz < NCTR)


def kernel_constexprs(s: Schedule, *, gemv: str, prefetch: int, has_bias: bool, qk_norm: bool, interpreter: bool,
                      fp32: bool, align: int, xalign: int, PAGE: int, S_PAGE: int, S_SLOT: int,
                      S_HEAD: int, timeline: bool = False, stages: int = 0,
                      fmt: WeightFormat = WeightFormat(FMT_MODEL, FMT_MODEL), qalign: int = 0) -> dict:
    """The compile-time arguments of `_step_kernel` for schedule s (pure: the launch and the sm_90
    compile test share it). PAGE / S_*: the KV pages' size and element strides (page, slot, head);
    align / xalign / qalign: the elements the model-dtype offsets / activation rows / quantized
    weight offsets are multiples of (qalign 0: align); stages: the GEMV weight chunks in flight in
    shared memory (0: three in registers); fmt: the weights' format (formats.py)."""
    g, c, t = s.geometry, s.counters, s.tiles
    gp = triton.next_power_of_2(g.group)
    sp = triton.next_power_of_2(s.splits)
    return dict(B=s.rows, H=g.hidden, I=g.inter, HQ=g.heads, HKV=g.kv_heads, D=g.head_dim, V=g.vocab, PAGE=PAGE,
                S_PAGE=S_PAGE, S_SLOT=S_SLOT, S_HEAD=S_HEAD, S=s.splits,
                MERGE_S=max(1, min(sp, 2048 // (gp * (g.head_dim // 2)))), NO=s.n_o,
                NOP=triton.next_power_of_2(s.n_o), NDOWN=s.n_down, NDP=triton.next_power_of_2(s.n_down),
                NHEAD=s.n_head, QKV_BN=t.qkv_bn, O_BN=t.o_bn, GU_BN=t.gu_bn, DOWN_BN=t.down_bn, HEAD_BN=t.head_bn,
                BK=t.block_k, BKV=t.block_kv, MIN_KEYS=t.min_keys,
                BMA=max(16, gp), GP=gp, RT=64, ARR=c.arrivals, HEAD_CTR=c.head, DONE=c.done, NCTR=c.count,
                HAS_BIAS=has_bias, QK_NORM=qk_norm, PREFETCH=prefetch, DOT_F32=interpreter,
                PREC="ieee" if fp32 else "tf32", ALIGN=align, XA=xalign, FMA=s.rows if gemv == "fma" else 0,
                STAGES=stages, TIMELINE=timeline, FMT=fmt.fmt, HFMT=fmt.head_fmt, GS=fmt.group, HZ=fmt.has_zero,
                QA=qalign or align, GK=fmt.chunk_cap, NF=NF)


def chunk_bytes(tiles: Tiles, fma_rows: int, elem_bytes: float) -> int:
    """Bytes of one GEMV weight chunk (the kernel's CH elements: block_k columns of a 16-row tile,
    half that for 3-4 multiply-add rows; int4's chunks may be narrower), the unit of the
    shared-memory ring, at most."""
    return int(tiles.block_k * (16 if fma_rows <= 2 else 8) * elem_bytes)


def default_prefetch(device: torch.device) -> int:
    """The default L2 prefetch distance in units: 1 on sm_90+ GPUs, 0 elsewhere (the
    interpreter cannot run the prefetch's inline PTX)."""
    if device.type != "cuda":
        return 0
    return 1 if torch.cuda.get_device_capability(device) >= (9, 0) else 0


def unsupported(weights, kv_caches, rows: int) -> str | None:
    """Why the persistent step cannot run this model at `rows` rows (None: it can), one line: 1..16
    rows; the embedding, norms and biases contiguous in the model dtype; the linear weights in one
    format of formats.py (model dtype, FP8 per-channel / per-tensor, int4 without act-order; the
    LM head in the model dtype or that format); KV pages in the model dtype (no FP8 KV); head_dim
    a power of 2 >= 32 (the qkv tile never spans two heads)."""
    if not 1 <= rows <= MAX_ROWS:
        return f"rows: {rows} outside 1..{MAX_ROWS}"
    dt = weights.embed.dtype
    if dt not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype: {dt} (bfloat16, float16 or float32 only)"
    tensors = [weights.embed, weights.final_norm]
    for layer in weights.layers:
        tensors += [layer.input_norm, layer.post_attn_norm]
        tensors += [t for t in (layer.qkv_bias, layer.q_norm, layer.k_norm) if t is not None]
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dtype != dt or not t.is_contiguous():
            return f"weights: a {type(t).__name__} that is not a contiguous {dt} tensor"
    fmt = weight_format(weights)
    if isinstance(fmt, str):
        return fmt
    for c in kv_caches:
        if c.k.dtype != dt or c.k.stride() != c.v.stride() or c.k.stride(3) != 1:
            return f"kv_caches: {c.k.dtype} pages (the model dtype {dt} only)"
    d = kv_caches[0].k.shape[3]
    if d < 32 or d & (d - 1):
        return f"head_dim: {d} (a power of 2 >= 32 only)"
    return None


def _pow2_dividing(*values: int, cap: int) -> int:
    """The largest power of 2 <= cap dividing every value."""
    a = cap
    while a > 1 and any(v % a for v in values):
        a //= 2
    return a


class PersistentStep:
    """One bucket's persistent step: its schedule, device tables and scratch (allocated here,
    once, outside any graph), and the launch. See the module docstring for the arguments;
    programs: default the SM count on a GPU, 1 elsewhere; tiles: the schedule's tile sizes;
    num_warps: per program; prefetch: L2 prefetch distance in units (default_prefetch) and
    prefetch_bytes: at most this much of each prefetched tile; spin_limit: counter reads before a
    wait gives up (the watchdog, ERR_STALL); gemv: the GEMV tiles' arithmetic, "dot" (tl.dot over
    16-row tiles) or "fma" (multiply-add, 1..FMA_MAX_ROWS rows); "auto": fma up to FMA_MAX_ROWS
    rows; cooperative: launch the grid cooperatively on a GPU (False: plainly, one program per
    SM); stages: the GEMV weight stream, 0 (default): three chunks in flight in registers
    (gemv_tile.py), 1..MAX_STAGES: a shared-memory ring of that many chunks filled by cp.async
    (gemv_ring.py; at most RING_BYTES); schedule: a prebuilt schedule of this geometry and rows
    (tests: `linearize`); timeline: every launch records each unit's start / waited / end times
    (GPU global timer, ns) into `self.timeline` [units + programs, 4] int64 (timeline.py reads it)."""

    def __init__(self, weights, kv_caches, cos_sin: torch.Tensor, *, geometry: Geometry, rows: int, eps: float,
                 programs: int | None = None, tiles: Tiles = Tiles(), max_context_len: int = 4096,
                 num_warps: int = 8, prefetch: int | None = None, prefetch_bytes: int = PREFETCH_BYTES,
                 spin_limit: int = SPIN_LIMIT, gemv: str = "auto", cooperative: bool = True,
                 stages: int = 0, schedule: Schedule | None = None, timeline: bool = False):
        why = unsupported(weights, kv_caches, rows)
        if why is not None:
            raise ValueError(f"persistent step: {why}")
        dev = weights.embed.device
        if schedule is not None:
            if not isinstance(schedule, Schedule) or schedule.geometry != geometry or schedule.rows != rows:
                raise ValueError(f"schedule: expected a Schedule of this geometry and rows={rows}")
            programs = schedule.programs
        if programs is None:
            programs = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        if dev.type != "cuda" and programs != 1:
            raise ValueError(f"programs: {programs}; off the GPU (the interpreter runs programs one after "
                             f"another) only 1 can run a schedule with waits")
        if isinstance(spin_limit, bool) or not isinstance(spin_limit, int) or spin_limit < 1:
            raise ValueError(f"spin_limit: expected an int >= 1, got {spin_limit!r}")
        self.spin_limit = spin_limit
        if gemv not in ("auto", "dot", "fma") or (gemv == "fma" and rows > FMA_MAX_ROWS):
            raise ValueError(f"gemv: expected 'auto', 'dot' or 'fma' (fma: at most {FMA_MAX_ROWS} rows), got "
                             f"{gemv!r} at {rows} rows")
        self.gemv = ("fma" if rows <= FMA_MAX_ROWS else "dot") if gemv == "auto" else gemv
        if num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: expected 1, 2, 4, 8 or 16, got {num_warps!r}")
        if timeline not in (True, False) or (timeline and dev.type != "cuda"):
            raise ValueError(f"timeline: expected a bool (True only on a GPU: the global timer), got {timeline!r}")
        if isinstance(prefetch_bytes, bool) or not isinstance(prefetch_bytes, int) or prefetch_bytes < 0:
            raise ValueError(f"prefetch_bytes: expected an int >= 0, got {prefetch_bytes!r}")
        self.device, self.dtype, self.geometry, self.rows, self.eps = dev, weights.embed.dtype, geometry, rows, eps
        self.num_warps = num_warps
        self.prefetch = default_prefetch(dev) if prefetch is None else prefetch
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or not 0 <= self.prefetch <= 8 \
                or (self.prefetch and dev.type != "cuda"):
            raise ValueError(f"prefetch: expected an int in [0, 8] (0 off the GPU), got {self.prefetch!r}")
        esize = weights.embed.element_size()
        self.format: WeightFormat = weight_format(weights)
        wbytes = self.format.elem_bytes(esize)
        if isinstance(stages, bool) or not isinstance(stages, int) or not 0 <= stages <= MAX_STAGES:
            raise ValueError(f"stages: expected an int in [0, {MAX_STAGES}] (0: registers), got {stages!r}")
        ring = stages * chunk_bytes(tiles, rows if self.gemv == "fma" else 0,
                                    max(wbytes, self.format.head_elem_bytes(esize)))
        if ring > RING_BYTES:
            raise ValueError(f"stages: {stages} chunks of block_k={tiles.block_k} take {ring} bytes of shared "
                             f"memory, above {RING_BYTES}")
        self.stages = stages
        self.schedule: Schedule = schedule or build_schedule(
            geometry, rows, programs, tiles=tiles, max_context_len=max_context_len, elem_bytes=wbytes,
            head_elem_bytes=self.format.head_elem_bytes(esize))
        self._tensors = (weights, kv_caches, cos_sin)             # kept alive: the table points at them
        t = build_tables(self.schedule, weights, kv_caches, self.format, prefetch=self.prefetch,
                         prefetch_bytes=prefetch_bytes)
        self._bases, self._align = t.bases, t.align
        head = weights.lm_head                                     # its scales / zeros (quantized head)
        self._head_sz = (head.scale, head.zero if self.format.has_zero else t.bases.z) \
            if self.format.head_fmt != FMT_MODEL else (t.bases.s, t.bases.z)
        self.woffs = t.woffs.to(dev)                               # [L, NF] int64
        self.units = t.units.to(dev)                               # [N, FIELDS] int64
        self.starts = torch.tensor(self.schedule.starts, dtype=torch.int64, device=dev)
        s, g = self.schedule, geometry
        self.counters = torch.zeros(s.counters.count, dtype=torch.int32, device=dev)
        b, dt = rows, self.dtype
        self.residual = torch.zeros((b, g.hidden), dtype=dt, device=dev)
        self.qkv = torch.zeros((b, g.qkv_rows), dtype=dt, device=dev)
        self.att = torch.zeros((b, g.heads * g.head_dim), dtype=dt, device=dev)
        self.mlp = torch.zeros((b, g.inter), dtype=dt, device=dev)
        self.logits = torch.zeros((b, g.vocab), dtype=dt, device=dev)
        f32 = dict(dtype=torch.float32, device=dev)
        self.ss_o = torch.zeros((s.n_o, 16), **f32)
        self.ss_d = torch.zeros((s.n_down, 16), **f32)
        slots = max(1, b * g.kv_heads * s.splits * g.group)
        self.part = torch.zeros((slots, g.head_dim), **f32)
        self.lse = torch.zeros((slots,), **f32)
        self.amax = torch.zeros((max(1, s.head_programs), 16), **f32)
        self.aidx = torch.zeros((max(1, s.head_programs), 16), dtype=torch.int32, device=dev)
        # [units + programs, TS] int64: per unit (start, waited, end, program), then per program
        # (start, end, -, program); a 1-element dummy when off
        self.timeline = torch.zeros((len(s.units) + s.programs, TS) if timeline else (1, TS), dtype=torch.int64,
                                    device=dev)
        kc = kv_caches[0]
        nhd = kc.layout == "NHD"
        k = kc.k
        self._kv = dict(PAGE=k.shape[1] if nhd else k.shape[2], S_PAGE=k.stride(0),
                        S_SLOT=k.stride(1 if nhd else 2), S_HEAD=k.stride(2 if nhd else 1))
        self._num_pages = k.shape[0]
        # activation rows (residual, attention, MLP scratch; embedding rows): their strides and bases
        xalign = _pow2_dividing(g.hidden, g.inter, g.heads * g.head_dim, weights.embed.data_ptr() // esize,
                                cap=16 // esize)
        # the driver refuses a cooperative grid it cannot keep resident (instead of a hang);
        # cooperative=False launches plainly (the grid is then one program per SM)
        if not isinstance(cooperative, bool):
            raise ValueError(f"cooperative: expected a bool, got {cooperative!r}")
        self.cooperative = dev.type == "cuda" and programs > 1 and cooperative
        layer0 = weights.layers[0]
        self.constexprs = kernel_constexprs(self.schedule, gemv=self.gemv, prefetch=self.prefetch,
                                            has_bias=layer0.qkv_bias is not None, qk_norm=layer0.q_norm is not None,
                                            interpreter=dev.type != "cuda", fp32=self.dtype == torch.float32,
                                            align=self._align, xalign=xalign, timeline=timeline, stages=stages,
                                            fmt=self.format, qalign=t.qalign, **self._kv)

    @property
    def programs(self) -> int:
        return self.schedule.programs

    def launch(self, tokens: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, out: torch.Tensor,
               device_error: torch.Tensor) -> torch.Tensor:
        """One decoder step of the bucket's rows (see the module docstring) -> out. Capturable."""
        b = self.rows
        for name, t, dt in (("tokens", tokens, torch.int64), ("seq_lens", seq_lens, torch.int32),
                            ("out", out, torch.int64)):
            if t.shape != (b,) or t.dtype != dt or t.device != self.device or not t.is_contiguous():
                raise ValueError(f"{name}: expected contiguous [{b}] {dt} on {self.device}, got "
                                 f"{tuple(t.shape)} {t.dtype} on {t.device}")
        if block_table.dim() != 2 or block_table.shape[0] < b or block_table.dtype != torch.int32 \
                or block_table.stride(1) != 1 or block_table.device != self.device:
            raise ValueError(f"block_table: expected [>= {b}, W] int32 (unit column stride) on {self.device}, "
                             f"got {tuple(block_table.shape)} {block_table.dtype} on {block_table.device}")
        if device_error.dtype != torch.int32 or device_error.device != self.device:
            raise ValueError(f"device_error: expected int32 on {self.device}, got {device_error.dtype} "
                             f"on {device_error.device}")
        s = self.schedule
        weights, _, cos_sin = self._tensors
        opts = {"launch_cooperative_grid": True} if self.cooperative else {}
        b_ = self._bases
        _step_kernel[(s.programs,)](
            self.units, self.starts, self.counters, device_error, b_.w, b_.q, b_.s, b_.z, *self._head_sz,
            self.woffs, weights.embed,
            weights.final_norm, cos_sin, tokens, seq_lens, block_table, block_table.stride(0),
            self._num_pages, out, self.logits, self.residual, self.qkv, self.att, self.mlp, self.ss_o, self.ss_d,
            self.part, self.lse, self.amax, self.aidx, self.timeline, s.programs, len(s.units), s.head_programs,
            float(self.eps),
            self.geometry.head_dim ** -0.5 * 1.4426950408889634, SPIN=self.spin_limit, **self.constexprs,
            num_warps=self.num_warps, **opts)
        return out


__all__ = ["PersistentStep", "unsupported", "default_prefetch", "kernel_constexprs", "chunk_bytes", "FMA_MAX_ROWS",
           "MAX_STAGES", "PREFETCH_BYTES", "RING_BYTES", "TS"]
