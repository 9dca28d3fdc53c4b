"""W4A16 GEMV for decode: y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W in graphrt's int4 layout.

    y = gemv_int4(x, qweight, scale, group_size, zero=zero, perm=perm, bias=bias)   # any M; best M <= 16
    w = dequantize_int4(qweight, scale, group_size, zero=zero, dtype=torch.bfloat16)  # [N, K] (prefill M)

The layout (graphrt/model/quant/int4.py): qweight int32 [N, K/8], nibble i of word c = code of
stored column 8c + i; scale [N, G] (fp16 / bf16 / fp32), zero uint8 [N, G] or None (zero 8),
perm int32 [K] or None (act-order: stored column j multiplies x[:, perm[j]]); G = K / group_size.

The scheme. A decode GEMV is a stream of weight bytes; at 4 bits a weight, the instructions
that unpack the codes (not the bytes) limit a plain kernel: one shift + mask + int-to-float
convert per code, in tiles too small to amortise their scale loads, ran an H100 at ~0.5 TB/s
(~36 instructions a code in its SASS). Here (~3 a code, counted in the sm_90 SASS of the main
loop, so the weight stream, not the issue rate, is the bound):
- A K step of program (m, n, s) covers block_k columns of BLOCK_N rows as BLOCK_G = block_k / TG
  group tiles of TG columns (TG = tile_k(group_size): the largest power of two <= 128 dividing
  the group size, so a tile lies in one group): words [BLOCK_G, BLOCK_N, TG/8] (16-byte loads
  along K, the contiguous dim, pipelined through shared memory), one scale (and zero) per row
  per tile.
- `int4_tile` turns the words into q - zero, exact small integers in the activation dtype. On
  CUDA (bf16 / fp16 activations) two codes at a time in packed registers: a byte permute puts
  the codes of columns 2j and 2j + 1 in the two 16-bit halves, one LOP3 masks them and sets the
  exponent of 128 (bf16; fp16: 1024), so each half reads 128 + q exactly, and one packed FMA
  subtracts 128 + zero: 1.6 instructions a code, no int-to-float conversion. Elsewhere (the CPU
  interpreter, float32 activations) shifts and masks give the same values.
- One batched tl.dot per K step: [BLOCK_G, BLOCK_N, TG] x [BLOCK_G, TG, 16] (x's rows padded
  to 16, the tensor cores' smallest tile; M == 1 loads its one row and broadcasts it; float32
  accumulation, every product exact). The warps split the group tiles (split-K inside the
  program: parallelism and bytes in flight without a second launch); each tile's partial sum
  is scaled by its group's scale in float32, and the BLOCK_G partials are summed at the end.
- Split-K across programs (config.split_k = S > 1) where N / BLOCK_N programs still under-fill
  the GPU: program s covers K range s of S and writes float32 partials; a second small kernel
  sums them (+ bias), or (`gemv_int4_partial`) they land in the SplitAcc layout of
  kernels/splitk.py, whose reader sums them.
Rows past N re-read row N - 1 (loads stay unmasked; stores are masked).

`int4_tile` is a @triton.jit helper other kernels can call (the int4 variant of the persistent
step's GEMV tile): words [B, R, W] int32 and zeros [B, R, 1] -> [B, R, 8W] of q - zero.

Runs on CPU tensors under TRITON_INTERPRET=1 (tests compare it with float32 torch over the
dequantized weight); the packed-register unpacking is CUDA-only inline PTX (sm_80+), checked
against the same reference by tests/model/test_int4_gpu.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl

MAX_M = 16                     # activation rows per program (one tl.dot tile; the grid tiles larger M)


@dataclass(frozen=True)
class Int4GemvConfig:
    """One launch configuration. block_n: output rows per program (a power of two >= 16);
    block_k: columns per K step (a power of two >= 128: block_k / TG group tiles, the batch of
    the program's tl.dot, split between its warps); split_k: K ranges per output tile (1: none;
    > 1: float32 partials and a reduce launch, or a `gemv_int4_partial` destination)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1

    @property
    def name(self) -> str:
        return (f"triton-gemv-int4-n{self.block_n}-k{self.block_k}-w{self.num_warps}-s{self.num_stages}"
                f"-split{self.split_k}")

    def fits(self, k: int, group_size: int) -> bool:
        """Can it run a weight of K columns and this group size (each split whole group tiles)?"""
        tg = tile_k(group_size)
        return tg >= 16 and isinstance(self.split_k, int) and self.split_k >= 1 and k % (self.split_k * tg) == 0


