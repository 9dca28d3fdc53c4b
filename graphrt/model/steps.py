"""K, the decode steps a graph replay runs: the setting, and "auto"'s choice from the measured step.

    check_steps("auto"); check_steps(4)                # graphrt/config.py: ValueError naming the field
    steps_for_step_us(4800.0)                          # 1: a long step (8B bf16)
    steps_for_step_us(900.0)                           # 4: a short step (1B, tiny models)
    plan = StepsPlan(k=1, step_us=4812.0, source="measured", seconds=0.3)
    plan.describe()                                    # "K=1 (auto: bucket-1 decode step 4812 us ...)"

Why K matters. A block of K steps is one graph replay; the engine's host work per block (read the
last block's tokens, check stops, stream, admit: about 0.1-0.3 ms) runs once per block while the
next block runs on the device. A larger K hides more host work behind the device; its cost is
latency: a request that arrives while a block runs waits for that block, up to K - 1 steps more
than at K = 1, before its prompt is prefilled.

Measured through `graphrt serve` on an H200 (tools/bench_serve.py, 2 and 8 clients; TTFT p50 ms /
TPOT p50 ms / tokens per second):
- Llama-3.1-8B bf16, one bucket-1 step about 4.8 ms:
  K=4: 2 clients 41.7 / 4.79 / 384, 8 clients 150.7 / 5.52 / 1160;
  K=1 (max_prefill_stall None): 2 clients 18.9 / 4.75 / 390, 8 clients 113.2 / 5.11 / 1345.
  K=1 wins every column: the host's per-block work hides behind one step anyway, and a waiting
  request's first token is not held for up to K - 1 steps.
- Tiny and 1B models, one step 0.2-1.2 ms: the host's per-block work is a large share of a step,
  and K=4 keeps it from showing (the 1B arrival workload with mixed prompt chunks: TPOT
  p99 / steady 1.31 at K=4 against 2.22 at K=1).

So "auto" (`steps_for_step_us`): K = 1 where the measured bucket-1 decode step takes at least
ONE_STEP_FROM_US (2 ms: about 10x the host's per-block work, between the two groups above), else
AUTO_STEPS (4). The step is measured by ModelRuntime.capture (model/runtime.py: the bucket-1
greedy graph at K = 1, timed with CUDA events, then dropped). Where nothing can be timed (CPU,
graphs not captured) "auto" is AUTO_STEPS, deterministically.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from graphrt.config import AUTO_STEPS, STEPS_AUTO as AUTO, check_steps

ONE_STEP_FROM_US = 2000.0    # a measured bucket-1 step at least this long (device µs): K = 1
SOURCES = ("fixed", "measured", "default", "host planning", "cached")


def steps_for_step_us(step_us: float) -> int:
    """"auto"'s K for a measured bucket-1 decode step of `step_us` device µs: 1 when step_us >=
    ONE_STEP_FROM_US, else AUTO_STEPS. Pure; ValueError for a time that is not a number > 0."""
    if isinstance(step_us, bool) or not isinstance(step_us, (int, float)) or not math.isfinite(step_us) \
            or step_us <= 0:
        raise ValueError(f"step_us: expected a measured step time > 0 (µs), got {step_us!r}")
    return 1 if step_us >= ONE_STEP_FROM_US else AUTO_STEPS


@dataclass(frozen=True)
class StepsPlan:
    """K as a runtime runs it and where it came from. k: decode steps per graph replay; source:
    "fixed" (an int given), "measured" ("auto", from step_us), "cached" ("auto", K and step_us
    measured by an earlier start: model/plans.py), "default" ("auto" without a measurement:
    AUTO_STEPS), "host planning" (a host-planning backend runs one step per graph);
    step_us: the measured device µs of one bucket-1 greedy decode step (None unless measured);
    seconds: host seconds the measurement took (its graph's capture and replays)."""
    k: int
    source: str = "fixed"
    step_us: float | None = None
    seconds: float = 0.0

    def __post_init__(self):
        check_steps(self.k)
        if self.source not in SOURCES:
            raise ValueError(f"source: {self.source!r} is not one of {SOURCES}")

    def describe(self) -> str:
        """One phrase for the start-up log."""
        if self.source == "measured":
            cmp = ">=" if self.step_us >= ONE_STEP_FROM_US else "<"
            return (f"K={self.k} (auto: bucket-1 decode step {self.step_us:.0f} us {cmp} "
                    f"{ONE_STEP_FROM_US:.0f} us, measured in {self.seconds:.2f} s)")
        if self.source == "cached":
            return f"K={self.k} (auto: bucket-1 decode step {self.step_us:.0f} us, measured by the graph cache's capture)"
        if self.source == "default":
            return f"K={self.k} (auto: no CUDA graph to time, the default)"
        if self.source == "host planning":
            return f"K={self.k} (host planning: one step per graph)"
        return f"K={self.k} (steps_per_graph={self.k})"


__all__ = ["AUTO", "AUTO_STEPS", "ONE_STEP_FROM_US", "StepsPlan", "steps_for_step_us"]
