"""The types graphrt's FP8 (e4m3) activation kernels exchange, without Triton (kernels/fp8.py runs them).

    Fp8Rows(data, scale)                       # row-quantized activations: row r = data[r] * scale[r]
    ScaledAcc(acc, row_scale, col_scale, bias)  # an FP8 GEMM's output before its scales

The model's layer loop tests for these types on every path (model/llama.py, model/linear.py), so
they live apart from the kernels: a model on the torch kernel set imports no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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


def new_rows(m: int, k: int, device) -> Fp8Rows:
    """Uninitialised Fp8Rows for M rows of K (data rows padded; no kernel launched)."""
    return Fp8Rows(torch.empty((padded_rows(m), k), dtype=FP8, device=device),
                   torch.empty((m,), dtype=torch.float32, device=device))


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


__all__ = ["FP8", "FP8_MAX", "SCALE_FLOOR", "ROW_ALIGN", "Fp8Rows", "ScaledAcc", "check_scaled", "new_rows",
           "padded_rows"]
