"""Small-batch GEMM (GEMV-like) for decode: y[M, N] = x[M, K] @ w[N, K]^T (+ bias), M <= 16.

At decode batch sizes the weight read is the whole cost, and cuBLAS pays a fixed ramp per call
(docs/NOTES.md, shared model-step profile). This kernel streams w once: program n reads rows
[n * BLOCK_N, +BLOCK_N) of w in BLOCK_K-wide tiles (16-byte loads along K, the contiguous dim),
multiplies them by all M rows of x and writes the [M, BLOCK_N] tile. No split-K (that needs a
second launch or atomics); parallelism comes from small BLOCK_N. Whether it beats cuBLAS is
measured per (shape, batch) at capture time by `graphrt.model.linear.Linear.choose`.

Runs on CPU tensors under TRITON_INTERPRET=1 (tests compare it with float32 torch).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_M = 16


@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration; `name` is what capture reports and the graph cache records."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return f"triton-gemv-n{self.block_n}-k{self.block_k}-w{self.num_warps}-s{self.num_stages}"


# candidates timed at capture on a GPU (small set: each one is a compiled kernel in the cache)
# (tl.dot needs every block dim >= 16)
CANDIDATES = (GemvConfig(16, 512, 4, 3), GemvConfig(16, 256, 4, 4), GemvConfig(32, 256, 4, 3),
              GemvConfig(64, 128, 8, 4))


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        w = tl.load(w_ptr + rn[:, None] * stride_w + (k0 + rk)[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)          # [BN, BK]
        x = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)          # [BM, BK]
        acc += tl.dot(x, tl.trans(w), out_dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_y + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
         config: GemvConfig = CANDIDATES[1], out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T (+ bias).

    x [M, K] (M <= 16), w [N, K] row-major, bias [N] or None, all one dtype and device; returns
    (or writes into `out`) [M, N] in x's dtype. Accumulates in float32. Capturable.
    """
    m, k = x.shape
    n = w.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x: {m} rows, the GEMV kernel takes 1..{MAX_M}")
    if w.shape[1] != k or w.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"w: expected a row-major [N, {k}] weight, got {tuple(w.shape)} "
                         f"strides {w.stride()}; x strides {x.stride()}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias: expected [{n}], got {tuple(bias.shape)}")
    y = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    c = config
    _gemv_kernel[(triton.cdiv(n, c.block_n),)](
        x, w, bias if bias is not None else w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=MAX_M, BLOCK_N=c.block_n, BLOCK_K=c.block_k, HAS_BIAS=bias is not None,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return y