# Timed on a GPU by tools/bench_e2e.py --int4-kernels (Linear.choose); default_config picks one
# without timing. The knobs: rows a program (block_n: programs vs. work a thread), columns a K
# step (block_k: bytes a step, and the group tiles the warps share), warps, pipeline stages
# (bytes in flight), split-K across programs (a reduce launch).
CANDIDATES = (
    Int4GemvConfig(16, 512, 4, 4), Int4GemvConfig(16, 1024, 8, 4), Int4GemvConfig(16, 1024, 4, 4),
    Int4GemvConfig(16, 2048, 8, 3), Int4GemvConfig(16, 1024, 8, 6), Int4GemvConfig(16, 256, 2, 4),
    Int4GemvConfig(32, 512, 4, 4), Int4GemvConfig(32, 1024, 8, 4), Int4GemvConfig(32, 256, 2, 5),
    Int4GemvConfig(64, 256, 4, 4), Int4GemvConfig(64, 512, 8, 3), Int4GemvConfig(16, 1024, 8, 4, 2),
    Int4GemvConfig(16, 512, 4, 4, 2), Int4GemvConfig(32, 512, 4, 4, 2), Int4GemvConfig(16, 512, 4, 4, 4))
SMS = 132                      # H100 / H200 SXM streaming multiprocessors (default_config's target)


def tile_k(group_size: int) -> int:
    """TG: the largest power of two <= 128 dividing group_size (a K tile that lies in one group)."""
    bk = 128
    while group_size % bk:
        bk //= 2
    return bk


def default_config(n: int, k: int, group_size: int, m: int = 1) -> Int4GemvConfig:
    """A pure choice by shape and rows, read off the measured grid (`tools/bench_e2e.py
    --int4-kernels`, H100, 2026-12-07: docs/results/step_persistent_int4_h100.log; the fastest
    candidate per Llama-3.2-1B / 3.1-8B GEMM, or one within ~5% of it):
    - N / 32 programs fill the GPU twice over (the gate_up shapes): one row, 32 rows and 512
      columns a step on 4 warps; 2-16 rows, 16 rows and 256 columns on 2 warps (more programs
      an SM: the 16-row activation tiles stay small);
    - else one row: 16 rows a program on 4 warps, 1024 columns a step where the programs are
      few (N / 16 <= 1.5 x the SMs) or K is long (>= 8192), else 512; 2-16 rows: 512 columns on
      4 warps (at 1024 columns the 16-row activation tiles take 120 KB of shared memory: one
      program an SM), 32 rows a program where K is long (the split-K plan then halves K);
    - split-K 2 only where even N / block_n programs leave half the SMs idle and each split
      keeps 2 steps."""
    wide = triton.cdiv(n, 32) >= 2 * SMS
    long_k = k >= 8192
    if m == 1:
        if wide:
            return Int4GemvConfig(32, 512, 4, 4)
        few = 2 * triton.cdiv(n, 16) <= 3 * SMS
        c = Int4GemvConfig(16, 1024 if few or long_k else 512, 4, 4)
    else:
        if wide:
            return Int4GemvConfig(16, 256, 2, 4)
        c = Int4GemvConfig(32 if long_k else 16, 512, 4, 4)
    split = Int4GemvConfig(c.block_n, c.block_k, c.num_warps, c.num_stages, 2)
    if triton.cdiv(n, c.block_n) * 2 <= SMS and split.fits(k, group_size) and k >= 4 * c.block_k:
        return split
    return c


# Packed-register unpacking (CUDA, inline PTX; sm_80+). Inputs (pack=2: each asm call sees one
# word twice and its zero constant twice): $4 = word, $6 = -(MAGIC + zero) in both 16-bit halves.
# Outputs $0..$3: columns (2j, 2j + 1) of the word as two 16-bit floats (low half first), q - zero.
# prmt puts byte j of the word (columns 2j, 2j + 1) in byte 0 and byte j of word >> 4 in byte 2;
# lop3 (a & b) | c keeps one code per half and sets each half's exponent so it reads MAGIC + q.
_UNPACK = """{{
.reg .b32 w4, t, one;
mov.b32 one, {one};
shr.u32 w4, $4, 4;
prmt.b32 t, $4, w4, 0x0400;
lop3.b32 t, t, 0x000F000F, {magic}, 0xea;
fma.rn.{ty} $0, t, one, $6;
prmt.b32 t, $4, w4, 0x0501;
lop3.b32 t, t, 0x000F000F, {magic}, 0xea;
fma.rn.{ty} $1, t, one, $6;
prmt.b32 t, $4, w4, 0x0602;
lop3.b32 t, t, 0x000F000F, {magic}, 0xea;
fma.rn.{ty} $2, t, one, $6;
prmt.b32 t, $4, w4, 0x0703;
lop3.b32 t, t, 0x000F000F, {magic}, 0xea;
fma.rn.{ty} $3, t, one, $6;
}}"""
UNPACK_BF16 = tl.constexpr(_UNPACK.format(one="0x3F803F80", magic="0x43004300", ty="bf16x2"))  # 128 + q
UNPACK_F16 = tl.constexpr(_UNPACK.format(one="0x3C003C00", magic="0x64006400", ty="f16x2"))    # 1024 + q


