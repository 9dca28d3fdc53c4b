"""W4A16 GEMV for decode: y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W in graphrt's int4 layout.

    y = gemv_int4(x, qweight, scale, group_size, zero=zero, perm=perm, bias=bias)   # any M; best M <= 16
    w = dequantize_int4(qweight, scale, group_size, zero=zero, dtype=torch.bfloat16)  # [N, K] (prefill M)

The layout (graphrt/model/quant/int4.py): qweight int32 [N, K/8], nibble i of word c = code of
stored column 8c + i; scale [N, G] (fp16 / bf16 / fp32), zero uint8 [N, G] or None (zero 8),
perm int32 [K] or None (act-order: stored column j multiplies x[:, perm[j]]); G = K / group_size.

The same streaming scheme as graphrt/kernels/gemv.py (the model-dtype / FP8 GEMV body), as its
int4 family: program (m, n, s) reads rows [n * BLOCK_N, +BLOCK_N) of the packed weight in BLOCK_K
wide tiles (BLOCK_K / 8 int32 words per row: 64 bytes at BLOCK_K = 128), unpacks the codes in
registers (`int4_tile`: q - zero, small integers exact in bf16 / fp16), multiplies them by its
rows of x (up to 16 with tl.dot, float32 accumulation; or 1 / 2 / 4 rows in float32 FMAs,
config.block_m) and scales each BLOCK_K tile's partial sum by its
group's scale (BLOCK_K divides the group size, so a tile lies in one group). Scales and zeros
are streamed with the codes (one [BLOCK_N] load per tile). Split-K (config.split_k = S > 1, for
small N where N / BLOCK_N programs under-fill the GPU): program s covers K range s of S and
writes a float32 partial [S, M, N]; a second small kernel sums the S partials (+ bias) into y.

`int4_tile` is a @triton.jit helper other kernels can call (a persistent decode step's GEMV
tile): it returns the [BLOCK_N, BLOCK_K] tile of q - zero as int32, to be converted to the
activation dtype, multiplied, and scaled per group in float32.

Runs on CPU tensors under TRITON_INTERPRET=1 (tests compare it with float32 torch over the
dequantized weight).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_M = 16                     # rows per program (the grid tiles larger M in 16-row tiles)


@dataclass(frozen=True)
class Int4GemvConfig:
    """One launch configuration. block_k must divide the group size (and be a multiple of 8);
    split_k: K ranges per output tile (1: no split; > 1 adds a float32 workspace and a reduce);
    block_m: activation rows per program: 16 multiplies on the tensor cores (tl.dot, rows padded
    to 16), 1 / 2 / 4 in float32 FMAs with a reduction along K (no padding; the grid tiles M)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    block_m: int = 16

    @property
    def name(self) -> str:
        return (f"triton-gemv-int4-n{self.block_n}-k{self.block_k}-w{self.num_warps}-s{self.num_stages}"
                f"-split{self.split_k}" + ("" if self.block_m == MAX_M else f"-m{self.block_m}"))


# timed on a GPU by tools/bench_e2e.py --int4-kernels; default_config picks one without timing
CANDIDATES = (Int4GemvConfig(16, 128, 4, 4), Int4GemvConfig(32, 128, 4, 4), Int4GemvConfig(64, 128, 4, 4),
              Int4GemvConfig(64, 128, 8, 3), Int4GemvConfig(128, 128, 8, 4), Int4GemvConfig(16, 128, 4, 4, 2),
              Int4GemvConfig(16, 128, 4, 4, 4), Int4GemvConfig(32, 128, 4, 4, 2), Int4GemvConfig(32, 64, 4, 4),
              Int4GemvConfig(16, 128, 4, 4, 1, 1), Int4GemvConfig(32, 128, 4, 4, 1, 1),
              Int4GemvConfig(16, 128, 4, 4, 2, 1), Int4GemvConfig(16, 128, 4, 4, 1, 4),
              Int4GemvConfig(16, 128, 4, 4, 2, 4))
TARGET_PROGRAMS = 264          # about 2 programs per SM on a 132-SM H100 / H200


def tile_k(group_size: int) -> int:
    """The largest power of two <= 128 dividing group_size (a BLOCK_K that keeps a tile in one group)."""
    bk = 128
    while group_size % bk:
        bk //= 2
    return bk


def default_config(n: int, k: int, group_size: int) -> Int4GemvConfig:
    """A pure choice: block_k = tile_k(group_size), block_n 32 when that gives at least
    TARGET_PROGRAMS tiles, else 16; split-K (2 or 4, K ranges of whole tiles) when N / block_n
    tiles still fall short of TARGET_PROGRAMS."""
    bk = tile_k(group_size)
    bn = 32 if triton.cdiv(n, 32) >= TARGET_PROGRAMS else 16
    split = 1
    tiles = triton.cdiv(n, bn)
    for s in (2, 4):
        if tiles * split < TARGET_PROGRAMS and k % (s * bk) == 0 and k // (s * bk) >= 4:
            split = s
    return Int4GemvConfig(bn, bk, 4, 4, split)


