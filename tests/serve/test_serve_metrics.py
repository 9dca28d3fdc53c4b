"""graphrt/serve/metrics.py: histogram semantics (cumulative, le inclusive), request accounting,
and the rendered page is valid Prometheus text (checked by _serve_live.parse_metrics)."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("fastapi")   # graphrt.serve imports the app
from graphrt.serve.metrics import EngineStats, Histogram, Metrics
from _serve_live import parse_metrics


def test_histogram_buckets_are_cumulative_and_le_inclusive():
    h = Histogram((0.1, 0.2))
    for v in (0.05, 0.1, 0.15, 0.2, 7.0):
        h.observe(v)
    lines = h.lines("x")
    assert lines == ['x_bucket{le="0.1"} 2', 'x_bucket{le="0.2"} 4', 'x_bucket{le="+Inf"} 5',
                     f"x_sum {0.05 + 0.1 + 0.15 + 0.2 + 7.0!r}", "x_count 5"]


@pytest.mark.parametrize("bounds", [(), (0.2, 0.1), (0.1, 0.1)])
def test_histogram_bad_bounds(bounds):
    with pytest.raises(ValueError, match="^bounds:"):
        Histogram(bounds)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_histogram_bad_value(value):
    with pytest.raises(ValueError, match="^value:"):
        Histogram((1.0,)).observe(value)


def test_render_counts_requests_and_parses():
    m = Metrics()
    m.tokens_streamed(11)
    m.request_done(finish_reason="length", prompt_tokens=5, output_tokens=11, ttft_s=0.02, decode_s=0.1)
    m.tokens_streamed(1)
    m.request_done(finish_reason="abort", prompt_tokens=3, output_tokens=1, ttft_s=None, decode_s=None)
    m.rejected += 2
    got = parse_metrics(m.render(EngineStats(running=1, waiting=2, pages_used=3, pages_free=4)))
    assert got["graphrt_requests_running"] == 1 and got["graphrt_requests_waiting"] == 2
    assert got["graphrt_kv_pages_used"] == 3 and got["graphrt_kv_pages_free"] == 4
    assert got["graphrt_generation_tokens_total"] == 12 and got["graphrt_prompt_tokens_total"] == 8
    assert got['graphrt_requests_finished_total{finish_reason="length"}'] == 1
    assert got['graphrt_requests_finished_total{finish_reason="abort"}'] == 1
    assert got["graphrt_requests_rejected_total"] == 2
    assert got["graphrt_time_per_output_token_seconds_count"] == 1          # 0.1 s / 10 tokens
    assert got["graphrt_time_per_output_token_seconds_sum"] == pytest.approx(0.01)
    assert got['graphrt_time_per_output_token_seconds_bucket{le="0.01"}'] == 1
    assert got['graphrt_time_per_output_token_seconds_bucket{le="0.008"}'] == 0
    assert got["graphrt_time_to_first_token_seconds_count"] == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4096", True])
def test_max_request_bytes_bad_values_name_the_field(bad):
    from graphrt.serve.config import ServeConfig
    with pytest.raises(ValueError, match="^max_request_bytes: must be an int >= 1"):
        ServeConfig(max_request_bytes=bad)


def test_render_speculative_counts():
    m = Metrics()
    plain = parse_metrics(m.render(EngineStats(running=0, waiting=0, pages_used=0, pages_free=1)))
    assert not any(k.startswith("graphrt_spec_") for k in plain)
    spec = {"proposed": 40, "accepted": 30, "rounds": 10, "emitted": 40}
    got = parse_metrics(m.render(EngineStats(running=1, waiting=0, pages_used=2, pages_free=3, spec=spec)))
    assert got["graphrt_spec_proposed_total"] == 40 and got["graphrt_spec_accepted_total"] == 30
    assert got["graphrt_spec_rounds_total"] == 10
    assert got["graphrt_spec_acceptance_rate"] == pytest.approx(0.75)
    assert got["graphrt_spec_tokens_per_round"] == pytest.approx(4.0)
