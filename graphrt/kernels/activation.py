"""SiLU-and-mul for the SwiGLU MLP: [T, 2I] (gate columns, then up columns) -> [T, I].

out[t, j] = silu(x[t, j]) * x[t, I + j], float32 math, one rounding at the store. Grid:
(T, ceil(I / BLOCK)). Capturable in a CUDA graph; runs on CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # columns per program


@triton.jit
def _silu_mul_kernel(x_ptr, x_stride, out_ptr, out_stride, I, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(x_ptr + r * x_stride + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + r * x_stride + I + cols, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + r * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] (unit stride along columns) -> out [T, I] in x's dtype unless `out` is given."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"x: expected [T, 2I] with unit column stride, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    t, i = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((t, i), dtype=x.dtype, device=x.device)
    if out.dim() != 2 or tuple(out.shape) != (t, i) or out.stride(1) != 1:
        raise ValueError(f"out: expected [{t}, {i}] with unit column stride, got {tuple(out.shape)}")
    if t == 0 or i == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(i))
    _silu_mul_kernel[(t, triton.cdiv(i, block))](x, x.stride(0), out, out.stride(0), i,
                                                 BLOCK=block, num_warps=4)
    return out


__all__ = ["silu_mul"]