@triton.jit
def int4_tile(q_ptr, stride_q, z_ptr, stride_z, rn, k0, n_ok, k_ok, group, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, HAS_ZERO: tl.constexpr):
    """[BLOCK_N, BLOCK_K] int32 tile of q - zero for rows rn, stored columns k0 .. k0 + BLOCK_K
    (BLOCK_K divides the group size, which divides K: the tile lies in group k0 // group and
    inside the row). Loads BLOCK_K / 8 words per row
    and unpacks them in registers; masked entries are 0 (rows by n_ok [BN], columns by k_ok [BK])."""
    rw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    words = tl.load(q_ptr + rn[:, None] * stride_q + rw[None, :], mask=n_ok[:, None], other=0)  # [BN, BK/8]
    shifts = tl.arange(0, 8) * 4
    codes = (words[:, :, None] >> shifts[None, None, :]) & 0xF                         # [BN, BK/8, 8]
    codes = tl.reshape(codes, (BLOCK_N, BLOCK_K))
    if HAS_ZERO:
        z = tl.load(z_ptr + rn * stride_z + k0 // group, mask=n_ok, other=0).to(tl.int32)
    else:
        z = tl.full((BLOCK_N,), 8, tl.int32)
    return tl.where(n_ok[:, None] & k_ok[None, :], codes - z[:, None], 0)


@triton.jit(do_not_specialize=["M"])
def _gemv_int4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, p_ptr, b_ptr, y_ptr, M, N, K, group, k_per_split,
                      stride_x, stride_q, stride_s, stride_z, stride_y, stride_ys,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      HAS_ZERO: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
                      PARTIAL: tl.constexpr, DOT_F32: tl.constexpr):
    """PARTIAL: write float32 partial sums to y_ptr + pid_s * stride_ys (split-K workspace),
    no bias. DOT_F32: both dot operands in float32 (the CPU interpreter; see gemv.py)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    x_rows = x_ptr + rm[:, None] * stride_x
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_s * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        if HAS_PERM:
            cols = tl.load(p_ptr + kk, mask=k_ok, other=0)
        else:
            cols = kk
        x = tl.load(x_rows + cols[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)   # [BM, BK]
        w = int4_tile(q_ptr, stride_q, z_ptr, stride_z, rn, k0, n_ok, k_ok, group, BLOCK_N, BLOCK_K,
                      HAS_ZERO)                                                             # [BN, BK]
        if BLOCK_M < 16:              # FMAs: [BM, 1, BK] x [1, BN, BK] summed along K
            part = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        elif DOT_F32:
            part = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), out_dtype=tl.float32)
        else:
            part = tl.dot(x, tl.trans(w.to(x.dtype)), out_dtype=tl.float32)
        s = tl.load(s_ptr + rn * stride_s + k0 // group, mask=n_ok, other=0.0).to(tl.float32)
        acc += part * s[None, :]
    y_at = y_ptr + pid_s * stride_ys + rm[:, None] * stride_y + rn[None, :]
    y_mask = m_ok[:, None] & n_ok[None, :]
    if PARTIAL:
        tl.store(y_at, acc, mask=y_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_at, acc.to(y_ptr.dtype.element_ty), mask=y_mask)


@triton.jit
def _sum_splits_kernel(part_ptr, b_ptr, y_ptr, M, N, stride_ps, stride_y, S: tl.constexpr,
                       BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y[m, n] = sum over s of part[s, m, n] (+ bias[n]); grid (M, cdiv(N, BLOCK))."""
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(part_ptr + s * stride_ps + m * N + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_y + cols, acc.to(y_ptr.dtype.element_ty), mask=ok)


