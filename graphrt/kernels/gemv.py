"""Small-batch GEMM (GEMV-like) for decode: y[M, N] = x[M, K] @ w[N, K]^T (+ bias), M <= 16.

At decode batch sizes the weight read is the whole cost, and cuBLAS pays a fixed ramp per call
(docs/NOTES.md, shared model-step profile). This kernel streams w once: program n reads rows
[n * BLOCK_N, +BLOCK_N) of w in BLOCK_K-wide tiles (16-byte loads along K, the contiguous dim),
multiplies them by all M rows of x and writes the [M, BLOCK_N] tile. No split-K (that needs a
second launch or atomics); parallelism comes from small BLOCK_N. Whether it beats cuBLAS is
measured per (shape, batch) at capture time by `graphrt.model.linear.Linear.choose`.
`gemv` (model-dtype weights) and `gemv_fp8` (e4m3 weights, per-channel or block scales) launch
one kernel body (`_gemv_kernel`). The decoder's FP8 path no longer uses it for per-tensor /
per-channel weights (W8A8 through cuBLASLt measured faster: docs/fp8.md); it serves
block-scaled weights and callers that pass float activations.

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


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
         config: GemvConfig = CANDIDATES[1], out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T (+ bias).

    x [M, K] (M <= 16), w [N, K] row-major, bias [N] or None, all one dtype and device; returns
    (or writes into `out`) [M, N] in x's dtype. Accumulates in float32. Capturable.
    """
    n, k = w.shape[0], w.shape[1] if w.dim() == 2 else -1
    m = x.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x: {m} rows, the GEMV kernel takes 1..{MAX_M}")
    if w.dim() != 2 or w.stride(1) != 1 or x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"w: expected a row-major [N, K] weight and x [M, K] with unit "
                         f"column stride, got w {tuple(w.shape)} strides {w.stride()}, x {tuple(x.shape)} "
                         f"strides {x.stride()}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias: expected [{n}], got {tuple(bias.shape)}")
    y = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    _launch(x, w, w, bias, y, k, config, grid_m=1)
    return y


def _launch(x, w, scale, bias, y, k, c: GemvConfig, *, grid_m: int, block=None, scaled=False) -> None:
    """The one launch of `_gemv_kernel` (placeholders for the pointers a flag leaves unread)."""
    m, n = x.shape[0], w.shape[0]
    sbn, sbk = block if block is not None else (1, 1)
    _gemv_kernel[(grid_m, triton.cdiv(n, c.block_n))](
        x, w, scale, bias if bias is not None else scale, y,
        m, n, k, x.stride(0), w.stride(0), scale.stride(0) if scaled else 0, y.stride(0),
        BLOCK_M=MAX_M, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        SCALE_BN=sbn, SCALE_BK=sbk, SCALED=scaled, BLOCKWISE=block is not None,
        HAS_BIAS=bias is not None, DOT_F32=x.device.type != "cuda",
        num_warps=c.num_warps, num_stages=c.num_stages)


# ---- one kernel body: model-dtype weights, and FP8 weights (e4m3) dequantized in registers -----
# The same streaming scheme for both; an FP8 weight tile is loaded as 1 byte/element and
# converted to the activation dtype before tl.dot (a no-op for model-dtype weights, SCALED=False). Per-channel scales multiply the finished [BM, BN] tile once;
# block scales ((bn, bk), e.g. 128 x 128) multiply each BLOCK_K tile's partial sum, so BLOCK_K
# must divide bk. The grid's first axis covers M > 16 in tiles of 16 rows (the tiles of one
# weight tile are consecutive programs, so the weight is read from DRAM about once).
# (first: the default, valid for 128-column scale blocks; block_k 256 / 512: per-channel only
# at bk = 128 -- Linear.choose filters them)
FP8_CANDIDATES = (GemvConfig(16, 128, 4, 4), GemvConfig(32, 128, 4, 4), GemvConfig(16, 256, 4, 3),
                  GemvConfig(64, 128, 8, 4), GemvConfig(16, 512, 4, 3), GemvConfig(32, 256, 8, 3))


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_s,
                 stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, SCALED: tl.constexpr,
                 BLOCKWISE: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr):
    """See `gemv` / `gemv_fp8`.
    DOT_F32: both dot operands in float32 (the CPU interpreter's tl.dot multiplies bf16's raw
    uint16 storage, Triton 3.9; the values are the same: x is rounded to its dtype first)."""
    pid_m = tl.program_id(0)          # M tiles vary fastest: they share a weight tile in L2
    pid_n = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    x_rows = x_ptr + rm[:, None] * stride_x
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        w = tl.load(w_ptr + rn[:, None] * stride_w + (k0 + rk)[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)          # [BN, BK] fp8
        x_mask = m_ok[:, None] & k_ok[None, :]
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=x_mask, other=0.0)   # [BM, BK]
        if DOT_F32:
            part = tl.dot(x.to(tl.float32), tl.trans(w.to(x.dtype).to(tl.float32)), out_dtype=tl.float32)
        else:
            part = tl.dot(x, tl.trans(w.to(x.dtype)), out_dtype=tl.float32)
        if BLOCKWISE:
            s = tl.load(s_ptr + (rn // SCALE_BN) * stride_s + k0 // SCALE_BK, mask=n_ok, other=0.0)
            acc += part * s[None, :]
        else:
            acc += part
    if SCALED and not BLOCKWISE:
        acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_at = y_ptr + rm[:, None] * stride_y + rn[None, :]
    y_mask = m_ok[:, None] & n_ok[None, :]
    tl.store(y_at, acc.to(y_ptr.dtype.element_ty), mask=y_mask)


def gemv_fp8(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
             *, block: tuple[int, int] | None = None, config: GemvConfig = FP8_CANDIDATES[0],
             out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ (w * scale).T (+ bias) with FP8 weights dequantized in registers.

    x [M, K] bfloat16 / float16 / float32; w [N, K] float8_e4m3fn row-major; scale float32 [N]
    (per-channel, block=None) or [ceil(N/bn), ceil(K/bk)] (block=(bn, bk)); bias [N] or None.
    Returns (or writes into `out`) [M, N] in x's dtype; float32 accumulation. Any M (grid
    tiles of 16 rows); capturable.
    """
    m, k = x.shape
    n = w.shape[0]
    if w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w: expected torch.float8_e4m3fn, got {w.dtype}")
    if m < 1:
        raise ValueError(f"x: {m} rows, expected at least 1")
    if w.dim() != 2 or w.shape[1] != k or w.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"w: expected a row-major [N, {k}] weight, got {tuple(w.shape)} "
                         f"strides {w.stride()}; x strides {x.stride()}")
    want = (n,) if block is None else (-(-n // block[0]), -(-k // block[1]))
    if scale.dtype != torch.float32 or tuple(scale.shape) != want or scale.stride(-1) != 1:
        raise ValueError(f"scale: expected contiguous float32 {want}, got {scale.dtype} "
                         f"{tuple(scale.shape)}")
    c = config
    if block is not None and block[1] % c.block_k:
        raise ValueError(f"config: block_k={c.block_k} must divide the scale block's {block[1]} columns")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias: expected [{n}], got {tuple(bias.shape)}")
    y = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    _launch(x, w, scale, bias, y, k, c, grid_m=triton.cdiv(m, MAX_M), block=block, scaled=True)
    return y
