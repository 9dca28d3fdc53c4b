"""A GEMM's output in split-K form (`SplitAcc`), summed by the kernel that reads it.

x [M, K] @ W[N, K].T equals one GEMM over two free views, S | K:

    x.view(S*M, K/S)   row S*m + s = x[m, s*K/S : (s+1)*K/S]
    W.view(S*N, K/S)   row S*n + s = W[n, s*K/S : (s+1)*K/S]
    Y' = x' @ W'.T     [S*M, S*N];   Y[m, n] = sum_{s < S} Y'[S*m + s, S*n + s]

Same weight bytes, S x the output tiles for cuBLAS(Lt) to spread over the SMs at decode row
counts (the off-diagonal partials Y'[S*m + s, S*n + t], s != t, are computed and never read).
The sum is left to the consumer, which reads the S strided partials of each output element as
it loads (add + RMSNorm, kernels/norm.py): no reduce launch. model/splitk.py makes the GEMMs and
chooses S.

One representation for float and W8A8 FP8 GEMMs: `SplitAcc` carries the partials plus, for an
FP8 GEMM, the activation row scales and the weight column scales (as `ScaledAcc` does for an
unsplit FP8 GEMM). Value of output element (m, n), in float32, in this order:

    y = p_0 + p_1 + ... + p_{S-1}        p_s = float32(acc[S*m + s, S*n + s]), left to right
    y = y * row_scale[m]                 (FP8)
    y = y * col_scale[n]                 (FP8, per-channel weight; per-tensor: applied by the GEMM)

With S = 1 this is exactly ScaledAcc's (and a plain tensor's) load. Each partial is rounded once
to acc's dtype by the GEMM (the unsplit GEMM rounds the whole sum once instead).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SplitAcc:
    """A GEMM's [M, N] output as S partial sums (see the module docstring).

    acc [>= S*M, S*N] (the GEMM's dtype, unit stride along columns; rows >= S*M are padding
    and never read), split S >= 1, rows M; row_scale [M] float32 or None (a float GEMM);
    col_scale [N] float32 (contiguous) or None."""
    acc: torch.Tensor
    split: int
    rows: int
    row_scale: torch.Tensor | None = None
    col_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.acc.shape[1] // self.split

    def reference(self) -> torch.Tensor:
        """[M, N] float32 (torch), in the summation order of the module docstring."""
        s, (m, n) = self.split, self.shape
        part = self.acc[: s * m].float().view(m, s, n, s)            # [m, s, n, t]
        y = part[:, 0, :, 0]
        for i in range(1, s):
            y = y + part[:, i, :, i]
        if self.row_scale is not None:
            y = y * self.row_scale[:, None]
        if self.col_scale is not None:
            y = y * self.col_scale[None, :]
        return y


def check_split(name: str, a: SplitAcc, cols: int) -> None:
    """ValueError naming `name` unless `a` is a consistent SplitAcc of N = cols outputs."""
    ok = isinstance(a, SplitAcc) and isinstance(a.split, int) and a.split >= 1 and a.rows >= 0
    if ok:
        s, m = a.split, a.rows
        ok = (a.acc.dim() == 2 and a.acc.stride(1) == 1 and a.acc.shape[1] == s * cols
              and a.acc.shape[0] >= s * m
              and (a.row_scale is None or (a.row_scale.dtype == torch.float32
                                           and tuple(a.row_scale.shape) == (m,)))
              and (a.col_scale is None or (a.row_scale is not None and a.col_scale.dtype == torch.float32
                                           and a.col_scale.is_contiguous()
                                           and tuple(a.col_scale.shape) == (cols,))))
    if not ok:
        got = (f"acc {tuple(a.acc.shape)} strides {a.acc.stride()}, split {a.split!r}, rows {a.rows!r}, "
               f"row_scale {None if a.row_scale is None else tuple(a.row_scale.shape)}, col_scale "
               f"{None if a.col_scale is None else tuple(a.col_scale.shape)}") \
            if isinstance(a, SplitAcc) else type(a).__name__
        raise ValueError(f"{name}: expected a SplitAcc of acc [>= S*M, S*{cols}] (unit column stride), "
                         f"split S >= 1, row_scale [M] float32 or None, col_scale [{cols}] float32 "
                         f"or None (only with row_scale), got {got}")


__all__ = ["SplitAcc", "check_split"]
