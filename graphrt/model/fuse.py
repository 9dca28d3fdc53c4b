"""The decode step's norms and SiLU-mul fused into its GEMVs, and the choice per row count.

    plan = plan_fuse(model, buckets, splitk=splitk_plan)   # FusePlan: decode rows M -> LayerGemvs | None
    logits = model.decode_step(ctx, tokens, fuse=plan.get(M))

At batch 1 the 1B step is launch-bound (shared model-step profile: ~4.5 µs of latency per launch
against ~3.2 µs of bytes). Three launches per layer stream no weights: the add+RMSNorm after o,
SiLU-mul, the add+RMSNorm after down. The fused layer (`LlamaDecoder._layers` with `fuse=`):

    qkv  = gemv(residual, W_qkv, norm=input_norm)          # RMSNorm in the prologue
    ...  rope_append, attention
    gemv(a, W_o, residual=residual)                        # residual += a @ W_o.T (epilogue)
    gu   = gemv(residual, W_gate_up, norm=post_attn_norm)
    gemv(gu, W_down, silu=True, residual=residual)         # SiLU-mul in the prologue, add after

The residual add moves into the epilogue of the GEMM before it (each program owns a tile of the
new residual); the norm, which needs a whole row, moves into the prologue of the GEMM after it
(every program reads the whole M x K rows: a kernel boundary is the grid-wide sync). Removed:
3 launches per layer (16 layers of the 1B model: 48 of its ~183 per step); the first layer's
rms_norm goes into the first qkv GEMV and the final norm stays one rms_norm before the LM head.
Rounding: SiLU-mul and the residual add are the unfused kernels' bit for bit (kernels/gemv.py);
the norm's sum of squares may differ from rms_norm's by an ulp; the GEMV's accumulation order is
not cuBLAS's.

Where: decode buckets M <= MAX_ROWS (the GEMV's rows), a single-rank model whose qkv / o /
gate_up / down are plain row-major tensors in the model dtype (`fusable`: FP8 weights keep
their W8A8 path; under tensor parallelism the o / down outputs are all-reduced before the
residual add, which the epilogue cannot do); verify and prefill steps never fuse.

The choice (`plan_fuse`), once per ModelRuntime before its first capture, after split-K:
setting "auto" reads GRAPHRT_FUSE (the A/B switch of tools/profile_step.py and
tools/bench_e2e.py; unset = "auto"). ModelRuntime's default is "off": on the H200 the fused
GEMVs measured 2.6x slower than the unfused kernels (docs/benchmarks.md).
- "auto": on CUDA measured per bucket: each GEMM's fused GEMV per config of
  graphrt.kernels.gemv.CANDIDATES over all layers' weights (one CUDA graph each, graph_us), the
  fastest config per GEMM; then one graph of the fused layer GEMMs (4 launches a layer) against
  one of the unfused ones (cuBLAS with the bucket's split-K, add+RMSNorm, SiLU-mul: 7 a layer)
  over every layer; fused is kept where it takes under MARGIN x the unfused time. On CPU: off.
- "on" / "1": fused at every bucket M <= MAX_ROWS (configs measured on CUDA, the default
  config on CPU: the tests' forced path); "off" / "0": never.
A bucket that runs fused runs split-K (1, 1).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.gemv import CANDIDATES, MAX_M, GemvConfig, gemv
from graphrt.kernels.norm import add_rms_norm

log = logging.getLogger("graphrt.model")

ENV = "GRAPHRT_FUSE"
MAX_ROWS = MAX_M            # the GEMV's rows
MARGIN = 0.97               # fused must take under MARGIN x the unfused time
GEMMS = ("qkv", "o", "gate_up", "down")
SETTINGS = {"auto": "auto", "on": "on", "1": "on", "off": "off", "0": "off"}


@dataclass(frozen=True)
class LayerGemvs:
    """The GEMV config of each fused GEMM of a layer (every layer the same): qkv (RMSNorm
    prologue), o (residual-add epilogue), gate_up (RMSNorm prologue), down (SiLU-mul prologue,
    residual-add epilogue)."""
    qkv: GemvConfig = CANDIDATES[1]
    o: GemvConfig = CANDIDATES[1]
    gate_up: GemvConfig = CANDIDATES[1]
    down: GemvConfig = CANDIDATES[1]

    @property
    def names(self) -> dict[str, str]:
        return {g: getattr(self, g).name for g in GEMMS}


@dataclass(frozen=True)
class FusePlan:
    """Fused layers by decode row count: table rows M -> LayerGemvs (rows not listed: unfused);
    source "off", "fixed" or "measured"; timings_us keyed (M, what): what = "fused" /
    "unfused" (one pass over the layers' GEMMs and small kernels) or (gemm, config name) (that
    fused GEMV over all layers); seconds: host time the choice took."""
    table: Mapping[int, LayerGemvs] = field(default_factory=dict)
    source: str = "off"
    timings_us: Mapping[tuple, float] = field(default_factory=dict)
    seconds: float = 0.0

    def get(self, rows: int) -> LayerGemvs | None:
        return self.table.get(rows)


def resolve_setting(setting) -> str:
    """"auto" (-> GRAPHRT_FUSE when set, else "auto"), "on" / "1", "off" / "0" (also bools and
    ints 0 / 1) -> "auto", "on" or "off"; ValueError otherwise."""
    source = "fuse"
    if setting == "auto":
        setting, source = os.environ.get(ENV, "auto").strip().lower() or "auto", ENV
    if isinstance(setting, (bool, int)) and setting in (0, 1):
        setting = "on" if setting else "off"
    if not isinstance(setting, str) or setting.lower() not in SETTINGS:
        raise ValueError(f"{source}: expected 'auto', 'on' / 1 or 'off' / 0, got {setting!r}")
    return SETTINGS[setting.lower()]


def fusable(model) -> bool:
    """Can every decode layer of `model` (a LlamaDecoder) run fused? Single rank, and qkv / o /
    gate_up / down plain row-major tensors in the model dtype (qkv's bias allowed)."""
    weights = getattr(model, "weights", None)
    if weights is None or getattr(model, "tp", None) is not None:
        return False

    def plain(w):
        return (isinstance(w, torch.Tensor) and w.dim() == 2 and w.stride(1) == 1
                and w.dtype == getattr(model, "dtype", None))
    layers = getattr(weights, "layers", ())
    return bool(layers) and all(plain(getattr(layer, g, None)) for layer in layers for g in GEMMS)


def plan_fuse(model, buckets, setting="auto", *, splitk=None) -> FusePlan:
    """The FusePlan of a LlamaDecoder for decode buckets (row counts); see the module docstring.
    splitk: the runtime's SplitKPlan (the unfused side of the measurement runs its S). Measures
    on CUDA: call it outside any graph capture."""
    s = resolve_setting(setting)
    rows = sorted({int(b) for b in buckets if b <= MAX_ROWS})
    if s == "off" or not rows or not fusable(model):
        return FusePlan()
    cuda = model.weights.device.type == "cuda"
    if not cuda:
        return FusePlan({m: LayerGemvs() for m in rows}, "fixed") if s == "on" else FusePlan()
    t0 = time.perf_counter()
    timings: dict[tuple, float] = {}
    table = {}
    for m in rows:
        table[m] = measure(model, m, timings, compare=s == "auto",
                           split=(1, 1) if splitk is None else splitk.get(m))
    table = {m: c for m, c in table.items() if s == "on" or choose_fused(timings, m)}
    plan = FusePlan(table, "measured" if s == "auto" else "fixed", timings, time.perf_counter() - t0)
    log.info("graphrt: fused norm / SiLU GEMVs at decode rows %s of %s (%s in %.2f s)", sorted(table), rows,
             plan.source, plan.seconds)
    return plan


def choose_fused(timings_us: Mapping[tuple, float], rows: int) -> bool:
    """The decision (pure): run `rows` fused when its "fused" pass takes under MARGIN x the
    "unfused" one (a tie keeps the unfused path)."""
    return timings_us[(rows, "fused")] < MARGIN * timings_us[(rows, "unfused")]


def measure(model, rows: int, timings: dict, *, compare: bool, split=(1, 1)) -> LayerGemvs:
    """Time each fused GEMV per config over all layers at `rows` rows into timings[(rows, (gemm,
    config name))] and return the fastest configs; compare: also time one pass of the fused
    layers (timings[(rows, "fused")]) and of the unfused ones with split-K `split` ("unfused").
    Device µs from _graph_us (CUDA graphs)."""
    bufs = _Buffers(model, rows)
    for g in GEMMS:
        for c in CANDIDATES:
            try:            # a config the device cannot run fails in the eager warm-up, before capture
                timings[(rows, (g, c.name))] = _graph_us(lambda g=g, c=c: bufs.fused_gemm(g, c))
            except OutOfResources as e:
                log.warning("graphrt: fused GEMV %s %s skipped: %s", g, c.name, e)
                timings[(rows, (g, c.name))] = float("inf")
    best = LayerGemvs(*(min(CANDIDATES, key=lambda c, g=g: timings[(rows, (g, c.name))]) for g in GEMMS))
    if compare:
        timings[(rows, "fused")] = _graph_us(lambda: bufs.fused_layers(best))
        timings[(rows, "unfused")] = _graph_us(lambda: bufs.unfused_layers(split))
    return best


def _graph_us(fn) -> float:
    from graphrt.kernels.timing import graph_us
    return graph_us(fn, 1, 3)


class _Buffers:
    """Activations of `rows` decode rows for the measurement (device, model dtype): residual
    [M, H], attn [M, Hq * D] (the o GEMM's input), gate_up [M, 2I] (down's)."""

    def __init__(self, model, rows: int):
        w, dev, dt = model.weights, model.weights.device, model.dtype
        layer = w.layers[0]
        self.model, self.eps = model, model.spec.rms_norm_eps
        self.residual = torch.randn((rows, layer.o.shape[0]), device=dev, dtype=dt)
        self.attn = torch.randn((rows, layer.o.shape[1]), device=dev, dtype=dt)
        self.gate_up = torch.randn((rows, layer.gate_up.shape[0]), device=dev, dtype=dt)

    def fused_gemm(self, gemm: str, c: GemvConfig) -> None:
        """One fused GEMV `gemm` per layer with config c."""
        for layer in self.model.weights.layers:
            self._fused(layer, gemm, c)

    def _fused(self, layer, gemm, c):
        r, eps = self.residual, self.eps
        if gemm == "qkv":
            return gemv(r, layer.qkv, layer.qkv_bias, norm=layer.input_norm, eps=eps, config=c)
        if gemm == "o":
            return gemv(self.attn, layer.o, residual=r, config=c)
        if gemm == "gate_up":
            return gemv(r, layer.gate_up, norm=layer.post_attn_norm, eps=eps, config=c)
        return gemv(self.gate_up, layer.down, silu=True, residual=r, config=c)

    def fused_layers(self, cfg: LayerGemvs) -> None:
        for layer in self.model.weights.layers:
            for g in GEMMS:
                self._fused(layer, g, getattr(cfg, g))

    def unfused_layers(self, split: tuple[int, int]) -> None:
        """The same GEMMs unfused: qkv, o (split S_o) + add+RMSNorm, gate_up + SiLU-mul, down
        (split S_down) + add+RMSNorm, per layer (LlamaDecoder._layers' kernels, no attention)."""
        model, r, eps = self.model, self.residual, self.eps
        h = r
        for layer in model.weights.layers:
            F.linear(h, layer.qkv, layer.qkv_bias)
            h = add_rms_norm(model._mm(self.attn, layer.o, split=split[0]), r, layer.post_attn_norm, eps)
            m = silu_mul(F.linear(h, layer.gate_up))
            h = add_rms_norm(model._mm(m, layer.down, split=split[1]), r, layer.input_norm, eps)


__all__ = ["ENV", "MAX_ROWS", "FusePlan", "LayerGemvs", "choose_fused", "fusable", "measure", "plan_fuse",
           "resolve_setting"]
