"""Decode linear layers: cuBLAS or graphrt's Triton GEMV, whichever measures faster per batch.

    lin = Linear(weight, bias)                 # weight [N, K], bias [N] or None (device tensors)
    lin.choose(batch_sizes)                    # on a GPU, at capture: times both per batch size
    y = lin(x)                                 # x [M, K] -> [M, N]; dispatch on M (host int)

The choice is a pure host-side decision keyed by the row count, made before any graph is
captured, so every captured graph holds one fixed kernel. Without a choice (CPU, prefill rows,
M > 16) the call is `torch.nn.functional.linear` (cuBLAS on CUDA).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graphrt.kernels.gemv import CANDIDATES, MAX_M, GemvConfig, gemv

CUBLAS = "cublas"
L2_BYTES = 128 << 20  # > the H100/H200 L2 (50-60 MB) with margin


class Linear:
    """One weight matrix [N, K] (+ bias [N]) with a per-batch-size kernel choice."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias
        self.choice: dict[int, GemvConfig | None] = {}   # rows -> config (None = cuBLAS)
        self.timings_us: dict[int, dict[str, float]] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.choice.get(x.shape[0])
        if cfg is None:
            return F.linear(x, self.weight, self.bias)
        return gemv(x, self.weight, self.bias, config=cfg)

    def choose(self, batch_sizes, *, reps: int = 20, repeats: int = 5) -> dict[int, str]:
        """Time cuBLAS and each GEMV candidate per batch size and keep the fastest. CUDA only;
        returns names. Timing: one CUDA graph of back-to-back calls rotating over copies of the
        weight that together exceed the L2 (a decode step never finds its weights in L2), CUDA
        events, median of `repeats`."""
        if self.weight.device.type != "cuda":
            return {}
        w_bytes = self.weight.numel() * self.weight.element_size()
        copies = [self.weight] + [self.weight.clone() for _ in range(min(15, L2_BYTES // w_bytes))]
        for m in batch_sizes:
            if m > MAX_M:
                continue
            x = torch.randn((m, self.weight.shape[1]), device=self.weight.device,
                            dtype=self.weight.dtype)

            def run(call):
                for w in copies:
                    call(w)
            times = {CUBLAS: _graph_us(lambda: run(lambda w: F.linear(x, w, self.bias)), reps,
                                       repeats) / len(copies)}
            for c in CANDIDATES:
                times[c.name] = _graph_us(
                    lambda c=c: run(lambda w: gemv(x, w, self.bias, config=c)), reps,
                    repeats) / len(copies)
            best = min(times, key=times.get)
            self.choice[m] = next((c for c in CANDIDATES if c.name == best), None)
            self.timings_us[m] = times
        return {m: (c.name if c else CUBLAS) for m, c in self.choice.items()}


def _graph_us(fn, reps: int, repeats: int) -> float:
    """Median device µs per call of fn, captured `reps` times in one CUDA graph."""
    import statistics
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(out)
