"""Load generator for tools/bench_serve.py: streaming completion clients over plain HTTP/1.1.

    r = stream_request(port, prompt_ids, 128, timeout=60, model="bench")
    point = run_point(port, prompts, 8, output_len=128, time_budget_s=60, model="bench")

Each client thread sends its prompts one after another (http.client, one connection per
request); timestamps are taken when each SSE event arrives. Per request: TTFT (send -> first
event carrying tokens) and TPOT ((last token event - first) / (tokens - 1)); per point:
nearest-rank p50 / p99 over requests (ms) and output tokens/s over the point's wall time.
"""
from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time


def stream_request(port: int, prompt: list[int], max_tokens: int, timeout: float, *, model: str) -> dict:
    """POST a streaming completion; timestamps of each SSE event carrying text or tokens."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    t_first = t_last = None
    tokens = None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        now = time.perf_counter()
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev:
            raise RuntimeError(f"stream error: {ev['error']}")
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        elif ev["choices"] and ev["choices"][0]["finish_reason"] is None:
            t_first = t_first or now        # an event with text: at least one new token
            t_last = now
    conn.close()
    if tokens != max_tokens or t_first is None:
        raise RuntimeError(f"expected {max_tokens} tokens, got {tokens}")
    return {"ttft_s": t_first - t0, "tpot_s": (t_last - t_first) / max(tokens - 1, 1), "tokens": tokens,
            "sent_s": t0, "prompt_len": len(prompt)}


def run_point(port: int, prompts: list[list[int]], n: int, *, output_len: int, time_budget_s: float,
              model: str) -> dict:
    """n client threads; client i sends prompts[i::n] one after another (within the time budget)."""
    results, errors, deadline = [], [], time.perf_counter() + time_budget_s
    lock = threading.Lock()

    def client(i):
        for p in prompts[i::n]:
            if time.perf_counter() > deadline:
                return
            try:
                r = stream_request(port, p, output_len, timeout=time_budget_s + 60, model=model)
            except Exception as e:  # noqa: BLE001 - reported in the results
                with lock:
                    errors.append(str(e))
                return
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:                       # send times from the point's start
        r["sent_s"] -= t0
    return summarize(results, time.perf_counter() - t0, errors)


def summarize(results: list[dict], wall_s: float, errors: list[str]) -> dict:
    """p50 / p99 / mean of TTFT and TPOT (ms), tokens/s; and per request, in send order,
    [sent ms from the point's start, prompt tokens, TTFT ms] (where the results carry them)."""
    def pct(key, q):
        xs = sorted(r[key] for r in results)
        if not xs:
            return None
        return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] * 1e3     # nearest rank, ms
    out = {"requests": len(results), "errors": errors[:5], "wall_s": wall_s,
           "tokens_per_s": sum(r["tokens"] for r in results) / wall_s if results else None}
    for key in ("ttft_s", "tpot_s"):
        name = key[:-2]
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = pct(key, 0.5), pct(key, 0.99)
        out[f"{name}_mean_ms"] = statistics.fmean(r[key] for r in results) * 1e3 if results else None
    if results and all("sent_s" in r for r in results):
        out["per_request"] = [[round(r["sent_s"] * 1e3, 2), r["prompt_len"], round(r["ttft_s"] * 1e3, 2)]
                              for r in sorted(results, key=lambda r: r["sent_s"])]
    return out


def workload(n: int, requests: int, prompt_lens: list[int], vocab: int) -> list[list[int]]:
    """n * requests token-id prompts, lengths cycling through prompt_lens (shuffled, seeded by n)."""
    rng = random.Random(1000 + n)
    lens = [prompt_lens[i % len(prompt_lens)] for i in range(n * requests)]
    rng.shuffle(lens)
    return [[rng.randrange(10, vocab) for _ in range(k)] for k in lens]


__all__ = ["stream_request", "run_point", "summarize", "workload"]
