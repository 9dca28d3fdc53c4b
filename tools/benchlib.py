"""Helpers shared by the benchmarks under tools/ (timing per METHOD.md: events, warm-up, medians)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def median_burst(fn, steps, repeats, sync):
    """Median over `repeats` bursts of the mean host time per call, in µs."""
    per = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        per.append((time.perf_counter() - t0) / steps * 1e6)
    sync()
    return statistics.median(per)


def median_sync_step(fn, steps, sync):
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def device_us(replay, torch, reps=50, repeats=5):
    """Median device µs per replay() (graphrt.kernels.timing.events_us)."""
    from graphrt.kernels.timing import events_us
    return events_us(replay, reps, repeats)


def copy_bandwidth(torch) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), 2 GiB buffers."""
    src = torch.randn(512 << 20, device="cuda")  # 2 GiB fp32
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = device_us(lambda: dst.copy_(src), torch, reps=10, repeats=3) / 1e3
    return 2 * src.numel() * 4 / (ms * 1e-3)


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None (and a note) when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG (pip install matplotlib)", file=sys.stderr)
        return None
    return plt


def k_or_auto(text: str):
    """--steps-per-graph: "auto" or an int >= 1 (argparse type)."""
    if text == "auto":
        return text
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected auto or an int >= 1, got {text!r}")
    return k
