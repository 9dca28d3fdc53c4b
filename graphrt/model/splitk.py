"""Split-K of the decode step's o and down GEMMs by a view, and the choice of S per row count.

    acc = split_matmul(x, w, 2, unit=one)           # -> SplitAcc (kernels/splitk.py); add_rms_norm sums it
    plan = plan_splitk(model, buckets)              # SplitKPlan: decode rows M -> (S_o, S_down)
    logits = model.decode_step(ctx, tokens, splitk=plan.get(M))

At decode row counts cuBLAS(Lt) under-fills the GPU on o and down (N = hidden size outputs, long
K): it runs well above the weight-bytes floor or adds a separate split-K reduce launch. The GEMM
of the views x.view(S*M, K/S) and W.view(S*N, K/S) reads the same weight bytes with S x the
output tiles, and the add + RMSNorm that consumes the output sums the S partials as it loads
(no reduce launch). H200, GEMM alone, M = 1, S = 1 / 2 / 4 (tools/bench_step_parts.py): 8B o
bf16 13.3 / 10.6 / 10.5 µs, 8B down FP8 20.3 / 17.2 / 17.3, 1B down bf16 14.2 / 13.1 / 10.7; at
M = 16 S = 4 can lose again (more output rows); qkv and gate_up gain nothing (never split).

S is static per captured graph (one fixed kernel), chosen once per ModelRuntime before its first
capture (`plan_splitk`), by the setting `splitk` (RuntimeOptions.splitk, model/options.py; the
environment's GRAPHRT_SPLITK overrides it there: the A/B switch of tools/profile_step.py and
tools/bench_e2e.py):
- "auto" (default): on CUDA measured: for each decode bucket M <= MAX_ROWS, each of o and down
  and each S in SPLITS that divides the weight: the device µs of one CUDA graph holding that
  GEMM plus its add + RMSNorm over every layer of the model (its own weights: a whole model's
  layers stream past the L2 as in the step, no copies), graph_us with one call per graph and 3
  timed replays; S > 1 is kept only when it beats S = 1 by MARGIN (a tie keeps S = 1, whose
  rounding is the unsplit GEMM's). Cost: 6 small graphs per bucket (3 eager warm-up passes, one
  captured pass and 4 replays of 2 x L launches each), estimated at ~50 ms per bucket for an 8B
  model, ~0.4 s for buckets 1, 2, 4, ..., 64 (tests/model/test_splitk_gpu.py prints it); the
  first start also compiles the S = 2 / 4 norm kernels into Triton's cache. On CPU: off.
- 0 or 1: off (S = 1 everywhere); 2 or 4: that S for o and down at every bucket M <= MAX_ROWS
  (S = 1 where K is not a multiple of 16 * S: see `splittable`).
int4 weights (`Int4Weight`) split inside the int4 GEMV instead of by views: its programs for K
range s write partial s straight into the same SplitAcc layout (`gemv_int4_partial`, the GEMV's
default tile with split_k = S; S must leave each split whole group tiles), so the plan measures
and applies S for them like for the others.
Buckets above MAX_ROWS, verify and prefill steps, tensor-parallel models (their o / down
outputs are all-reduced) and weights other than plain tensors, per-tensor / per-channel FP8 and
int4 (block-scaled FP8, `Linear`) keep S = 1.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import torch
import torch.nn.functional as F

from graphrt.kernels.fp8_rows import Fp8Rows, padded_rows
from graphrt.kernels.splitk import SplitAcc
from graphrt.model.options import splitk_setting
from graphrt.model.quant.fp8 import Fp8Weight
from graphrt.model.quant.int4 import Int4Weight

if TYPE_CHECKING:       # the int4 GEMV (Triton) is imported where a split GEMM runs it
    from graphrt.kernels.gemv_int4 import Int4GemvConfig

log = logging.getLogger("graphrt.model")

SPLITS = (1, 2, 4)          # candidates of the measured choice
MAX_ROWS = 64               # decode buckets above this keep S = 1
MARGIN = 0.97               # S > 1 must take under MARGIN x S = 1's time
K_ALIGN = 16                # K / S must be a multiple of this (FP8 GEMM operand alignment)
GEMMS = ("o", "down")


def int4_split_config(w: Int4Weight, split: int, rows: int = 1) -> Int4GemvConfig:
    """The int4 GEMV configuration of a split-S GEMM of w at `rows` activation rows: its default
    tile, split_k = S (the tiles differ in block_k only, so K splits alike at any rows)."""
    from graphrt.kernels.gemv_int4 import Int4GemvConfig, default_config   # Triton's (split-K runs it)
    n, k = w.shape
    c = default_config(n, k, w.group_size, rows)
    return Int4GemvConfig(c.block_n, c.block_k, c.num_warps, c.num_stages, split)


def splittable(w, split: int) -> bool:
    """Can the GEMM of weight w (a contiguous [N, K] tensor, a per-tensor / per-channel
    Fp8Weight, or an Int4Weight) run split S = split? S = 1 always can."""
    if split == 1:
        return True
    if isinstance(w, Int4Weight):
        return isinstance(split, int) and not isinstance(split, bool) and split > 1 \
            and int4_split_config(w, split).fits(w.shape[1], w.group_size)
    if isinstance(w, Fp8Weight):
        if w.block is not None:
            return False
        w = w.data
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_contiguous():
        return False
    k = w.shape[1]
    return split > 1 and k % split == 0 and (k // split) % K_ALIGN == 0


def split_matmul(x: torch.Tensor | Fp8Rows, w, split: int, *, unit: torch.Tensor | None = None,
                 out_dtype: torch.dtype = torch.bfloat16) -> SplitAcc:
    """x [M, K] @ w[N, K].T as one GEMM of split S views -> SplitAcc (acc [S*M, S*N], or
    [padded_rows(S*M), S*N] for FP8). x: a contiguous float tensor with a float weight
    (F.linear; acc in x's dtype) or an Int4Weight (the int4 GEMV's split-K partials, each summed
    in float32 and stored in x's dtype), or Fp8Rows (data [Mp, K] contiguous, scale [M]) with a
    per-tensor / per-channel Fp8Weight (torch._scaled_mm with unit scales, or the weight's
    tensor_scale; acc in out_dtype; the row and channel scales travel in the SplitAcc). unit:
    a float32 1.0 scalar on the device (FP8 only). The FP8 activation's view keeps its rows
    padded to 16: data.view(S*Mp, K/S)'s first padded_rows(S*M) rows (free; pad rows give
    output rows that are never read). No bias (o / down have none). Capturable."""
    n, k = w.shape
    if isinstance(split, bool) or not isinstance(split, int) or not splittable(w, split):
        raise ValueError(f"split: S={split!r} needs a contiguous weight (plain or per-tensor / per-channel "
                         f"FP8) with K divisible by S and K / S a multiple of {K_ALIGN}, or an int4 weight whose "
                         f"K splits into whole group tiles; got weight [{n}, {k}] {type(w).__name__}")
    if isinstance(w, Int4Weight):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != k or not x.is_contiguous():
            raise ValueError(f"x: an int4 weight's split GEMM takes a contiguous float [M, {k}] tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        m = x.shape[0]
        acc = torch.empty((split * m, split * n), dtype=x.dtype, device=x.device)
        from graphrt.kernels.gemv_int4 import gemv_int4_partial
        gemv_int4_partial(x, w.qweight, w.scale, w.group_size, acc, zero=w.zero, perm=w.perm,
                          config=int4_split_config(w, split, m))
        return SplitAcc(acc, split, m)
    kk = k // split
    if isinstance(x, Fp8Rows):
        if not isinstance(w, Fp8Weight):
            raise ValueError("x: Fp8Rows (W8A8) need an Fp8Weight")
        if x.data.shape[1] != k or not x.data.is_contiguous():
            raise ValueError(f"x: expected contiguous FP8 data [Mp, {k}], got {tuple(x.data.shape)} "
                             f"strides {x.data.stride()}")
        if unit is None:
            raise ValueError("unit: an FP8 GEMM needs the float32 1.0 scale on the device")
        m, per_tensor = x.rows, w.tensor_scale is not None
        xs = x.data.view(split * x.data.shape[0], kk)[: padded_rows(split * m)]
        acc = torch._scaled_mm(xs, w.data.view(split * n, kk).t(), scale_a=unit,
                               scale_b=w.tensor_scale if per_tensor else unit, out_dtype=out_dtype)
        return SplitAcc(acc, split, m, x.scale, None if per_tensor else w.scale)
    if isinstance(w, Fp8Weight):
        raise ValueError("x: an FP8 weight's split GEMM reads Fp8Rows (W8A8)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != k or not x.is_contiguous():
        raise ValueError(f"x: expected a contiguous [M, {k}] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    m = x.shape[0]
    return SplitAcc(F.linear(x.view(split * m, kk), w.view(split * n, kk)), split, m)


@dataclass(frozen=True)
class SplitKPlan:
    """Split factors of the decode step's o and down GEMMs by decode row count.

    table: rows M -> (S_o, S_down) (rows not listed: (1, 1)); source: "off", "fixed",
    "measured" or "cached" (measured by an earlier start: model/plans.py); timings_us: measured device µs of one pass over the layers, keyed (M, gemm, S)
    (empty unless measured); seconds: host time the choice took."""
    table: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    source: str = "off"
    timings_us: Mapping[tuple[int, str, int], float] = field(default_factory=dict)
    seconds: float = 0.0

    def get(self, rows: int) -> tuple[int, int]:
        return self.table.get(rows, (1, 1))


def resolve_setting(setting) -> str | int:
    """"auto", 0, 1, 2 or 4 (ints or their strings) -> "auto" or an int; ValueError naming
    splitk otherwise (model/options.py's splitk_setting; no environment is read here)."""
    return splitk_setting(setting)


def plan_splitk(model, buckets, setting="auto") -> SplitKPlan:
    """The SplitKPlan of a LlamaDecoder for decode buckets (row counts); see the module
    docstring. Measures on CUDA (setting "auto"): call it outside any graph capture."""
    s = resolve_setting(setting)
    rows = sorted({int(b) for b in buckets if b <= MAX_ROWS})
    weights = getattr(model, "weights", None)
    if s in (0, 1) or not rows or getattr(model, "tp", None) is not None or weights is None:
        return SplitKPlan()
    if s == "auto" and weights.device.type != "cuda":
        return SplitKPlan()
    if s != "auto":
        pick = tuple(s if all(splittable(getattr(layer, g), s) for layer in weights.layers) else 1
                     for g in GEMMS)
        return SplitKPlan({m: pick for m in rows}, "fixed")
    t0 = time.perf_counter()
    timings = {(m, g, k): us for m in rows for g in GEMMS for k, us in _measure(model, m, g).items()}
    table = choose_splits(timings)
    plan = SplitKPlan(table, "measured", timings, time.perf_counter() - t0)
    log.info("graphrt: split-K of o / down by decode rows %s (measured in %.2f s)", table, plan.seconds)
    return plan


def choose_splits(timings_us: Mapping[tuple[int, str, int], float]) -> dict[int, tuple[int, int]]:
    """The decision (pure): timings keyed (rows, gemm, S), each (rows, gemm) with S = 1 ->
    rows -> (S_o, S_down): per GEMM the fastest S, if it takes under MARGIN x S = 1's time, else 1."""
    def best(m, g):
        times = {s: us for (r, name, s), us in timings_us.items() if r == m and name == g}
        s = min(times, key=times.get)
        return s if times[s] < MARGIN * times[1] else 1
    return {m: tuple(best(m, g) for g in GEMMS) for m in sorted({r for r, _, _ in timings_us})}


def _measure(model, rows: int, gemm: str) -> dict[int, float]:
    """S -> device µs of one pass over the model's layers of (GEMM `gemm` split S, then its
    add + RMSNorm) at `rows` rows, in one CUDA graph (graph_us)."""
    from graphrt.kernels.fp8 import quantize_rows
    from graphrt.kernels.timing import graph_us
    layers, eps = model.weights.layers, model.spec.rms_norm_eps
    ws = [getattr(layer, gemm) for layer in layers]
    dev, h = model.weights.device, layers[0].post_attn_norm.shape[0]
    x = torch.randn((rows, ws[0].shape[1]), device=dev, dtype=model.dtype)
    x = quantize_rows(x) if model._fp8_in(ws[0]) else x
    residual = torch.zeros((rows, h), device=dev, dtype=model.dtype)
    norm, fp8_out = layers[0].post_attn_norm, model._fp8_in(layers[0].gate_up)
    out = {}
    for s in SPLITS:
        if all(splittable(w, s) for w in ws):
            def run(s=s):
                for w in ws:
                    model.ops.add_rms_norm(model._mm(x, w, split=s), residual, norm, eps, fp8=fp8_out)
            out[s] = graph_us(run, 1, 3)
    return out


__all__ = ["MAX_ROWS", "SPLITS", "SplitKPlan", "choose_splits", "int4_split_config", "plan_splitk",
           "resolve_setting", "split_matmul", "splittable"]
