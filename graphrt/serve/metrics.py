"""Server metrics in the Prometheus text exposition format (version 0.0.4), written by hand.

Counters and histograms are updated on the event-loop thread only (where deltas arrive), so they
need no lock. Gauges (running / waiting requests, KV pages) are read from the engine when the
page is rendered (`EngineStats`, see bridge.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# seconds; TPOT of a graph replay is ~1-30 ms on a GPU, a CPU test model ~1-100 ms
TPOT_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "graphrt_"


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine: requests in decode slots / queued, KV pages used / free;
    spec: with speculation, the engine's cumulative counts (proposed, accepted, rounds, emitted);
    prefix_queries / prefix_hits: prompt tokens looked up in the prefix cache / found there;
    mixed: with mixed_prefill_tokens, the prompt chunks and tokens decode blocks carried
    (Engine.mixed_counts: chunks, tokens), else None."""
    running: int
    waiting: int
    pages_used: int
    pages_free: int
    spec: dict | None = None
    prefix_queries: int = 0
    prefix_hits: int = 0
    mixed: dict | None = None


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: le = less than or equal)."""

    def __init__(self, bounds: tuple[float, ...]):
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bounds: must be strictly increasing and non-empty, got {bounds}")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(bounds) + 1)          # last: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"value: must be finite and >= 0, got {value}")
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for b, c in zip(self.bounds + (math.inf,), self.counts):
            acc += c
            le = "+Inf" if b == math.inf else _num(b)
            out.append(f'{name}_bucket{{le="{le}"}} {acc}')
        out += [f"{name}_sum {_num(self.sum)}", f"{name}_count {self.count}"]
        return out


def _num(v: float) -> str:
    return repr(float(v))                              # e.g. 0.001, 1.0 (valid Prometheus floats)


class Metrics:
    """What the server counts: tokens, requests by finish reason, rejections, TTFT, TPOT."""

    def __init__(self):
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.rejected = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)

    def tokens_streamed(self, n: int) -> None:
        """n output tokens reached a client (counted as they stream, not when the request ends)."""
        self.generation_tokens += n

    def request_done(self, *, finish_reason: str, prompt_tokens: int, output_tokens: int,
                     ttft_s: float | None, decode_s: float | None) -> None:
        """One request's totals. decode_s: first output token -> last (TPOT = decode_s / (n - 1))."""
        self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
        self.prompt_tokens += prompt_tokens
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if decode_s is not None and output_tokens >= 2:
            self.tpot.observe(decode_s / (output_tokens - 1))

    def render(self, stats: EngineStats) -> str:
        p = PREFIX
        lines: list[str] = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {p}{name} {help_}")
            lines.append(f"# TYPE {p}{name} {kind}")
            lines.extend(samples)

        metric("requests_running", "gauge", "Requests in decode slots.", [f"{p}requests_running {stats.running}"])
        metric("requests_waiting", "gauge", "Requests queued for a slot or pages.",
               [f"{p}requests_waiting {stats.waiting}"])
        metric("kv_pages_used", "gauge", "KV cache pages held by requests.", [f"{p}kv_pages_used {stats.pages_used}"])
        metric("kv_pages_free", "gauge", "KV cache pages on the free list.", [f"{p}kv_pages_free {stats.pages_free}"])
        metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
               [f"{p}prefix_cache_queries_total {stats.prefix_queries}"])
        metric("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache (not prefilled).",
               [f"{p}prefix_cache_hits_total {stats.prefix_hits}"])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               [f"{p}prompt_tokens_total {self.prompt_tokens}"])
        metric("generation_tokens_total", "counter", "Output tokens streamed to clients.",
               [f"{p}generation_tokens_total {self.generation_tokens}"])
        metric("requests_finished_total", "counter", "Finished requests by finish reason.",
               [f'{p}requests_finished_total{{finish_reason="{k}"}} {v}' for k, v in sorted(self.finished.items())])
        metric("requests_rejected_total", "counter", "Requests refused with 503 (queue full).",
               [f"{p}requests_rejected_total {self.rejected}"])
        metric("time_to_first_token_seconds", "histogram", "Request arrival to first output token.",
               self.ttft.lines(f"{p}time_to_first_token_seconds"))
        metric("time_per_output_token_seconds", "histogram",
               "Per request: (last token time - first token time) / (output tokens - 1).",
               self.tpot.lines(f"{p}time_per_output_token_seconds"))
        if stats.mixed is not None:                  # prompt chunks carried by decode blocks
            metric("prefill_mixed_chunks_total", "counter", "Prompt chunks carried by decode blocks.",
                   [f"{p}prefill_mixed_chunks_total {stats.mixed['chunks']}"])
            metric("prefill_mixed_tokens_total", "counter", "Prompt tokens prefilled inside decode blocks.",
                   [f"{p}prefill_mixed_tokens_total {stats.mixed['tokens']}"])
        if stats.spec is not None:                   # speculative decoding (Engine.spec_counts)
            c = stats.spec
            for key, help_ in (("proposed", "Proposed tokens verified."), ("accepted", "Proposed tokens accepted."),
                               ("rounds", "Speculative rounds run, per request.")):
                metric(f"spec_{key}_total", "counter", help_, [f"{p}spec_{key}_total {c[key]}"])
            rate = c["accepted"] / c["proposed"] if c["proposed"] else 0.0
            per_round = c["emitted"] / c["rounds"] if c["rounds"] else 0.0
            metric("spec_acceptance_rate", "gauge", "Accepted / proposed tokens since start.",
                   [f"{p}spec_acceptance_rate {_num(rate)}"])
            metric("spec_tokens_per_round", "gauge", "Tokens emitted per request and round since start.",
                   [f"{p}spec_tokens_per_round {_num(per_round)}"])
        return "\n".join(lines) + "\n"


__all__ = ["Metrics", "Histogram", "EngineStats", "TPOT_BUCKETS", "TTFT_BUCKETS"]
