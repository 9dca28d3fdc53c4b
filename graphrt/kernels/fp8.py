"""FP8 (e4m3) activations for the W8A8 decode GEMMs: per-row quantization and the scale epilogue.

    xq = quantize_rows(x)                  # x [M, K] float -> Fp8Rows (data [Mp, K] e4m3, scale [M])
    acc = ScaledAcc(y, xq.scale, w_scale)  # y = xq.data @ wq.T (a GEMM with unit scales)
    out = apply_scales(acc)                # [M, N] = y * row_scale[:, None] * col_scale[None, :] (+ bias)

The GEMM runs with unit per-tensor scales (cuBLASLt's fast FP8 kernel); the per-row activation
scale and the per-column (channel) weight scale are carried to whatever kernel reads the GEMM's
output next (add + RMSNorm, SiLU-mul, rope_append, or `apply_scales` for the logits), which
multiplies them in float32 as it loads: no extra pass over the output.

Quantization of a float32 row x with amax a: scale = max(a / 448, 1e-12) (float32),
q = e4m3(clamp(x * (1 / scale), +-448)) rounded to nearest even (the reciprocal once per row:
x * (1 / scale) differs from x / scale by at most one float32 ulp, so a code differs from
torch's x / scale conversion only at an exact e4m3 rounding tie). `round_e4m3` does the rounding in
float32 arithmetic before the cast, so the cast is exact on the GPU and in the CPU interpreter
(whose own float32 -> e4m3 conversion mis-rounds ties and mantissa carries; Triton 3.9).
Data rows are padded to a multiple of 16 (`padded_rows`; the pad rows are never written and never
read back: the GEMM's pad output rows are dropped).

Capturable in a CUDA graph (no host reads); runs on CPU under TRITON_INTERPRET=1. The types the
kernels exchange (Fp8Rows, ScaledAcc) live in kernels/fp8_rows.py, which imports no Triton.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.fp8_rows import (FP8, FP8_MAX, ROW_ALIGN, SCALE_FLOOR, Fp8Rows, ScaledAcc, check_scaled,
                                      new_rows, padded_rows)
from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl

@triton.jit
def round_e4m3(x):
    """float32 x with |x| <= 448 -> the nearest e4m3 value (ties to even), as float32.
    Adding C = 2^(e + 20) (e = x's exponent, floored at -6: e4m3's subnormal quantum 2^-9)
    leaves exactly 3 mantissa bits, rounded by the float32 add."""
    a = tl.abs(x)
    e = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF             # biased exponent
    c = (tl.maximum(e, 127 - 6) + 20) << 23
    cf = c.to(tl.float32, bitcast=True)
    r = (a + cf) - cf
    return tl.where(x < 0, -r, r)


@triton.jit
def quantize_store(x, amax, data_ptrs, scale_ptr, mask):
    """Store float32 x (one row, or its masked tile) as e4m3 with scale max(amax / 448, 1e-12):
    q = x * (1 / scale) (one IEEE reciprocal per row, then multiplies), clamped, rounded."""
    s = tl.maximum(tl.div_rn(amax, 448.0), 1e-12)
    q = tl.minimum(tl.maximum(x * tl.div_rn(1.0, s), -448.0), 448.0)
    tl.store(data_ptrs, round_e4m3(q).to(tl.float8e4nv), mask=mask)
    tl.store(scale_ptr, s)


@triton.jit
def _quantize_tiles_kernel(y_ptr, y_stride, part_ptr, q_ptr, q_stride, s_ptr, K, NB,
                           BLOCK: tl.constexpr, NB_P2: tl.constexpr, PDL: tl.constexpr):
    """Grid (M, NB): tile j of row r, quantized with the row's amax = max of its NB partial
    amaxes part[r, 0:NB] (written by the kernel that produced y)."""
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NB_P2)
    amax = tl.max(tl.load(part_ptr + r * NB + j, mask=j < NB, other=0.0), axis=0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < K
    y = tl.load(y_ptr + r * y_stride + cols, mask=m, other=0.0)
    quantize_store(y, amax, q_ptr + r * q_stride + cols, s_ptr + r, m)


@triton.jit
def _quantize_rows_kernel(x_ptr, x_stride, q_ptr, q_stride, s_ptr, K, BLOCK: tl.constexpr,
                          PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < K
    x = tl.load(x_ptr + r * x_stride + cols, mask=m, other=0.0).to(tl.float32)
    quantize_store(x, tl.max(tl.abs(x), axis=0), q_ptr + r * q_stride + cols, s_ptr + r, m)


@triton.jit
def _apply_scales_kernel(y_ptr, y_stride, rs_ptr, cs_ptr, b_ptr, out_ptr, out_stride, N,
                         BLOCK: tl.constexpr, COL: tl.constexpr, HAS_BIAS: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    y = tl.load(y_ptr + r * y_stride + cols, mask=m, other=0.0).to(tl.float32) * tl.load(rs_ptr + r)
    if COL:
        y = y * tl.load(cs_ptr + cols, mask=m, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def row_warps(block: int) -> int:
    return min(16, max(1, block // 1024))


def quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """x [M, K] (unit stride along K) float -> Fp8Rows, one program per row."""
    if x.dim() != 2 or x.stride(1) != 1 or not x.is_floating_point():
        raise ValueError(f"x: expected a floating [M, K] tensor with unit stride along K, got "
                         f"{tuple(x.shape)} {x.dtype} strides {x.stride()}")
    m, k = x.shape
    out = new_rows(m, k, x.device)
    if m:
        block, pdl = triton.next_power_of_2(k), use_pdl(x)
        _quantize_rows_kernel[(m,)](x, x.stride(0), out.data, out.data.stride(0), out.scale, k,
                                    BLOCK=block, PDL=pdl, num_warps=row_warps(block), **pdl_options(pdl))
    return out


def quantize_tiles(y: torch.Tensor, partial_amax: torch.Tensor, block: int) -> Fp8Rows:
    """y [M, K] float32 (contiguous) with partial_amax [M, ceil(K / block)] float32 (the amax of
    each block-wide tile of each row) -> Fp8Rows; grid (M, K / block), so a row's quantization
    is spread over many programs (the producer's partial amaxes make one pass enough)."""
    m, k = y.shape
    nb = triton.cdiv(k, block)
    if y.dtype != torch.float32 or not y.is_contiguous() or tuple(partial_amax.shape) != (m, nb) \
            or not partial_amax.is_contiguous():
        raise ValueError(f"y, partial_amax: expected contiguous float32 [M, K] and [M, {nb}], got "
                         f"{tuple(y.shape)} {y.dtype} and {tuple(partial_amax.shape)}")
    out = new_rows(m, k, y.device)
    if m and k:
        pdl = use_pdl(y)
        _quantize_tiles_kernel[(m, nb)](y, y.stride(0), partial_amax, out.data, out.data.stride(0),
                                        out.scale, k, nb, BLOCK=block, NB_P2=triton.next_power_of_2(nb),
                                        PDL=pdl, num_warps=4, **pdl_options(pdl))
    return out


def apply_scales(a: ScaledAcc, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """ScaledAcc -> [M, N] in acc's dtype (unless `out`): acc * row_scale * col_scale (+ bias)."""
    m, n = a.acc.shape
    check_scaled("a", a, m, n)
    if out is None:
        out = torch.empty((m, n), dtype=a.acc.dtype, device=a.acc.device)
    if m and n:
        block, pdl = min(4096, triton.next_power_of_2(n)), use_pdl(a.acc)
        _apply_scales_kernel[(m, triton.cdiv(n, block))](
            a.acc, a.acc.stride(0), a.row_scale, a.row_scale if a.col_scale is None else a.col_scale,
            a.bias if a.bias is not None else a.row_scale, out, out.stride(0), n,
            BLOCK=block, COL=a.col_scale is not None, HAS_BIAS=a.bias is not None, PDL=pdl, num_warps=4, **pdl_options(pdl))
    return out


__all__ = ["FP8", "FP8_MAX", "ROW_ALIGN", "SCALE_FLOOR", "Fp8Rows", "ScaledAcc", "apply_scales", "check_scaled",
           "new_rows", "padded_rows", "quantize_rows", "quantize_store", "quantize_tiles", "round_e4m3", "row_warps"]
