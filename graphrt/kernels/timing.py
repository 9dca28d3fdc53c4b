"""Device time of GPU work: CUDA events over back-to-back calls, and calls captured in a graph.

    us = events_us(fn, reps=20, repeats=5)   # median over bursts of the mean µs per fn() call
    g = capture(fn, calls=20)                # warm-up on a side stream, then fn() x 20 in one graph
    us = graph_us(fn, reps=20, repeats=5)    # µs per fn() call inside one CUDA graph

The one timing mechanism of graphrt and its tools: kernel choices at capture time
(model/linear.py), the executor's step costs, the all-reduce table (parallel/allreduce.py)
and the benchmarks under tools/. CUDA only; each call synchronizes on its last event.
"""
from __future__ import annotations

import statistics

import torch


def events_us(fn, reps: int, repeats: int = 1, *, warmup: int = 0) -> float:
    """Median over `repeats` bursts of the mean device µs per call of fn() on the current CUDA
    stream (`reps` calls per burst between two events); `warmup` untimed calls first."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(out)


def capture(fn, calls: int = 1, *, warmup: int = 3, mode: str = "global") -> torch.cuda.CUDAGraph:
    """A CUDA graph of fn() called `calls` times (static inputs), after `warmup` eager calls on
    a side stream (lazy initialisation, allocator pools) as torch's capture recipe asks. mode:
    torch's capture_error_mode ("thread_local" for collectives: the process group's watchdog
    thread queries CUDA events during capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode=mode):
        for _ in range(calls):
            fn()
    return g


def graph_us(fn, reps: int, repeats: int, *, mode: str = "global") -> float:
    """Median device µs per call of fn, captured `reps` times in one CUDA graph (one untimed
    replay first); mode as `capture`'s."""
    g = capture(fn, reps, mode=mode)
    g.replay()
    return events_us(g.replay, 1, repeats) / reps


__all__ = ["capture", "events_us", "graph_us"]