@triton.jit
def int4_tile(words, zero, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """words int32 [B, R, W] in graphrt's layout (nibble i of word c: the code of column 8c + i),
    zero int32 [B, R, 1] (0..16) -> [B, R, 8W] in DTYPE: q - zero per column, exact small
    integers. ASM (CUDA, DTYPE bfloat16 / float16): packed-register unpacking (module
    docstring); else shifts and masks (any DTYPE; the interpreter)."""
    B: tl.constexpr = words.shape[0]
    R: tl.constexpr = words.shape[1]
    W: tl.constexpr = words.shape[2]
    if ASM:
        w2 = tl.join(words, words)                        # pack=2: each asm call sees its word twice
        zb = tl.broadcast_to(zero, (B, R, W))
        if DTYPE == tl.bfloat16:
            neg = zb | 0xC300                             # -(128 + zero) as bf16 bits
            c = neg | (neg << 16)
            o0, o1, o2, o3 = tl.inline_asm_elementwise(UNPACK_BF16, "=r,=r,=r,=r,r,r,r,r", [w2, tl.join(c, c)],
                                                       dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2)
        else:
            neg = zb | 0xE400                             # -(1024 + zero) as fp16 bits
            c = neg | (neg << 16)
            o0, o1, o2, o3 = tl.inline_asm_elementwise(UNPACK_F16, "=r,=r,=r,=r,r,r,r,r", [w2, tl.join(c, c)],
                                                       dtype=(tl.float16,) * 4, is_pure=True, pack=2)
        # o_j [B, R, W, 2]: columns 8c + 2j + h; joined [.., h, j % 2, j // 2] -> [.., j // 2, j % 2, h]
        t = tl.permute(tl.join(tl.join(o0, o1), tl.join(o2, o3)), (0, 1, 2, 5, 4, 3))
        return tl.reshape(t, (B, R, 8 * W))
    else:
        shifts = tl.arange(0, 8) * 4
        codes = (words[:, :, :, None] >> shifts[None, None, None, :]) & 0xF          # [B, R, W, 8]
        v = (codes - zero[:, :, :, None]).to(tl.float32).to(DTYPE)                    # exact in any DTYPE
        return tl.reshape(v, (B, R, 8 * W))


@triton.jit
def prefetch_l2(ptrs):
    """prefetch.global.L2 at every pointer of the tensor (CUDA; the interpreter has no asm)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["M"])
def _gemv_int4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, p_ptr, b_ptr, y_ptr, M, N, K, k_split,
                      stride_x, stride_q, stride_s, stride_z, stride_ys, stride_ym, stride_yn,
                      BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, TG: tl.constexpr, LOG_TG: tl.constexpr,
                      GT: tl.constexpr, ONE_ROW: tl.constexpr,
                      HAS_ZERO: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
                      PARTIAL: tl.constexpr, EVEN_K: tl.constexpr, ASM: tl.constexpr, DOT_F32: tl.constexpr,
                      PDL: tl.constexpr):
    """Program (m, n, s): rows [16m, +16) of x, rows [n * BLOCK_N, +BLOCK_N) of W, columns
    [s * k_split, +k_split); TG = 2^LOG_TG columns a group tile, GT group tiles a group. y
    element (s, m, n) at y + s * stride_ys + m * stride_ym + n * stride_yn. ONE_ROW: M == 1
    (x's one row broadcast to the dot's 16). PARTIAL: partial sums, no bias. EVEN_K:
    k_split is a multiple of BLOCK_G * TG (no group-tile masks). DOT_F32: both dot
    operands in float32, IEEE products (float32 activations; and the interpreter, whose tl.dot
    multiplies bf16's raw storage, Triton 3.9). PDL: launched as a programmatic dependent: the
    first K step's weight rows are prefetched into L2 before waiting for the previous kernel
    (weights are never written during a step; x and y are touched only after the wait)."""
    pid_m = tl.program_id(0)          # M tiles vary fastest: they share a weight tile in L2
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    BM: tl.constexpr = 16
    GW: tl.constexpr = TG // 8
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rn_ld = tl.minimum(rn, N - 1)
    rm = pid_m * BM + tl.arange(0, BM)
    m_ok = rm < M
    rg = tl.arange(0, BLOCK_G)
    rt = tl.arange(0, TG)
    q_rows = q_ptr + rn_ld[None, :, None] * stride_q + tl.arange(0, GW)[None, None, :]   # [1, BN, GW]
    s_rows = s_ptr + rn_ld[None, :] * stride_s                                            # [1, BN]
    z_rows = z_ptr + rn_ld[None, :] * stride_z
    x_rows = x_ptr + rm[None, :, None] * stride_x                                         # [1, BM, 1]
    acc = tl.zeros((BLOCK_G, BLOCK_N, BM), dtype=tl.float32)
    k_lo = pid_s * k_split
    k_hi = k_lo + k_split
    if PDL:          # the first K step's rows, two 32-byte sectors of each tile row (64 bytes at TG 128)
        first = q_ptr + rn_ld[None, :, None] * stride_q + ((k_lo + rg * TG) >> 3)[:, None, None] \
            + (tl.arange(0, 2) * (GW // 2))[None, None, :]                                  # [BG, BN, 2]
        prefetch_l2(tl.where((k_lo + rg * TG < k_hi)[:, None, None], first, q_ptr))
    pdl_prologue(PDL)
    for k0 in range(k_lo, k_hi, BLOCK_G * TG):
        k0 = tl.multiple_of(k0, TG)
        kg = k0 + rg * TG                                  # [BG] first column of each group tile
        gi = (kg >> LOG_TG) // GT                          # [BG] their groups
        g_ok = kg < k_hi
        if EVEN_K:
            words = tl.load(q_rows + (kg >> 3)[:, None, None])                            # [BG, BN, GW]
            s = tl.load(s_rows + gi[:, None])                                             # [BG, BN]
            z = tl.load(z_rows + gi[:, None]).to(tl.int32)                                # [BG, BN]
        else:
            words = tl.load(q_rows + (kg >> 3)[:, None, None], mask=g_ok[:, None, None], other=0)
            s = tl.load(s_rows + gi[:, None], mask=g_ok[:, None], other=0.0)
            z = tl.load(z_rows + gi[:, None], mask=g_ok[:, None], other=0).to(tl.int32)
        if not HAS_ZERO:
            # symmetric: zero 8. z_ptr is then any byte tensor (stride 0) and this byte load is dead
            # (LLVM folds it), but it keeps the unpacked tile in the load's registers: Triton sizes
            # the dot operand's register layout (kWidth) by the narrowest type feeding it, and
            # without an 8-bit input it routes the tile through shared memory (~1 instr./code more)
            z = (z >> 8) + 8
        w = int4_tile(words, z[:, :, None], x_ptr.dtype.element_ty, ASM)                  # [BG, BN, TG]
        cols = kg[:, None] + rt[None, :]                                                 # [BG, TG]
        if EVEN_K:
            if HAS_PERM:
                cols = tl.load(p_ptr + cols)
            g_mask = tl.full((BLOCK_G, 1, 1), 1, tl.int1)
        else:
            if HAS_PERM:
                cols = tl.load(p_ptr + cols, mask=g_ok[:, None], other=0)
            g_mask = g_ok[:, None, None]
        if ONE_ROW:      # M == 1: one row loaded and broadcast to the dot's 16 (no padding rows streamed)
            x = tl.broadcast_to(tl.load(x_ptr + cols[:, None, :], mask=g_mask, other=0.0), (BLOCK_G, BM, TG))
        else:
            x = tl.load(x_rows + cols[:, None, :], mask=m_ok[None, :, None] & g_mask, other=0.0)   # [BG, BM, TG]
        if DOT_F32:
            part = tl.dot(w.to(tl.float32), tl.permute(x.to(tl.float32), (0, 2, 1)), input_precision="ieee")
        else:
            part = tl.dot(w, tl.permute(x, (0, 2, 1)), out_dtype=tl.float32)            # [BG, BN, BM]
        acc += part * s.to(tl.float32)[:, :, None]
    y = tl.sum(acc, axis=0)                                                              # [BN, BM]
    y_at = y_ptr + pid_s * stride_ys + rm[None, :] * stride_ym + rn[:, None] * stride_yn
    y_mask = m_ok[None, :] & n_ok[:, None]
    if PARTIAL:
        tl.store(y_at, y.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        if HAS_BIAS:
            y += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_at, y.to(y_ptr.dtype.element_ty), mask=y_mask)


@triton.jit
def _sum_splits_kernel(part_ptr, b_ptr, y_ptr, M, N, stride_ps, stride_y, S: tl.constexpr,
                       BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    """y[m, n] = sum over s of part[s, m, n] (+ bias[n]); grid (M, cdiv(N, BLOCK))."""
    pdl_prologue(PDL)
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
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 16 \
            or group_size % 16 or k % group_size:
        raise ValueError(f"group_size: {group_size!r} must be a positive multiple of 16 dividing K={k}")
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


def _check_config(c: Int4GemvConfig, k: int, group_size: int) -> None:
    pow2 = isinstance(c, Int4GemvConfig) and all(
        isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in (c.block_n, c.block_k, c.num_warps))
    if not pow2 or c.block_n < 16 or c.block_k < 128 or not isinstance(c.num_stages, int) or c.num_stages < 1:
        raise ValueError(f"config: {c!r}; expected powers of two block_n >= 16, block_k >= 128 and "
                         f"num_warps, and num_stages >= 1")
    if not c.fits(k, group_size):
        raise ValueError(f"config: split_k={c.split_k} needs K={k} divisible by split_k x {tile_k(group_size)} "
                         f"(the group tile of group_size={group_size})")


def _launch(x, qweight, scale, group_size, zero, perm, bias, dst, c: Int4GemvConfig, strides, partial: bool):
    """The one launch of `_gemv_int4_kernel` into dst with (split, row, column) strides."""
    m, n, k = x.shape[0], qweight.shape[0], qweight.shape[1] * 8
    tg, split = tile_k(group_size), c.split_k
    k_split = k // split
    asm = x.device.type == "cuda" and x.dtype in (torch.bfloat16, torch.float16)
    pdl = use_pdl(x)
    _gemv_int4_kernel[(triton.cdiv(m, MAX_M), triton.cdiv(n, c.block_n), split)](
        x, qweight, scale, zero if zero is not None else qweight.view(torch.uint8), perm if perm is not None else qweight,
        bias if bias is not None else scale, dst, m, n, k, k_split,
        x.stride(0), qweight.stride(0), scale.stride(0), zero.stride(0) if zero is not None else 0, *strides,
        BLOCK_N=c.block_n, BLOCK_G=c.block_k // tg, TG=tg, LOG_TG=tg.bit_length() - 1, GT=group_size // tg,
        ONE_ROW=m == 1, HAS_ZERO=zero is not None, HAS_PERM=perm is not None,
        HAS_BIAS=bias is not None, PARTIAL=partial, EVEN_K=k_split % c.block_k == 0, ASM=asm,
        DOT_F32=x.device.type != "cuda" or x.dtype == torch.float32, PDL=pdl, num_warps=c.num_warps,
        num_stages=c.num_stages, **pdl_options(pdl))


def gemv_int4(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, group_size: int, *,
              zero: torch.Tensor | None = None, perm: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, config: Int4GemvConfig | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W the int4 weight (module docstring), dequantized in registers.

    x [M, K] bfloat16 / float16 / float32 (unit column stride); returns (or writes into `out`)
    [M, N] in x's dtype; float32 accumulation. Any M (grid tiles of 16 rows; meant for M <= 16
    to ~64). group_size: a multiple of 16. config: default `default_config(N, K, group_size, M)`.
    Capturable (split-K allocates its workspace per call from the caching allocator / the
    graph's pool).
    """
    m, n, k = _check(x, qweight, scale, group_size, zero, perm, bias)
    c = config or default_config(n, k, group_size, m)
    _check_config(c, k, group_size)
    y = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if out is not None and (out.shape != (m, n) or out.stride(1) != 1):
        raise ValueError(f"out: expected [{m}, {n}] with unit column stride, got {tuple(out.shape)}")
    if c.split_k == 1:
        _launch(x, qweight, scale, group_size, zero, perm, bias, y, c, (0, y.stride(0), 1), False)
        return y
    part = torch.empty((c.split_k, m, n), dtype=torch.float32, device=x.device)
    _launch(x, qweight, scale, group_size, zero, perm, None, part, c, (m * n, n, 1), True)
    block, pdl = min(1024, triton.next_power_of_2(n)), use_pdl(x)
    _sum_splits_kernel[(m, triton.cdiv(n, block))](
        part, bias if bias is not None else part, y, m, n, part.stride(0), y.stride(0), S=c.split_k,
        BLOCK=block, HAS_BIAS=bias is not None, PDL=pdl, num_warps=4, **pdl_options(pdl))
    return y


def gemv_int4_partial(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, group_size: int,
                      acc: torch.Tensor, *, zero: torch.Tensor | None = None, perm: torch.Tensor | None = None,
                      config: Int4GemvConfig) -> None:
    """Split-K partial sums without a reduce: writes partial s of output (m, n) (float32 sums,
    stored in acc's dtype) to acc[S*m + s, S*n + s], S = config.split_k: the SplitAcc layout of
    kernels/splitk.py, whose reader sums the S. acc: float32 or x's dtype, [>= S*M, S*N] with
    unit column stride; entries off that diagonal are not written. Capturable."""
    m, n, k = _check(x, qweight, scale, group_size, zero, perm, None)
    _check_config(config, k, group_size)
    s = config.split_k
    if acc.dtype not in (torch.float32, x.dtype) or acc.dim() != 2 or acc.stride(1) != 1 \
            or acc.shape[1] != s * n or acc.shape[0] < s * m or acc.device != x.device:
        raise ValueError(f"acc: expected float32 or {x.dtype} [>= {s * m}, {s * n}] with unit column stride on "
                         f"{x.device}, got {acc.dtype} {tuple(acc.shape)} strides {acc.stride()}")
    ld = acc.stride(0)
    _launch(x, qweight, scale, group_size, zero, perm, None, acc, config, (ld + 1, s * ld, s), True)


@triton.jit
def _dequant_kernel(q_ptr, s_ptr, z_ptr, w_ptr, N, K, group, stride_q, stride_s, stride_z, stride_w,
                    BLOCK_N: tl.constexpr, TG: tl.constexpr, HAS_ZERO: tl.constexpr, ASM: tl.constexpr):
    """Program (n, t): rows [n * BLOCK_N, +BLOCK_N), group tile t (TG columns)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * TG
    n_ok = rn < N
    rn_ld = tl.minimum(rn, N - 1)
    words = tl.load(q_ptr + rn_ld[None, :, None] * stride_q + k0 // 8 + tl.arange(0, TG // 8)[None, None, :])
    if HAS_ZERO:
        z = tl.load(z_ptr + rn_ld * stride_z + k0 // group).to(tl.int32)[None, :, None]
    else:
        z = tl.full((1, BLOCK_N, 1), 8, tl.int32)
    v = tl.reshape(int4_tile(words, z, w_ptr.dtype.element_ty, ASM), (BLOCK_N, TG))
    s = tl.load(s_ptr + rn_ld * stride_s + k0 // group).to(tl.float32)
    kk = k0 + tl.arange(0, TG)
    tl.store(w_ptr + rn[:, None] * stride_w + kk[None, :], (v.to(tl.float32) * s[:, None]).to(w_ptr.dtype.element_ty),
             mask=n_ok[:, None])


def dequantize_int4(qweight: torch.Tensor, scale: torch.Tensor, group_size: int, *,
                    zero: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[N, K] in `dtype`, stored column order (an act-order weight's columns stay permuted:
    multiply x[:, perm]); each value (q - zero) * scale computed in float32, then rounded.
    One launch; capturable."""
    n, k = qweight.shape[0], qweight.shape[1] * 8
    _check(torch.empty((1, k), dtype=dtype, device=qweight.device), qweight, scale, group_size, zero, None, None)
    w = torch.empty((n, k), dtype=dtype, device=qweight.device)
    tg = tile_k(group_size)
    _dequant_kernel[(triton.cdiv(n, 32), k // tg)](
        qweight, scale, zero if zero is not None else scale, w, n, k, group_size, qweight.stride(0),
        scale.stride(0), zero.stride(0) if zero is not None else 0, w.stride(0),
        BLOCK_N=32, TG=tg, HAS_ZERO=zero is not None,
        ASM=w.device.type == "cuda" and dtype in (torch.bfloat16, torch.float16), num_warps=4)
    return w


__all__ = ["CANDIDATES", "Int4GemvConfig", "MAX_M", "SMS", "default_config", "dequantize_int4", "gemv_int4",
           "gemv_int4_partial", "int4_tile", "tile_k"]
