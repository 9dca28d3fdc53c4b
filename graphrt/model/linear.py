"""Decode linear layers: cuBLAS or graphrt's Triton GEMV, whichever measures faster per batch.

    lin = Linear(weight, bias)                 # weight [N, K], bias [N] or None (device tensors)
    lin.choose(batch_sizes)                    # on a GPU, at capture: times both per batch size
    y = lin(x)                                 # x [M, K] -> [M, N]; dispatch on M (host int)

    y = linear(x, w, bias)                     # the model's call: w a tensor, an Fp8Weight or an Int4Weight
    acc = fp8_matmul(xq, w8, unit=one)         # W8A8: Fp8Rows x per-channel Fp8Weight -> ScaledAcc

The choice is a pure host-side decision keyed by the row count, made before any graph is
captured, so every captured graph holds one fixed kernel. Without a choice (CPU, prefill rows,
M > 16) the call is `torch.nn.functional.linear` (cuBLAS on CUDA).

W8A8 (the decoder's FP8 path, `fp8_matmul`): the activation arrives already quantized per row
(`graphrt.kernels.fp8_rows.Fp8Rows`, written by the RMSNorm / SiLU-mul / quantize kernel that
produced it); one `torch._scaled_mm` with unit per-tensor scales (cuBLASLt's fast FP8 kernel;
row-wise scales select a kernel 1.4-3x slower) yields the unscaled product, and the row and
channel scales travel with it (`ScaledAcc`) into the kernel that reads it next.

FP8 weights given a float activation (`linear`, other callers): on CPU the float32 dequantized weight (the
reference path CI runs); on CUDA the FP8 GEMV (`gemv_fp8`, dequant in registers) for M < 64,
and above that `torch._scaled_mm` with per-token dynamic activation scales (per-channel
weights) or, block-scaled, the same Triton kernel tiled over M (M < 256) / a dequantized bf16
copy and cuBLAS (prefill-sized M); see SCALED_MM_MIN_M.

int4 weights (W4A16, `Int4Weight`, `int4_linear`): on CPU the float32 dequantized weight (the
reference path); on CUDA the int4 GEMV (`gemv_int4`: codes unpacked in registers, group scales
on the float32 partial sums, split-K inside a program) for M <= INT4_GEMV_MAX_M, and above that
one dequantizing kernel into a model-dtype copy, then cuBLAS (prefill-sized M).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from typing import TYPE_CHECKING

from graphrt.kernels.fp8_rows import Fp8Rows, ScaledAcc
from graphrt.kernels.timing import graph_us
from graphrt.model.quant.fp8 import FP8, FP8_MAX, Fp8Weight
from graphrt.model.quant.int4 import Int4Weight

if TYPE_CHECKING:        # the GEMV kernels (Triton) are imported where a CUDA path runs them
    from graphrt.kernels.gemv import GemvConfig
    from graphrt.kernels.gemv_int4 import Int4GemvConfig

CUBLAS = "cublas"
L2_BYTES = 128 << 20  # > the H100/H200 L2 (50-60 MB) with margin
# FP8 weights on CUDA by row count M: weight-only FP8 GEMV (exact vs the dequantized weight) below
# SCALED_MM_MIN_M; per-channel at or above it: W8A8 torch._scaled_mm (activations rounded to
# e4m3 per token: ~2-3% relative error per GEMM); block-scaled: the GEMV tiled over M below
# PREFILL_DEQUANT_M, a dequantized copy + cuBLAS above. Retune from bench_e2e --fp8-kernels.
SCALED_MM_MIN_M = 64
PREFILL_DEQUANT_M = 256
INT4_GEMV_MAX_M = 64       # int4 on CUDA: the GEMV up to this many rows, dequantize + cuBLAS above


def fp8_matmul(x: Fp8Rows, w: Fp8Weight, bias: torch.Tensor | None = None, *, unit: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16) -> ScaledAcc:
    """x (Fp8Rows: data [Mp, K] e4m3, scale [M]) times a per-channel / per-tensor FP8 weight
    [N, K] -> ScaledAcc(acc [M, N] in out_dtype, x.scale, w.scale, bias); a weight with a
    tensor_scale gives it to the GEMM instead (ScaledAcc.col_scale None). unit: a float32 1.0
    scalar on the device (the activation's GEMM scale). CPU and CUDA (torch._scaled_mm);
    capturable."""
    if w.block is not None:
        raise ValueError("w: block-scaled FP8 weights take a float activation (linear / gemv_fp8)")
    if x.data.shape[1] != w.shape[1]:
        raise ValueError(f"x: {x.data.shape[1]} columns, the weight has K={w.shape[1]}")
    per_tensor = w.tensor_scale is not None             # the GEMM applies it; no column scales
    acc = torch._scaled_mm(x.data, w.data.t(), scale_a=unit,
                           scale_b=w.tensor_scale if per_tensor else unit, out_dtype=out_dtype)
    return ScaledAcc(acc[: x.rows], x.scale, None if per_tensor else w.scale, bias)


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) -> [M, N] in x's dtype; w a [N, K] tensor (F.linear), an
    Fp8Weight (see module docstring) or a `Linear`."""
    if isinstance(w, Linear):
        return w(x) if bias is None else w(x) + bias
    if isinstance(w, Fp8Weight):
        return fp8_linear(x, w, bias)
    if isinstance(w, Int4Weight):
        return int4_linear(x, w, bias)
    return F.linear(x, w, bias)


def int4_linear(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None = None, *,
                config: Int4GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16 / fp32, model channel order) times an int4 weight [N, K] -> [M, N]
    in x's dtype (module docstring). config: the GEMV's (default: gemv_int4's pure choice);
    with M > INT4_GEMV_MAX_M on CUDA the dequantized copy is used regardless."""
    if x.device.type != "cuda":          # CPU: float32 reference (dequantized weight)
        y = F.linear(x.float(), w.dequantize(torch.float32), None if bias is None else bias.float())
        return y.to(x.dtype)
    if x.shape[0] <= INT4_GEMV_MAX_M:
        from graphrt.kernels.gemv_int4 import gemv_int4
        return gemv_int4(x, w.qweight, w.scale, w.group_size, zero=w.zero, perm=w.perm, bias=bias,
                         config=config)
    return int4_dequant_mm(x, w, bias)


def int4_dequant_mm(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """CUDA: one dequantizing kernel into a [N, K] copy in x's dtype, then cuBLAS (act-order:
    x's columns gathered into the stored order first). [M, N] in x's dtype; capturable."""
    from graphrt.kernels.gemv_int4 import dequantize_int4
    wd = dequantize_int4(w.qweight, w.scale, w.group_size, zero=w.zero, dtype=x.dtype)
    xs = x if w.perm is None else x.index_select(1, w.perm)
    return F.linear(xs, wd, bias)


def fp8_linear(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None, *,
               config: GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16 / fp32) times an FP8 weight [N, K] -> [M, N] in x's dtype."""
    if x.device.type != "cuda":          # CPU: float32 reference (dequantized weight)
        y = F.linear(x.float(), w.dequantize(torch.float32), None if bias is None else bias.float())
        return y.to(x.dtype)
    m = x.shape[0]
    if m < SCALED_MM_MIN_M or (w.block is not None and m < PREFILL_DEQUANT_M):
        from graphrt.kernels.gemv import FP8_CANDIDATES, gemv_fp8
        return gemv_fp8(x, w.data, w.scale, bias, block=w.block,
                        config=config or FP8_CANDIDATES[0])
    if w.block is not None:              # prefill-sized M: one dequantized copy, then cuBLAS
        return F.linear(x, w.dequantize(x.dtype), bias)
    return scaled_mm_per_token(x, w, bias)


def scaled_mm_per_token(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """CUDA, per-channel w: x quantized per row (dynamic amax / 448 scales) and one FP8
    tensor-core GEMM with row-wise scales (torch._scaled_mm, bf16 out); [M, N] in x's dtype.
    Rows are padded to a multiple of 16 when needed (cuBLASLt FP8 operand alignment)."""
    m = x.shape[0]
    xf = x.float()
    sx = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)       # [M, 1]
    xq = (xf / sx).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    if m % 16:
        pad = 16 - m % 16
        xq = F.pad(xq.view(torch.uint8), (0, 0, 0, pad)).view(FP8)
        sx = F.pad(sx, (0, 0, 0, pad), value=1.0)
    y = torch._scaled_mm(xq, w.data.t(), scale_a=sx, scale_b=w.scale[None, :],
                         out_dtype=torch.bfloat16)[:m]
    y = y.to(x.dtype)
    return y if bias is None else y + bias


class Linear:
    """One weight matrix [N, K] (+ bias [N]) with a per-batch-size kernel choice."""

    def __init__(self, weight: torch.Tensor | Fp8Weight | Int4Weight, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias
        self.choice: dict[int, GemvConfig | None] = {}   # rows -> config (None = cuBLAS)
        self.timings_us: dict[int, dict[str, float]] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.choice.get(x.shape[0])
        if isinstance(self.weight, Int4Weight):
            if x.shape[0] in self.choice and cfg is None and x.device.type == "cuda":
                return int4_dequant_mm(x, self.weight, self.bias)       # measured faster
            return int4_linear(x, self.weight, self.bias, config=cfg)
        if isinstance(self.weight, Fp8Weight):
            if x.shape[0] in self.choice and cfg is None and x.device.type == "cuda":
                return scaled_mm_per_token(x, self.weight, self.bias)   # measured faster
            return fp8_linear(x, self.weight, self.bias, config=cfg)
        if cfg is None:
            return F.linear(x, self.weight, self.bias)
        from graphrt.kernels.gemv import gemv                      # a choice is made on CUDA only
        return gemv(x, self.weight, self.bias, config=cfg)

    def choose(self, batch_sizes, *, reps: int = 20, repeats: int = 5) -> dict[int, str]:
        """Time cuBLAS (FP8 weights: torch._scaled_mm, per-channel only) and each GEMV candidate
        per batch size and keep the fastest. CUDA only; returns names. Timing: one CUDA graph of
        back-to-back calls rotating over copies of the weight that together exceed the L2 (a
        decode step never finds its weights in L2), CUDA events, median of `repeats`."""
        w8 = self.weight if isinstance(self.weight, Fp8Weight) else None
        w4 = self.weight if isinstance(self.weight, Int4Weight) else None
        if self.weight.device.type != "cuda":
            return {}
        from graphrt.kernels.gemv import CANDIDATES, FP8_CANDIDATES, MAX_M, gemv, gemv_fp8
        from graphrt.kernels.gemv_int4 import CANDIDATES as INT4_CANDIDATES
        if w4 is not None:           # int4: the GEMV configs that fit the groups, and dequant + cuBLAS
            w_bytes, k, g = w4.nbytes, w4.shape[1], w4.group_size

            def clone(w):
                return Int4Weight(w.qweight.clone(), w.scale.clone(), w.group_size,
                                  None if w.zero is None else w.zero.clone(), w.perm)
            cands = [(c.name, c, lambda x, w, c=c: int4_linear(x, w, self.bias, config=c))
                     for c in INT4_CANDIDATES if c.fits(k, g)]
            cands.append((CUBLAS, None, lambda x, w: int4_dequant_mm(x, w, self.bias)))
        elif w8 is None:
            w_bytes = self.weight.numel() * self.weight.element_size()
            clone = torch.Tensor.clone
            cands = [(CUBLAS, None, lambda x, w: F.linear(x, w, self.bias))] + [
                (c.name, c, lambda x, w, c=c: gemv(x, w, self.bias, config=c)) for c in CANDIDATES]
        else:
            w_bytes = w8.nbytes

            def clone(w):
                return Fp8Weight(w.data.clone(), w.scale.clone(), w.block)
            cands = [(c.name, c, lambda x, w, c=c: gemv_fp8(x, w.data, w.scale, self.bias,
                                                            block=w.block, config=c))
                     for c in FP8_CANDIDATES if w8.block is None or w8.block[1] % c.block_k == 0]
            if w8.block is None:
                cands.append((CUBLAS, None, lambda x, w: scaled_mm_per_token(x, w, self.bias)))
        # enough copies to pass the L2 (an int4 1B-shape o weight is 2 MB: 60 copies)
        copies = [self.weight] + [clone(self.weight) for _ in range(min(63, L2_BYTES // w_bytes))]
        dtype = self.weight.dtype if w8 is None and w4 is None else torch.bfloat16
        for m in batch_sizes:
            if m > MAX_M:
                continue
            x = torch.randn((m, self.weight.shape[1]), device=self.weight.device, dtype=dtype)

            def run(call):
                for w in copies:
                    call(x, w)
            times = {name: graph_us(lambda call=call: run(call), reps, repeats) / len(copies)
                     for name, _, call in cands}
            best = min(times, key=times.get)
            self.choice[m] = next(c for name, c, _ in cands if name == best)
            self.timings_us[m] = times
        return {m: (c.name if c else CUBLAS) for m, c in self.choice.items()}
