"""CUDA graph capture and replay per bucket: the mechanism (which bucket is decided elsewhere).

Buckets are captured largest first into one shared memory pool, each after a labelled warm-up
on a side stream (JIT compilation, workspace first-touch and allocator growth stay out of the
graph). Capture time and the pool memory each capture added are recorded per bucket.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

WARMUP_STEPS = 2


@dataclass(frozen=True)
class CaptureStats:
    bucket: int
    capture_ms: float     # warm-up excluded
    warmup_ms: float
    graph_bytes: int      # growth of the shared pool's reserved memory during this capture


class GraphManager:
    """Owns the captured graphs and their shared memory pool, keyed by bucket size."""

    def __init__(self, device: torch.device, *, capture_error_mode: str = "global"):
        """capture_error_mode: torch.cuda.graph's; "thread_local" when other threads may touch
        CUDA during capture (the NCCL process group's watchdog queries its events)."""
        if device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, got {device}")
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode: {capture_error_mode!r} is not 'global', "
                             f"'thread_local' or 'relaxed'")
        self.device, self.capture_error_mode = device, capture_error_mode
        self._pool = None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.stats: dict[int, CaptureStats] = {}

    def __contains__(self, bucket: int) -> bool:
        return bucket in self._graphs

    def capture(self, bucket: int, step: Callable[[], None]) -> CaptureStats:
        """Warm `step` up on a side stream, then capture it as bucket's graph."""
        if bucket in self._graphs:
            raise RuntimeError(f"bucket {bucket}: already captured")
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):  # warm-up: compile, first-touch, allocator growth
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        t1 = time.perf_counter()
        torch.cuda.empty_cache()  # release cached blocks so the pool's growth is all we count
        reserved0 = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode=self.capture_error_mode):
            step()
        torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[bucket] = graph
        stats = CaptureStats(bucket, (t2 - t1) * 1e3, (t1 - t0) * 1e3,
                             torch.cuda.memory_reserved(self.device) - reserved0)
        self.stats[bucket] = stats
        return stats

    def replay(self, bucket: int) -> None:
        self._graphs[bucket].replay()

    def drop(self, bucket: int) -> None:
        """Forget bucket's graph (and its stats), e.g. after it failed verification; no-op if
        absent. Its memory returns to the shared pool (released with the last graph)."""
        graph = self._graphs.pop(bucket, None)
        self.stats.pop(bucket, None)
        if graph is not None:
            graph.reset()
        if not self._graphs:
            self._pool = None  # the next capture starts a fresh pool
