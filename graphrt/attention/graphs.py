"""The graphed-step runner: capture and replay of every phase's step, keyed by a descriptor.

    graphs = GraphRunner(device, warmup_steps=1, pdl=True)   # capture_error_mode="thread_local" under TP
    key = GraphKey("decode", bucket=4, steps=K, sampled=True)
    graphs.capture(key, step, inputs=[(seq_lens, 1), (block_table, 0)], scratch=kv_caches,
                   prepare=host_plan)                     # warm-up + capture, inputs restored
    graphs.run(key, step, prepare=host_plan)              # replay (or `step()` eagerly if not captured)
    us = graphs.time_us(key, inputs=[...], scratch=kv_caches)   # device µs per replay (CUDA events)

It is the only place graphrt captures a CUDA graph: attention decode (DecodeRuntime), the model's
K-step decode (ModelRuntime) and speculative rounds (SpeculativeRunner) are phases that hand it
a step function (a pure device function of persistent buffers) and a key. The capture set-up is
written once here:
- inputs: (tensor, value) pairs filled for the warm-up and the capture (e.g. every row a
  1-token request on page 0, or empty slots), restored afterwards to what the caller had;
- scratch: KV caches whose page 0 the warm-up and capture may write: saved and restored;
- prepare: host-side preparation run before the warm-up, before the capture and before every
  replay (a host-planning attention backend writes its plan into the captured workspace);
- one memory pool for every graph (captured largest first by the callers), a warm-up on a side
  stream (compilation, first touch and allocator growth stay out of the graph): one run of the
  step (warmup_steps=N: N runs, RuntimeOptions.graph_warmup / GRAPHRT_GRAPH_WARMUP; each costs
  about as much host time as the capture itself: a second took a warm 1B start's kernels phase
  from 1.04 to 1.48 s on the H200, and the GPU tests pass with one; measured 2026-12-06);
- pdl: whether graphrt's Triton kernels launched by a warm-up, a capture or an eager run use
  programmatic dependent launch (kernels/launch.py's pdl_scope around each; RuntimeOptions.pdl);
- capture_error_mode: "thread_local" when other threads touch CUDA during capture (the NCCL
  process group's watchdog of a tensor-parallel model).
On a CPU device nothing is captured: `run` calls the step eagerly (the same code path).
The decision of which key to run (bucket choice, greedy or sampled, decode or speculative) is
the phases' (a pure function); this module is only the mechanism.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from graphrt.kernels.launch_options import pdl_scope


@dataclass(frozen=True)
class GraphKey:
    """What a graph computes. phase: "attention" | "decode" | "spec" | "prefill" |
    "draft_prefill" (a prefill piece of query_len tokens, model/prefill_graphs.py) |
    "eagle_first" (an EAGLE-3 head's first draft after bucket prompts, speculative/eagle3/prompt.py);
    bucket: rows; query_len: query tokens per row (1 for decode, k + 1 for a verify);
    steps: decode steps or speculative rounds per replay; sampled: draws with the per-row
    sampling parameters instead of the argmax; filtered: applies per-row top-k / top-p to
    verified logits (speculative rounds) or, in a processed decode graph, sorts for them;
    processed: applies the per-row logits processing and records log-probabilities
    (model/processing.py, model/logprobs.py); chunk: prompt tokens a decode graph's first
    step also prefills for one slot (model/mixed.py; 0 = none)."""

    phase: str
    bucket: int
    query_len: int = 1
    steps: int = 1
    sampled: bool = False
    filtered: bool = False
    processed: bool = False
    chunk: int = 0


@dataclass(frozen=True)
class CaptureStats:
    bucket: int
    capture_ms: float     # warm-up excluded
    warmup_ms: float
    graph_bytes: int      # growth of the shared pool's reserved memory during this capture
    key: GraphKey | None = None


class GraphRunner:
    """Owns every captured graph of one runtime and their shared memory pool. warmup_steps: runs
    of a step before its capture (an int >= 1); pdl: graphrt's Triton kernels launched through
    this runner use programmatic dependent launch where the device supports it."""

    def __init__(self, device, *, capture_error_mode: str = "global", warmup_steps: int = 1, pdl: bool = True):
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode: {capture_error_mode!r} is not 'global', "
                             f"'thread_local' or 'relaxed'")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"warmup_steps: must be an int >= 1, got {warmup_steps!r}")
        if not isinstance(pdl, bool):
            raise ValueError(f"pdl: expected a bool, got {pdl!r}")
        self.device, self.capture_error_mode = torch.device(device), capture_error_mode
        self.warmup_steps, self.pdl = warmup_steps, pdl
        self._pool = None
        self._graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self.stats: dict[GraphKey, CaptureStats] = {}

    @property
    def enabled(self) -> bool:
        """Whether graphs are captured at all (a CUDA device); elsewhere `run` is eager."""
        return self.device.type == "cuda"

    def __contains__(self, key: GraphKey) -> bool:
        return key in self._graphs

    def keys(self) -> list[GraphKey]:
        return list(self._graphs)

    def capture(self, key: GraphKey, step: Callable[[], None], *,
                inputs: Iterable[tuple[torch.Tensor, object]] = (), scratch: Sequence = (),
                prepare: Callable[[], None] | None = None) -> CaptureStats | None:
        """Warm `step` up on a side stream, then capture it as `key`'s graph (see the module
        docstring for inputs / scratch / prepare). None on a non-CUDA device (nothing to do)."""
        if key in self._graphs:
            raise RuntimeError(f"{key}: already captured")
        if not self.enabled:
            return None
        with _filled(inputs), _page0_kept(scratch), pdl_scope(self.pdl):
            graph, stats = self._record(key, step, prepare)
        self._graphs[key] = graph
        self.stats[key] = stats
        return stats

    def _record(self, key: GraphKey, step, prepare):
        """The CUDA part of a capture (inside the set-up): warm-up on a side stream, then the
        capture into the shared pool -> (graph, stats)."""
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup_steps):  # warm-up: compile, first-touch, allocator growth
                if prepare is not None:
                    prepare()
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        t1 = time.perf_counter()
        torch.cuda.empty_cache()  # release cached blocks so the pool's growth is all we count
        reserved0 = torch.cuda.memory_reserved(self.device)
        if prepare is not None:
            prepare()                # the captured workspace holds a plan for the capture
        graph = torch.cuda.CUDAGraph()
        gc_was = gc.isenabled()  # no collection mid-capture: a CUDAGraph of an earlier runtime freed
        gc.disable()             # by the collector then invalidates the capture (collecting here
        #                          instead costs a full gc per graph: torch stopped doing it)
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode=self.capture_error_mode):
                step()
        finally:
            if gc_was:
                gc.enable()
        torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        if self._pool is None:
            self._pool = graph.pool()
        return graph, CaptureStats(key.bucket, (t2 - t1) * 1e3, (t1 - t0) * 1e3,
                                   torch.cuda.memory_reserved(self.device) - reserved0, key)

    def run(self, key: GraphKey, step: Callable[[], None], *,
            prepare: Callable[[], None] | None = None) -> bool:
        """prepare() (if given), then replay key's graph, or run `step` eagerly when it was not
        captured. Returns whether a graph was replayed."""
        if prepare is not None:
            prepare()
        if key not in self._graphs:
            with pdl_scope(self.pdl):
                step()
            return False
        self._graphs[key].replay()
        return True

    def time_us(self, key: GraphKey, *, inputs: Iterable[tuple[torch.Tensor, object]] = (),
                scratch: Sequence = (), reps: int = 5, repeats: int = 3) -> float:
        """Device µs per replay of key's graph (kernels/timing.py events_us: the median over
        `repeats` bursts of `reps` replays, one untimed replay first), with `inputs` filled and
        the page 0 of `scratch` kept as for its capture, both restored afterwards. The inputs
        are filled once: a graph that advances them (decode: seq_lens) runs 1 + reps * repeats
        replays from there. CUDA only (a captured key)."""
        from graphrt.kernels.timing import events_us
        graph = self._graphs[key]
        with _filled(inputs), _page0_kept(scratch):
            return events_us(graph.replay, reps, repeats, warmup=1)

    def drop(self, key: GraphKey) -> None:
        """Forget key's graph (and its stats), e.g. after it failed verification; no-op if
        absent. Its memory returns to the shared pool (released with the last graph)."""
        graph = self._graphs.pop(key, None)
        self.stats.pop(key, None)
        if hasattr(graph, "reset"):
            graph.reset()
        if not self._graphs:
            self._pool = None  # the next capture starts a fresh pool

    def stats_by_bucket(self, phase: str | None = None) -> dict[int, CaptureStats]:
        """CaptureStats of one phase's graphs (or all: the last per bucket) keyed by bucket."""
        return {k.bucket: s for k, s in self.stats.items() if phase is None or k.phase == phase}


@contextmanager
def _filled(inputs):
    """Fill each (tensor, value) for the capture; put the caller's contents back after."""
    inputs = list(inputs)
    saved = [t.clone() for t, _ in inputs]
    try:
        for t, value in inputs:
            t.fill_(value)
        yield
    finally:
        for (t, _), s in zip(inputs, saved):
            t.copy_(s)


@contextmanager
def _page0_kept(caches):
    """The warm-up and capture may write K/V into page 0 (a 1-token request on page 0): keep it."""
    saved = [(c.k[0].clone(), c.v[0].clone()) for c in caches]
    try:
        yield
    finally:
        for c, (k0, v0) in zip(caches, saved):
            c.k[0].copy_(k0)
            c.v[0].copy_(v0)


__all__ = ["GraphRunner", "GraphKey", "CaptureStats"]
