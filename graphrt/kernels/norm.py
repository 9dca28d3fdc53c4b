"""RMSNorm, plain and fused with the residual add: one program per row, float32 math.

    rms_norm(x, w, eps)               out = x / sqrt(mean(x^2) + eps) * w
    add_rms_norm(x, residual, w, eps) residual += x (stored in residual's dtype), then
                                      out = rms_norm(residual, w, eps) of the stored residual
    embed_rms_norm(table, ids, w, eps) out = rms_norm(table[max(ids, 0)], w, eps): the embedding
                                      rows gathered as they are loaded (negative ids: padding, row 0)

x, residual, out: [T, H] with unit stride along H (rows may be strided); w: [H]. float32 or
bfloat16/float16 in and out; the sum, mean and scaling run in float32 with one rounding at the
store. The residual is normalised as stored (rounded), as HF's decoder layers do.

FP8 (W8A8 decode GEMMs, kernels/fp8.py):
- x may be a `ScaledAcc` (an FP8 GEMM's unscaled output): x = acc * row_scale * col_scale is
  formed in float32 as it is loaded (o / down projections feeding the residual add).
- `fp8=True`: the normed row is written as e4m3 with its own scale (amax / 448) and the call
  returns `Fp8Rows` (the input of the next FP8 GEMM); the normed row is never stored in float.

Split-K (kernels/splitk.py): x may be a `SplitAcc` (an o / down GEMM run as S partial sums,
float or FP8): each element of x is the sum of its S strided partials, formed in float32 as it
is loaded (partials 0 .. S-1 left to right, then the FP8 row and column scales), before the same
residual add and norm. S = 1 is the plain / ScaledAcc load.

Capturable in a CUDA graph (no host reads); runs on CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl
from graphrt.kernels.fp8 import Fp8Rows, ScaledAcc, check_scaled, new_rows, quantize_store
from graphrt.kernels.splitk import SplitAcc, check_split


@triton.jit
def _rms_norm_kernel(x_ptr, x_stride, rs_ptr, cs_ptr, res_ptr, res_stride, w_ptr, out_ptr,
                     out_stride, os_ptr, ids_ptr, ids_stride, copy_ptr, copy_stride, H, eps, BLOCK: tl.constexpr,
                     ADD: tl.constexpr, X_SCALED: tl.constexpr, X_COL: tl.constexpr, FP8_OUT: tl.constexpr,
                     SPLIT: tl.constexpr, GATHER: tl.constexpr, STORE_RES: tl.constexpr, COPY: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    # x[r, c] = sum_s acc[SPLIT * r + s, SPLIT * c + s] (SPLIT = 1: the row itself); GATHER: row
    # max(ids[r], 0) of a table
    src = r
    if GATHER:
        src = tl.maximum(tl.load(ids_ptr + r * ids_stride), 0).to(tl.int64)
    x_row = x_ptr + src * SPLIT * x_stride + cols * SPLIT
    x = tl.load(x_row, mask=m, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLIT):
        x += tl.load(x_row + s * x_stride + s, mask=m, other=0.0).to(tl.float32)
    if X_SCALED:
        x = x * tl.load(rs_ptr + r)
        if X_COL:
            x = x * tl.load(cs_ptr + cols, mask=m, other=0.0)
    if ADD:
        res = tl.load(res_ptr + r * res_stride + cols, mask=m, other=0.0).to(tl.float32)
        s = (x + res).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + r * res_stride + cols, s, mask=m)
        x = s.to(tl.float32)
    if STORE_RES:  # GATHER: the gathered row is the residual stream's start
        tl.store(res_ptr + r * res_stride + cols, x.to(res_ptr.dtype.element_ty), mask=m)
    if COPY:       # the residual stream as stored, once more (an EAGLE-3 head's recorded state)
        tl.store(copy_ptr + r * copy_stride + cols, x.to(copy_ptr.dtype.element_ty), mask=m)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    if FP8_OUT:   # amax(|x * w|) reduces alongside sum(x^2): y's amax is inv times it
        xw = x * w
        quantize_store(xw * inv, tl.max(tl.abs(xw), axis=0) * inv, out_ptr + r * out_stride + cols,
                       os_ptr + r, m)
    else:
        y = x * inv * w
        tl.store(out_ptr + r * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def _check(name: str, t: torch.Tensor, h: int) -> None:
    if t.dim() != 2 or t.shape[1] != h or t.stride(1) != 1:
        raise ValueError(f"{name}: expected [T, {h}] with unit stride along H, got "
                         f"{tuple(t.shape)} strides {t.stride()}")


def _launch(x, residual, weight, eps, out, fp8, *, ids=None, copy_to=None):
    """ids None: x [T, H] (a tensor, ScaledAcc or SplitAcc), residual (optional) added into in
    place. ids [T]: x is a [V, H] table whose rows ids gather; residual (optional) receives them.
    copy_to (optional) [T, H]: the residual stream once more (after the add, or the gathered rows)."""
    if weight.dim() != 1 or not weight.is_contiguous():
        raise ValueError(f"weight: expected a contiguous [H] tensor, got {tuple(weight.shape)}")
    h = weight.shape[0]
    split = 1
    if ids is not None:
        _check("table", x, h)
        if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or ids.device != x.device:
            raise ValueError(f"ids: expected a [T] int32 / int64 tensor on {x.device}, got "
                             f"{tuple(ids.shape)} {ids.dtype} on {ids.device}")
        acc, t, rs, cs = x, ids.shape[0], None, None
    elif isinstance(x, SplitAcc):
        check_split("x", x, h)
        acc, t, split = x.acc, x.rows, x.split
        rs, cs = x.row_scale, x.col_scale
    elif isinstance(x, ScaledAcc):
        check_scaled("x", x, x.acc.shape[0], h)
        if x.bias is not None:
            raise ValueError("x: a ScaledAcc with a bias is not read here (o / down have none)")
        acc, t, rs, cs = x.acc, x.acc.shape[0], x.row_scale, x.col_scale
    else:
        _check("x", x, h)
        acc, t, rs, cs = x, x.shape[0], None, None
    scaled, col = rs is not None, cs is not None
    rs = weight if rs is None else rs                                # unread placeholders
    cs = rs if cs is None else cs
    if fp8:
        if out is not None:
            raise ValueError("out: not taken with fp8=True (the call returns new Fp8Rows)")
        rows = new_rows(t, h, acc.device)
        dst, dst_stride, dst_scale = rows.data, rows.data.stride(0), rows.scale
    else:
        if out is None:
            out = torch.empty((t, h), dtype=acc.dtype, device=acc.device)
        _check("out", out, h)
        if out.shape[0] != t:
            raise ValueError(f"out: {out.shape[0]} rows, x has {t}")
        dst, dst_stride, dst_scale = out, out.stride(0), weight
    res = acc if residual is None else residual
    for name, tt in (("residual", residual), ("copy_to", copy_to)):
        if tt is not None:
            _check(name, tt, h)
            if tt.shape[0] != t:
                raise ValueError(f"{name}: {tt.shape[0]} rows, x has {t}")
    cp = dst if copy_to is None else copy_to
    if t:
        block, pdl = triton.next_power_of_2(h), use_pdl(acc)
        _rms_norm_kernel[(t,)](acc, acc.stride(0), rs, cs, res, res.stride(0), weight, dst, dst_stride,
                               dst_scale, weight if ids is None else ids,
                               0 if ids is None else (ids.stride(0) if t > 1 else 1), cp, cp.stride(0),
                               h, float(eps), BLOCK=block, ADD=residual is not None and ids is None,
                               X_SCALED=scaled, X_COL=col, FP8_OUT=fp8, SPLIT=split, GATHER=ids is not None,
                               STORE_RES=residual is not None and ids is not None, COPY=copy_to is not None,
                               PDL=pdl, num_warps=min(16, max(1, block // 512)), **pdl_options(pdl))
    return rows if fp8 else out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None,
             fp8: bool = False) -> torch.Tensor | Fp8Rows:
    """x [T, H] -> out [T, H] (x's dtype unless `out` is given): x * rsqrt(mean(x^2) + eps) * w;
    with fp8=True, Fp8Rows of it (data [padded T, H] e4m3, scale [T])."""
    return _launch(x, None, weight, eps, out, fp8)


def add_rms_norm(x: torch.Tensor | ScaledAcc | SplitAcc, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, *, out: torch.Tensor | None = None, fp8: bool = False,
                 copy_to: torch.Tensor | None = None) -> torch.Tensor | Fp8Rows:
    """residual [T, H] += x [T, H] (a tensor, a ScaledAcc or a SplitAcc) in place; returns
    rms_norm(residual) (residual's dtype unless `out`; Fp8Rows with fp8=True). copy_to: an
    optional [T, H] (rows may be strided) that receives the new residual too (a recorded state)."""
    return _launch(x, residual, weight, eps, out, fp8, copy_to=copy_to)


def embed_rms_norm(table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, eps: float, *,
                   out: torch.Tensor | None = None, fp8: bool = False, residual: torch.Tensor | None = None,
                   copy_to: torch.Tensor | None = None) -> torch.Tensor | Fp8Rows:
    """rms_norm(table[ids.clamp_min(0)]) in one launch, the rows gathered as they are loaded.

    table [V, H] (unit stride along H) float32 / bfloat16 / float16; ids [T] int32 / int64, any
    stride, on table's device (< V; negative = a padding row: row 0 is read, its output unused);
    weight [H]; out [T, H] (table's dtype unless given; rows may be strided), or Fp8Rows with
    fp8=True. residual / copy_to: optional [T, H] that receive the gathered rows themselves (a
    decoder's residual stream starts there; a recorded state). Returns out. Capturable; the same
    values as the gather then `rms_norm` (the same row is loaded)."""
    return _launch(table, residual, weight, eps, out, fp8, ids=ids, copy_to=copy_to)


__all__ = ["rms_norm", "add_rms_norm", "embed_rms_norm"]