def _check(x, qweight, scale, group_size, zero, perm, bias) -> tuple[int, int, int]:
    """ValueError naming the argument; returns (M, N, K)."""
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.int32 or qweight.dim() != 2 \
            or qweight.stride(1) != 1:
        raise ValueError(f"qweight: expected a row-major int32 [N, K/8] tensor, got "
                         f"{getattr(qweight, 'dtype', None)} {tuple(getattr(qweight, 'shape', ()))}")
    n, k = qweight.shape[0], qweight.shape[1] * 8
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1 or not x.is_floating_point():
        raise ValueError(f"x: expected a floating [M, {k}] tensor with unit column stride, got "
                         f"{tuple(x.shape)} {x.dtype} strides {x.stride()}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 8 or k % group_size:
        raise ValueError(f"group_size: {group_size!r} must be a positive multiple of 8 dividing K={k}")
    g = k // group_size
    if scale.shape != (n, g) or scale.stride(1) != 1 or not scale.is_floating_point():
        raise ValueError(f"scale: expected a floating [{n}, {g}] tensor with unit column stride, got "
                         f"{scale.dtype} {tuple(scale.shape)}")
    if zero is not None and (zero.dtype != torch.uint8 or zero.shape != (n, g) or zero.stride(1) != 1):
        raise ValueError(f"zero: expected uint8 [{n}, {g}] or None, got {zero.dtype} {tuple(zero.shape)}")
    if perm is not None and (perm.dtype != torch.int32 or perm.shape != (k,) or perm.stride(0) != 1):
        raise ValueError(f"perm: expected contiguous int32 [{k}] or None, got {perm.dtype} {tuple(perm.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias: expected [{n}], got {tuple(bias.shape)}")
    if x.shape[0] < 1:
        raise ValueError(f"x: {x.shape[0]} rows, expected at least 1")
    return x.shape[0], n, k


def gemv_int4(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, group_size: int, *,
              zero: torch.Tensor | None = None, perm: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, config: Int4GemvConfig | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W the int4 weight (module docstring), dequantized in registers.

    x [M, K] bfloat16 / float16 / float32 (unit column stride); returns (or writes into `out`)
    [M, N] in x's dtype; float32 accumulation. Any M (grid tiles of 16 rows; meant for M <= 16
    to ~64). config: default `default_config(N, K, group_size)`. Capturable (split-K allocates
    its workspace per call from the caching allocator / the graph's pool).
    """
    m, n, k = _check(x, qweight, scale, group_size, zero, perm, bias)
    c = config or default_config(n, k, group_size)
    if group_size % c.block_k or c.block_k % 8 or c.block_k < 16:
        raise ValueError(f"config: block_k={c.block_k} must be a multiple of 8 (>= 16) dividing "
                         f"group_size={group_size}")
    if c.split_k < 1 or k % (c.split_k * c.block_k):
        raise ValueError(f"config: split_k={c.split_k} needs K={k} divisible by split_k * block_k")
    y = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if out is not None and (out.shape != (m, n) or out.stride(1) != 1):
        raise ValueError(f"out: expected [{m}, {n}] with unit column stride, got {tuple(out.shape)}")
    split = c.split_k
    dst = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    if c.block_m not in (1, 2, 4, MAX_M):
        raise ValueError(f"config: block_m={c.block_m}, expected 1, 2, 4 or {MAX_M}")
    grid = (triton.cdiv(m, c.block_m), triton.cdiv(n, c.block_n), split)
    _gemv_int4_kernel[grid](
        x, qweight, scale, zero if zero is not None else scale, perm if perm is not None else qweight,
        bias if bias is not None else scale, dst, m, n, k, group_size, k // split,
        x.stride(0), qweight.stride(0), scale.stride(0), zero.stride(0) if zero is not None else 0,
        dst.stride(-2), dst.stride(0) if split > 1 else 0,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, HAS_ZERO=zero is not None,
        HAS_PERM=perm is not None, HAS_BIAS=bias is not None, PARTIAL=split > 1,
        DOT_F32=x.device.type != "cuda", num_warps=c.num_warps, num_stages=c.num_stages)
    if split > 1:
        block = min(1024, triton.next_power_of_2(n))
        _sum_splits_kernel[(m, triton.cdiv(n, block))](
            dst, bias if bias is not None else dst, y, m, n, dst.stride(0), y.stride(0), S=split,
            BLOCK=block, HAS_BIAS=bias is not None, num_warps=4)
    return y


@triton.jit
def _dequant_kernel(q_ptr, s_ptr, z_ptr, w_ptr, N, K, group, stride_q, stride_s, stride_z, stride_w,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_ZERO: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    kk = k0 + tl.arange(0, BLOCK_K)
    n_ok, k_ok = rn < N, kk < K
    v = int4_tile(q_ptr, stride_q, z_ptr, stride_z, rn, k0, n_ok, k_ok, group, BLOCK_N, BLOCK_K, HAS_ZERO)
    s = tl.load(s_ptr + rn * stride_s + k0 // group, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(w_ptr + rn[:, None] * stride_w + kk[None, :], (v.to(tl.float32) * s[:, None]).to(w_ptr.dtype.element_ty),
             mask=n_ok[:, None] & k_ok[None, :])


def dequantize_int4(qweight: torch.Tensor, scale: torch.Tensor, group_size: int, *,
                    zero: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[N, K] in `dtype`, stored column order (an act-order weight's columns stay permuted:
    multiply x[:, perm]); each value (q - zero) * scale computed in float32, then rounded.
    One launch; capturable."""
    n, k = qweight.shape[0], qweight.shape[1] * 8
    _check(torch.empty((1, k), dtype=dtype, device=qweight.device), qweight, scale, group_size, zero, None, None)
    w = torch.empty((n, k), dtype=dtype, device=qweight.device)
    bk = tile_k(group_size)
    _dequant_kernel[(triton.cdiv(n, 32), triton.cdiv(k, bk))](
        qweight, scale, zero if zero is not None else scale, w, n, k, group_size, qweight.stride(0),
        scale.stride(0), zero.stride(0) if zero is not None else 0, w.stride(0),
        BLOCK_N=32, BLOCK_K=bk, HAS_ZERO=zero is not None, num_warps=4)
    return w


__all__ = ["CANDIDATES", "Int4GemvConfig", "MAX_M", "TARGET_PROGRAMS", "default_config", "dequantize_int4",
           "gemv_int4", "int4_tile", "tile_k"]
