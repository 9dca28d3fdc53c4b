"""A stats line in the server log every few seconds while requests run.

    stats: running 3, waiting 1 | prompt 512.0 tok/s, generation 95.3 tok/s | KV 12.5% used (40/320 pages)

`StatsLogger` is a daemon thread that reads the same snapshot as `/metrics` (AsyncEngine.stats:
ints read without locks, at most one engine-loop iteration stale) and the server's token
counters. Prompt tokens are the engine's prefilled tokens when its `stats()` reports them
("prompt_tokens"), otherwise those of requests finished in the interval. Idle intervals log
nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("graphrt.serve")


@dataclass(frozen=True)
class Sample:
    """Counters at one instant (monotonic seconds) and the engine gauges."""
    t_s: float
    prompt_tokens: int
    generation_tokens: int
    running: int
    waiting: int
    pages_used: int
    pages_free: int


def stats_line(prev: Sample, cur: Sample) -> str | None:
    """The line for the interval prev -> cur, or None when idle (nothing running or waiting and
    no token produced in the interval)."""
    dp, dg = cur.prompt_tokens - prev.prompt_tokens, cur.generation_tokens - prev.generation_tokens
    if cur.running == 0 and cur.waiting == 0 and dp == 0 and dg == 0:
        return None
    dt = max(cur.t_s - prev.t_s, 1e-9)
    total = cur.pages_used + cur.pages_free
    kv = 100.0 * cur.pages_used / total if total else 0.0
    return (f"stats: running {cur.running}, waiting {cur.waiting} | prompt {dp / dt:.1f} tok/s, "
            f"generation {dg / dt:.1f} tok/s | KV {kv:.1f}% used ({cur.pages_used}/{total} pages)")


class StatsLogger:
    """bridge: the server's AsyncEngine (stats(), engine); metrics: its Metrics. interval_s: 0
    disables the thread."""

    def __init__(self, bridge, metrics, *, interval_s: float = 5.0):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s >= 0:
            raise ValueError(f"interval_s: must be a number >= 0, got {interval_s!r}")
        self.bridge, self.metrics, self.interval_s = bridge, metrics, float(interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        st = self.bridge.stats()
        engine_stats = getattr(self.bridge.engine, "stats", None)
        extra = engine_stats() if callable(engine_stats) else {}
        prompt = extra.get("prompt_tokens", self.metrics.prompt_tokens) if isinstance(extra, dict) \
            else self.metrics.prompt_tokens
        return Sample(time.monotonic(), int(prompt), int(self.metrics.generation_tokens), st.running, st.waiting,
                      st.pages_used, st.pages_free)

    def start(self) -> None:
        if self.interval_s == 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, daemon=True, name="graphrt-serve-stats")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        prev = self.sample()
        while not self._stop.wait(self.interval_s):
            try:
                cur = self.sample()
            except Exception as e:                   # a monitoring thread must not die silently
                log.warning("stats: cannot read the engine (%s)", e)
                continue
            line = stats_line(prev, cur)
            if line is not None:
                log.info("%s", line)
            prev = cur


__all__ = ["StatsLogger", "Sample", "stats_line"]
