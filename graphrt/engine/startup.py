"""Where start-up time goes: one line that `LLM()` (and so `graphrt serve`) logs when ready.

    t = StartupTimes()                       # the clock starts
    with t.phase("runtime"): ...             # seconds added to a phase (time.perf_counter)
    t.weights_s = checkpoint.load_s          # measured by the loader
    t.from_capture(graph_stats)              # kernels (warm-up: compile or load) vs capture
    log.info("%s", t.line(pages=.., pool_bytes=..))

Phases: setup (imports of graphrt's kernels, device checks, locating the files), weights (read
from the files), runtime (the model's modules, the KV pool and the
decode buffers; `kv` = the pool's pages and bytes), kernels (the graphs' warm-up runs: Triton
/ FlashInfer kernels compiled, or loaded from their caches, and first touch), graphs (CUDA
graph capture), engine (tokenizer and scheduler), and the total since the clock started.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StartupTimes:
    """Seconds per start-up phase (host wall clock); t0: time.perf_counter() at the start."""
    t0: float = field(default_factory=time.perf_counter)
    setup_s: float = 0.0              # imports (torch, Triton kernels), device checks, locating files
    weights_s: float = 0.0            # the checkpoint: opened, parsed, its modules imported, read
    read_s: float = 0.0               # of which the tensors' bytes (the loader's load_s)
    runtime_s: float = 0.0
    kernels_s: float = 0.0
    graphs_s: float = 0.0
    num_graphs: int = 0
    capture_s: float = 0.0            # the whole capture call (kernels + graphs + the rest)
    engine_s: float = 0.0
    total_s: float = 0.0

    @contextmanager
    def phase(self, name: str):
        """Add the block's wall time to `<name>_s`."""
        t = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, f"{name}_s", getattr(self, f"{name}_s") + time.perf_counter() - t)

    def from_capture(self, stats) -> None:
        """Split the capture call by the graph runner's CaptureStats (warmup_ms, capture_ms)."""
        stats = list(stats)
        self.num_graphs = len(stats)
        self.kernels_s = sum(s.warmup_ms for s in stats) / 1e3
        self.graphs_s = sum(s.capture_ms for s in stats) / 1e3

    def finish(self) -> None:
        self.total_s = time.perf_counter() - self.t0

    def line(self, *, pages: int, pool_bytes: int) -> str:
        """The one summary line (runtime_s includes the weights when they were read inside it)."""
        graphs = (f"kernels {self.kernels_s:.2f} s (compiled or loaded, graph warm-up), graphs "
                  f"{self.graphs_s:.2f} s ({self.num_graphs} captured)" if self.num_graphs else
                  "no CUDA graphs (eager decode, kernels compiled at first use)")
        other = max(self.total_s - self.setup_s - self.weights_s - self.runtime_s - self.capture_s
                    - self.engine_s, 0.0)
        rest = max(self.capture_s - self.kernels_s - self.graphs_s, 0.0)
        return (f"startup: ready in {self.total_s:.2f} s: imports + checks {self.setup_s:.2f} s, weights read "
                f"{self.weights_s:.2f} s (tensors {self.read_s:.2f} s), runtime + KV pool "
                f"{self.runtime_s:.2f} s ({pages} pages, {pool_bytes / 2**30:.2f} GiB), {graphs}, "
                f"engine {self.engine_s:.2f} s, other {other + rest:.2f} s")


__all__ = ["StartupTimes"]
