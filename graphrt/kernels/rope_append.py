"""One launch per layer: (Qwen3) per-head q/k RMSNorm, RoPE on q and k, k/v into the paged cache.

Input is the fused qkv GEMM output [T, (Hq + 2*Hkv) * D] (columns: q heads, k heads, v heads,
each head D wide). Output: rotated q [T, Hq, D]; rotated k and v go straight into the layer's
paged K/V cache (NHD or HND: strides are passed in). RoPE reads the [max_positions, D] float32
cos/sin table built at model load (graphrt.model.rope: cos half, then sin half; HF rotate_half
convention). All math in float32, one rounding at each store.

Two modes, one kernel:
- decode (`rope_append_decode`): token t is bucket row t, at position seq_lens[t] - 1 read on
  the device. Padding rows (seq_len 0) write no K/V (their q is rotated at position 0).
- prefill (`rope_append_prefill`): token t has an explicit position positions[t] and block-table
  row rows[t]; rows[t] < 0 marks a padding token (no K/V written).
The K/V slot of a token at position p is page block_table[row, p // page_size], slot
p % page_size. A slot past the table's width (or a row past its height) is skipped and flags
ERR_KV_SLOT; a page id outside the pool is skipped and flags ERR_PAGE_ID; a position outside
the cos/sin table is skipped (q written as zeros) and flags ERR_POSITION: never an
out-of-bounds access. Same device_error contract as append_kv.

FP8 KV cache: when the cache tensors are float8_e4m3fn, `kv_scale` ([2] float32 on the device:
k scale, v scale, per tensor) is required and k / v are stored as clamp(x / scale, +-448) in
e4m3 (IEEE division, one round-to-nearest-even: `append_kv.kv_e4m3`, the same codes on the GPU
and in the CPU interpreter); the value a reader sees is stored * scale (graphrt/model/quant/kv.py).

FP8 weights (W8A8, kernels/fp8.py): qkv may be a `ScaledAcc`, the FP8 qkv GEMM's unscaled
output; its row / column scales and bias are applied in float32 as it is loaded.

Grid: (T, ceil(Hq / BH) + ceil(Hkv / BH)) for BH heads per program (`heads_per_program`: 1 on
the GPU at decode sizes, i.e. Hq + Hkv single-warp programs per token): the first programs of a
token rotate its q heads, the rest rotate its k heads and write k and v. Capturable in a CUDA
graph (no host reads); runs on CPU under TRITON_INTERPRET=1 (with BH = all heads there).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.append_kv import kv_e4m3
from graphrt.kernels.fp8 import ScaledAcc, check_scaled
from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl
from graphrt.kernels.flags import ERR_KV_SLOT, ERR_PAGE_ID, ERR_POSITION


@triton.jit
def _rms_halves(x1, x2, w_ptr, j, mj, eps, D: tl.constexpr, HALF: tl.constexpr):
    """Per-head RMSNorm of [BH, BLOCK] halves (one head per row)."""
    inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)[:, None]
    w1 = tl.load(w_ptr + j, mask=mj, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + j, mask=mj, other=0.0).to(tl.float32)
    return x1 * inv * w1, x2 * inv * w2


@triton.jit
def _load_cols(src, rs, sc_ptr, b_ptr, col, m, QKV_SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
               QKV_COL: tl.constexpr):
    """float32 qkv columns `col` of one token: acc (* row scale (* column scale)) (+ bias)."""
    x = tl.load(src + col, mask=m, other=0.0).to(tl.float32)
    if QKV_SCALED:
        x = x * rs
        if QKV_COL:
            x = x * tl.load(sc_ptr + col, mask=m, other=0.0)
    if HAS_BIAS:
        x += tl.load(b_ptr + col, mask=m, other=0.0).to(tl.float32)
    return x


@triton.jit(do_not_specialize=["bt_rows", "max_pages", "num_pool_pages"])  # vary per bucket / pool
def _rope_append_kernel(qkv_ptr, qkv_stride, q_ptr, cs_ptr, num_positions, qn_ptr, kn_ptr, eps,
                        k_cache_ptr, v_cache_ptr, bt_ptr, bt_stride, bt_rows, max_pages,
                        num_pool_pages, page_size, s_page, s_slot, s_head,
                        lens_ptr, pos_ptr, rows_ptr, error_ptr, kvs_ptr, rs_ptr, sc_ptr, b_ptr,
                        HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BH: tl.constexpr,
                        BLOCK: tl.constexpr, DECODE: tl.constexpr, QK_NORM: tl.constexpr,
                        KV_FP8: tl.constexpr, QKV_SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
                        QKV_COL: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    HALF: tl.constexpr = D // 2
    NQB: tl.constexpr = (HQ + BH - 1) // BH          # programs 0..NQB-1: q heads, then k/v heads
    t = tl.program_id(0)
    hb = tl.program_id(1)
    if DECODE:
        seq = tl.load(lens_ptr + t)
        live = seq > 0
        pos = tl.maximum(seq - 1, 0)
        row = t
    else:
        pos = tl.load(pos_ptr + t)
        row = tl.load(rows_ptr + t)
        live = row >= 0
    ok_pos = (pos >= 0) & (pos < num_positions)
    jj = tl.arange(0, BLOCK)
    mj = (jj < HALF)[None, :]
    j = jj[None, :]                                   # [1, BLOCK] column within a half
    cs_row = cs_ptr + tl.where(ok_pos, pos, 0).to(tl.int64) * D
    okf = ok_pos.to(tl.float32)  # outside the table: cos = sin = 0, q written as zeros
    c = tl.load(cs_row + j, mask=mj, other=0.0) * okf
    s = tl.load(cs_row + HALF + j, mask=mj, other=0.0) * okf
    src = qkv_ptr + t.to(tl.int64) * qkv_stride
    rs = 1.0
    if QKV_SCALED:
        rs = tl.load(rs_ptr + t)
    if hb < NQB:
        h = hb * BH + tl.arange(0, BH)[:, None]       # [BH, 1] q heads
        m = (h < HQ) & mj
        x1 = _load_cols(src, rs, sc_ptr, b_ptr, h * D + j, m, QKV_SCALED, HAS_BIAS, QKV_COL)
        x2 = _load_cols(src, rs, sc_ptr, b_ptr, h * D + HALF + j, m, QKV_SCALED, HAS_BIAS, QKV_COL)
        if QK_NORM:
            x1, x2 = _rms_halves(x1, x2, qn_ptr, j, mj, eps, D, HALF)
        dst = q_ptr + (t.to(tl.int64) * HQ + h) * D
        tl.store(dst + j, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=m)
        tl.store(dst + HALF + j, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=m)
    else:
        kh = (hb - NQB) * BH + tl.arange(0, BH)[:, None]   # [BH, 1] kv heads
        m = (kh < HKV) & mj
        if live & (ok_pos == 0):
            tl.atomic_or(error_ptr, 16)
        if live & ok_pos:
            col = pos // page_size
            if (col >= max_pages) | (row >= bt_rows):
                tl.atomic_or(error_ptr, 8)
            else:
                page = tl.load(bt_ptr + row.to(tl.int64) * bt_stride + col)
                if (page < 0) | (page >= num_pool_pages):
                    tl.atomic_or(error_ptr, 2)
                else:
                    k1 = _load_cols(src, rs, sc_ptr, b_ptr, (HQ + kh) * D + j, m, QKV_SCALED, HAS_BIAS,
                                    QKV_COL)
                    k2 = _load_cols(src, rs, sc_ptr, b_ptr, (HQ + kh) * D + HALF + j, m, QKV_SCALED,
                                    HAS_BIAS, QKV_COL)
                    if QK_NORM:
                        k1, k2 = _rms_halves(k1, k2, kn_ptr, j, mj, eps, D, HALF)
                    v1 = _load_cols(src, rs, sc_ptr, b_ptr, (HQ + HKV + kh) * D + j, m, QKV_SCALED,
                                    HAS_BIAS, QKV_COL)
                    v2 = _load_cols(src, rs, sc_ptr, b_ptr, (HQ + HKV + kh) * D + HALF + j, m,
                                    QKV_SCALED, HAS_BIAS, QKV_COL)
                    dst = page.to(tl.int64) * s_page + (pos % page_size) * s_slot + kh * s_head
                    ty = k_cache_ptr.dtype.element_ty
                    r1 = k1 * c - k2 * s
                    r2 = k2 * c + k1 * s
                    if KV_FP8:   # per-tensor scales: stored = clamp(x / scale, +-448) in e4m3
                        ks = tl.load(kvs_ptr)
                        vs = tl.load(kvs_ptr + 1)
                        r1, r2 = kv_e4m3(r1, ks), kv_e4m3(r2, ks)
                        v1, v2 = kv_e4m3(v1, vs), kv_e4m3(v2, vs)
                    tl.store(k_cache_ptr + dst + j, r1.to(ty), mask=m)
                    tl.store(k_cache_ptr + dst + HALF + j, r2.to(ty), mask=m)
                    tl.store(v_cache_ptr + dst + j, v1.to(ty), mask=m)
                    tl.store(v_cache_ptr + dst + HALF + j, v2.to(ty), mask=m)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def heads_per_program(device: torch.device, tokens: int, max_heads: int) -> int:
    """Heads per program: on a GPU 1 for decode-sized batches (most parallel programs, each a
    single warp) and 4 past 64 tokens (fewer, fuller programs for prefill); in the CPU
    interpreter, all heads (its cost is per program, not per element)."""
    if device.type != "cuda":
        return triton.next_power_of_2(max_heads)
    return 1 if tokens <= 64 else min(4, triton.next_power_of_2(max_heads))


def _launch(qkv, cos_sin, kv_cache, block_table, device_error, hq, lens, positions, rows,
            q_norm, k_norm, eps, q_out, bh, kv_scale=None):
    kc, vc = kv_cache.as_tuple()
    scaled = isinstance(qkv, ScaledAcc)
    if scaled:
        sacc = qkv
        qkv = sacc.acc
    fp8 = kc.dtype == torch.float8_e4m3fn
    _need(fp8 == (kv_scale is not None), "kv_scale: give a [2] float32 (k, v) scale tensor exactly "
          f"when the cache is float8_e4m3fn (cache dtype {kc.dtype})")
    _need(kv_scale is None or (kv_scale.dtype == torch.float32 and kv_scale.shape == (2,)
                               and kv_scale.device == kc.device),
          f"kv_scale: expected [2] float32 on {kc.device}, got "
          f"{None if kv_scale is None else (tuple(kv_scale.shape), kv_scale.dtype, str(kv_scale.device))}")
    nhd = kv_cache.layout == "NHD"
    hkv, d = (kc.shape[2], kc.shape[3]) if nhd else (kc.shape[1], kc.shape[3])
    page_size = kc.shape[1] if nhd else kc.shape[2]
    s_page, s_slot, s_head = kc.stride(0), kc.stride(1 if nhd else 2), kc.stride(2 if nhd else 1)
    _need(kc.stride() == vc.stride() and kc.shape == vc.shape and kc.stride(3) == 1,
          "kv_cache: k and v must share shape and strides, unit stride along head_dim")
    width = (hq + 2 * hkv) * d
    _need(qkv.dim() == 2 and qkv.shape[1] == width and qkv.stride(1) == 1,
          f"qkv: expected [T, (Hq + 2*Hkv) * D] = [T, {width}] with unit column stride, got "
          f"{tuple(qkv.shape)}")
    t = qkv.shape[0]
    if scaled:
        check_scaled("qkv", sacc, t, width)
    _need(cos_sin.dim() == 2 and cos_sin.shape[1] == d and cos_sin.dtype == torch.float32
          and cos_sin.is_contiguous(), f"cos_sin: expected contiguous [max_positions, {d}] float32, "
          f"got {tuple(cos_sin.shape)} {cos_sin.dtype}")
    _need((q_norm is None) == (k_norm is None), "q_norm, k_norm: give both or neither")
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        _need(w is None or (tuple(w.shape) == (d,) and w.is_contiguous()),
              f"{name}: expected contiguous [{d}], got {None if w is None else tuple(w.shape)}")
    _need(block_table.dim() == 2 and block_table.dtype == torch.int32 and block_table.stride(1) == 1,
          f"block_table: expected [rows, max_pages] int32, got {tuple(block_table.shape)} "
          f"{block_table.dtype}")
    _need(device_error.dtype == torch.int32 and device_error.numel() >= 1,
          "device_error: expected an int32 tensor of >= 1 element")
    for name, x in (("seq_lens", lens), ("positions", positions), ("rows", rows)):
        _need(x is None or (x.dim() == 1 and x.shape[0] == t and x.is_contiguous()
                            and x.dtype in (torch.int32, torch.int64)),
              f"{name}: expected contiguous [T={t}] int32/int64, got "
              f"{None if x is None else (tuple(x.shape), x.dtype)}")
    if q_out is None:
        q_out = torch.empty((t, hq, d), dtype=qkv.dtype, device=qkv.device)
    _need(tuple(q_out.shape) == (t, hq, d) and q_out.is_contiguous(),
          f"q_out: expected contiguous [{t}, {hq}, {d}], got {tuple(q_out.shape)}")
    tensors = [qkv, cos_sin, kc, block_table, device_error, q_out, lens, positions, rows, q_norm]
    devices = {x.device for x in tensors if x is not None}
    _need(len(devices) == 1, f"inputs: all tensors must be on one device, got {sorted(map(str, devices))}")
    if t == 0:
        return q_out
    decode = lens is not None
    dummy = lens if decode else positions
    if bh is None:
        bh = heads_per_program(qkv.device, t, max(hq, hkv))
    _need(bh >= 1 and bh & (bh - 1) == 0, f"heads_per_program: must be a power of 2, got {bh}")
    block = triton.next_power_of_2(d // 2)
    grid = (t, triton.cdiv(hq, bh) + triton.cdiv(hkv, bh))
    pdl = use_pdl(qkv)
    _rope_append_kernel[grid](
        qkv, qkv.stride(0), q_out, cos_sin, cos_sin.shape[0],
        q_norm if q_norm is not None else cos_sin, k_norm if k_norm is not None else cos_sin,
        float(eps), kc, vc, block_table, block_table.stride(0), block_table.shape[0],
        block_table.shape[1], kc.shape[0], page_size, s_page, s_slot, s_head,
        dummy, dummy if decode else positions, dummy if decode else rows, device_error,
        kv_scale if fp8 else cos_sin, sacc.row_scale if scaled else cos_sin,
        sacc.col_scale if scaled and sacc.col_scale is not None else cos_sin,
        sacc.bias if scaled and sacc.bias is not None else cos_sin,
        HQ=hq, HKV=hkv, D=d, BH=bh, BLOCK=block, DECODE=decode, QK_NORM=q_norm is not None,
        KV_FP8=fp8, QKV_SCALED=scaled, HAS_BIAS=scaled and sacc.bias is not None,
        QKV_COL=scaled and sacc.col_scale is not None, PDL=pdl,
        num_warps=min(4, max(1, bh * block // 256)), **pdl_options(pdl))
    return q_out


def rope_append_decode(qkv: torch.Tensor, cos_sin: torch.Tensor, kv_cache, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, device_error: torch.Tensor, *, num_q_heads: int,
                       q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                       eps: float = 1e-6, q_out: torch.Tensor | None = None,
                       heads_per_program: int | None = None,
                       kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Decode: qkv [B, (Hq + 2*Hkv) * D] (model dtype), seq_lens [B] int32 counting the new token,
    block_table [B, max_pages] int32 -> rotated q [B, Hq, D] (qkv's dtype unless `q_out`).
    Writes row b's rotated k and v at position seq_lens[b] - 1; see module docstring."""
    return _launch(qkv, cos_sin, kv_cache, block_table, device_error, num_q_heads, seq_lens,
                   None, None, q_norm, k_norm, eps, q_out, heads_per_program, kv_scale)


def rope_append_prefill(qkv: torch.Tensor, cos_sin: torch.Tensor, kv_cache, block_table: torch.Tensor,
                        positions: torch.Tensor, rows: torch.Tensor, device_error: torch.Tensor, *,
                        num_q_heads: int, q_norm: torch.Tensor | None = None,
                        k_norm: torch.Tensor | None = None, eps: float = 1e-6,
                        q_out: torch.Tensor | None = None,
                        heads_per_program: int | None = None,
                        kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill: qkv [T, (Hq + 2*Hkv) * D] of T tokens (any mix of requests), positions [T] and
    rows [T] (block-table row; < 0 = padding) int32/int64 -> rotated q [T, Hq, D]. Writes each
    token's rotated k and v at its position in its row's pages; see module docstring."""
    return _launch(qkv, cos_sin, kv_cache, block_table, device_error, num_q_heads, None,
                   positions, rows, q_norm, k_norm, eps, q_out, heads_per_program, kv_scale)


__all__ = ["rope_append_decode", "rope_append_prefill", "ERR_POSITION", "ERR_KV_SLOT", "ERR_PAGE_ID"]
