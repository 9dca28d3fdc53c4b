"""Where start-up time goes: one line that `LLM()` (and so `graphrt serve`) logs when ready.

    t = StartupTimes()                       # the clock starts
    with t.phase("runtime"): ...             # seconds added to a phase (time.perf_counter)
    t.weights_s = checkpoint.load_s          # measured by the loader
    t.from_capture(graph_stats)              # kernels (warm-up: compile or load) vs capture
    t.kernels_loaded, t.kernels_compiled = 37, 0   # with a graph cache (graphrt/cache/triton_cache.py)
    t.from_steps(runtime.steps)              # K decode steps per graph and why (model/steps.py)
    log.info("%s", t.line(pages=.., pool_bytes=..))
    t.as_dict()                              # the same numbers (tools/bench_startup.py's JSON)

Phases: setup (imports of graphrt's kernels, device checks, locating the files), weights (read
from the files; of which config.json read into the model's geometry, and the tensors' bytes), runtime (the model's modules, the KV pool
and the decode buffers; `kv` = the pool's pages and bytes), kernels (the graphs' warm-up runs:
Triton / FlashInfer kernels compiled, or loaded from their caches, and first touch), graphs
(CUDA graph capture; counted per phase: decode, prefill, spec, ...; with a graph cache, the Triton
kernels loaded from it and those compiled outside it), engine (tokenizer, of
which tokenizer.json and the chat template, and scheduler), and the total since
the clock started. The line also names K, the decode steps per graph, and with
steps_per_graph "auto" the measured step it was chosen from (inside the capture phase).
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
    config_s: float = 0.0             # of which config.json -> LlamaSpec (read_spec)
    runtime_s: float = 0.0
    kernels_s: float = 0.0
    graphs_s: float = 0.0
    num_graphs: int = 0
    graphs_by_phase: dict = field(default_factory=dict)   # {phase: graphs captured}, decode first
    capture_s: float = 0.0            # the whole capture call (kernels + graphs + the rest)
    engine_s: float = 0.0
    tokenizer_s: float = 0.0          # of which the tokenizer (tokenizer.json, its config)
    total_s: float = 0.0
    kernels_loaded: int | None = None     # Triton kernels read from a graph cache (None: no graph cache)
    kernels_compiled: int | None = None   # ... and those it lacked (compiled outside it)
    steps_per_graph: int | None = None    # K, decode steps per graph replay (None: not known)
    decode_step_us: float | None = None   # "auto": the measured bucket-1 decode step, device µs
    steps: str = ""                       # K and why, for the line (StepsPlan.describe)
    plans: dict = field(default_factory=dict)   # {plan: s} measured inside the capture call (split-K,
    #                                       steps per graph): ModelRuntime.plan_seconds

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
        phases = [s.key.phase for s in stats if s.key is not None]
        self.graphs_by_phase = {p: phases.count(p) for p in sorted(set(phases), key=phases.index)}

    def from_steps(self, plan) -> None:
        """K and where it came from, from the runtime's StepsPlan (model/steps.py); None: no plan."""
        if plan is not None:
            self.steps_per_graph, self.decode_step_us, self.steps = plan.k, plan.step_us, plan.describe()

    def finish(self) -> None:
        self.total_s = time.perf_counter() - self.t0

    @property
    def other_s(self) -> float:
        """What no phase holds: the total less the phases, and the capture call less its
        warm-up, capture and measured plans (the graph runner's set-up per graph)."""
        other = max(self.total_s - self.setup_s - self.weights_s - self.runtime_s - self.capture_s
                    - self.engine_s, 0.0)
        return other + max(self.capture_s - self.kernels_s - self.graphs_s - self.plans_s, 0.0)

    @property
    def plans_s(self) -> float:
        """Seconds of the plans measured inside the capture call (sum of `plans`)."""
        return sum(self.plans.values())

    def line(self, *, pages: int, pool_bytes: int) -> str:
        """The one summary line (runtime_s includes the weights when they were read inside it)."""
        by_phase = ", ".join(f"{p} {n}" for p, n in self.graphs_by_phase.items())
        how = ("compiled or loaded" if self.kernels_loaded is None else
               f"compiled {self.kernels_compiled} / loaded {self.kernels_loaded} from graph cache")
        graphs = (f"kernels {self.kernels_s:.2f} s ({how}, graph warm-up), graphs "
                  f"{self.graphs_s:.2f} s ({self.num_graphs} captured{': ' + by_phase if by_phase else ''})"
                  if self.num_graphs else "no CUDA graphs (eager decode, kernels compiled at first use"
                  + ("" if self.kernels_loaded is None else f"; so far {how}") + ")")
        return (f"startup: ready in {self.total_s:.2f} s: imports + checks {self.setup_s:.2f} s, weights read "
                f"{self.weights_s:.2f} s (config {self.config_s:.2f} s, tensors {self.read_s:.2f} s), "
                f"runtime + KV pool {self.runtime_s:.2f} s ({pages} pages, {pool_bytes / 2**30:.2f} GiB), "
                f"{graphs}, " + (f"plans {self.plans_s:.2f} s (" + ", ".join(
                    f"{k} {v:.2f} s" for k, v in self.plans.items()) + "), " if self.plans else "")
                + f"engine {self.engine_s:.2f} s (tokenizer {self.tokenizer_s:.2f} s), "
                f"other {self.other_s:.2f} s" + (f"; decode {self.steps}" if self.steps else ""))

    def as_dict(self) -> dict:
        """Every phase's seconds and the graph counts (JSON-ready; t0 left out)."""
        out = {k: v for k, v in vars(self).items() if k != "t0"}
        out["graphs_by_phase"] = dict(self.graphs_by_phase)
        out["other_s"] = self.other_s
        out["plans"] = dict(self.plans)
        out["plans_s"] = self.plans_s
        return out


__all__ = ["StartupTimes"]
