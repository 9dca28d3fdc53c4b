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

Capturable in a CUDA graph (no host reads); runs on CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_FLOOR = 1e-12          # an all-zero row gets scale 1e-12 (data 0)
ROW_ALIGN = 16               # FP8 GEMM operand rows are padded to this


def padded_rows(m: int) -> int:
    return -(-m // ROW_ALIGN) * ROW_ALIGN


@dataclass(frozen=True)
class Fp8Rows:
    """Row-quantized activations: row r of x is data[r].float() * scale[r].
    data [padded_rows(M), K] float8_e4m3fn (rows >= M unwritten), scale [M] float32, one device."""
    data: torch.Tensor
    scale: torch.Tensor

    @property
    def rows(self) -> int:
        return self.scale.shape[0]

    def dequantize(self) -> torch.Tensor:
        """[M, K] float32 (the reference)."""
        return self.data[: self.rows].float() * self.scale[:, None]


@dataclass(frozen=True)
class ScaledAcc:
    """An FP8 GEMM's output before its scales: value[m, n] = acc[m, n] * row_scale[m] *
    col_scale[n] (+ bias[n]). acc [M, N] (model dtype, unit stride along N), row_scale [M]
    float32, col_scale [N] float32 or None (a per-tensor weight scale, applied by the GEMM),
    bias [N] (model dtype) or None."""
    acc: torch.Tensor
    row_scale: torch.Tensor
    col_scale: torch.Tensor | None
    bias: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.acc.shape

    def reference(self) -> torch.Tensor:
        """[M, N] float32 (torch)."""
        y = self.acc.float() * self.row_scale[:, None]
        if self.col_scale is not None:
            y = y * self.col_scale[None, :]
        return y if self.bias is None else y + self.bias.float()


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


def new_rows(m: int, k: int, device) -> Fp8Rows:
    """Uninitialised Fp8Rows for M rows of K (data rows padded; no kernel launched)."""
    return Fp8Rows(torch.empty((padded_rows(m), k), dtype=FP8, device=device),
                   torch.empty((m,), dtype=torch.float32, device=device))


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


def check_scaled(name: str, a: ScaledAcc, rows: int, cols: int) -> None:
    """ValueError naming `name` unless `a` is a ScaledAcc of [rows, cols] with matching scales."""
    ok = (isinstance(a, ScaledAcc) and a.acc.dim() == 2 and tuple(a.acc.shape) == (rows, cols)
          and a.acc.stride(1) == 1 and a.row_scale.dtype == torch.float32
          and tuple(a.row_scale.shape) == (rows,)
          and (a.col_scale is None or (a.col_scale.dtype == torch.float32 and a.col_scale.is_contiguous()
                                       and tuple(a.col_scale.shape) == (cols,)))
          and (a.bias is None or tuple(a.bias.shape) == (cols,)))
    if not ok:
        got = (tuple(a.acc.shape), tuple(a.row_scale.shape),
               None if a.col_scale is None else tuple(a.col_scale.shape)) \
            if isinstance(a, ScaledAcc) else type(a).__name__
        raise ValueError(f"{name}: expected a ScaledAcc of acc [{rows}, {cols}] (unit column stride), "
                         f"row_scale [{rows}] and col_scale [{cols}] (or None) float32, got {got}")


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


__all__ = ["FP8", "FP8_MAX", "Fp8Rows", "ScaledAcc", "apply_scales", "check_scaled", "new_rows",
           "padded_rows", "quantize_rows", "quantize_store", "quantize_tiles", "round_e4m3", "row_warps"]
