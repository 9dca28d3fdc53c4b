"""RMSNorm, plain and fused with the residual add: one program per row, float32 math.

    rms_norm(x, w, eps)               out = x / sqrt(mean(x^2) + eps) * w
    add_rms_norm(x, residual, w, eps) residual += x (stored in residual's dtype), then
                                      out = rms_norm(residual, w, eps) of the stored residual

x, residual, out: [T, H] with unit stride along H (rows may be strided); w: [H]. float32 or
bfloat16/float16 in and out; the sum, mean and scaling run in float32 with one rounding at the
store. The residual is normalised as stored (rounded), as HF's decoder layers do. Capturable
in a CUDA graph (no host reads); runs on CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, x_stride, res_ptr, res_stride, w_ptr, out_ptr, out_stride, H, eps,
                     BLOCK: tl.constexpr, ADD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    x = tl.load(x_ptr + r * x_stride + cols, mask=m, other=0.0).to(tl.float32)
    if ADD:
        res = tl.load(res_ptr + r * res_stride + cols, mask=m, other=0.0).to(tl.float32)
        s = (x + res).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + r * res_stride + cols, s, mask=m)
        x = s.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * out_stride + cols, (x * inv * w).to(out_ptr.dtype.element_ty), mask=m)


def _check(name: str, t: torch.Tensor, h: int) -> None:
    if t.dim() != 2 or t.shape[1] != h or t.stride(1) != 1:
        raise ValueError(f"{name}: expected [T, {h}] with unit stride along H, got "
                         f"{tuple(t.shape)} strides {t.stride()}")


def _launch(x, residual, weight, eps, out):
    if weight.dim() != 1 or not weight.is_contiguous():
        raise ValueError(f"weight: expected a contiguous [H] tensor, got {tuple(weight.shape)}")
    h = weight.shape[0]
    _check("x", x, h)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _check("out", out, h)
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"out: {out.shape[0]} rows, x has {x.shape[0]}")
    res = x if residual is None else residual
    if residual is not None:
        _check("residual", residual, h)
        if residual.shape[0] != x.shape[0]:
            raise ValueError(f"residual: {residual.shape[0]} rows, x has {x.shape[0]}")
    if x.shape[0] == 0:
        return out
    block = triton.next_power_of_2(h)
    _rms_norm_kernel[(x.shape[0],)](x, x.stride(0), res, res.stride(0), weight, out, out.stride(0),
                                    h, float(eps), BLOCK=block, ADD=residual is not None,
                                    num_warps=min(16, max(1, block // 512)))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H] -> out [T, H] (x's dtype unless `out` is given): x * rsqrt(mean(x^2) + eps) * w."""
    return _launch(x, None, weight, eps, out)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """residual [T, H] += x [T, H] in place; returns rms_norm(residual) (x's dtype unless `out`)."""
    return _launch(x, residual, weight, eps, out)


__all__ = ["rms_norm", "add_rms_norm"]
