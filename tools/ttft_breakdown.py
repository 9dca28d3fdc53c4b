"""Where first tokens wait: a bench_serve JSON's per-request TTFT by prompt length and by burst.

bench_serve (through serve_load) keeps each request's send time, prompt tokens and TTFT
(`per_request`). This prints, per variant and client count, the TTFT median over the requests of
each prompt length, and over the requests sent within --window ms of k others (a burst of k + 1:
closed-loop clients whose requests end in the same decode block send their next ones together).

    python tools/ttft_breakdown.py docs/results/round23/serve8c_after.json [--window 15]
"""
from __future__ import annotations

import argparse
import json
import statistics


def breakdown(per_request: list, window_ms: float) -> tuple[dict, dict]:
    """per_request: [sent ms, prompt tokens, TTFT ms] rows -> ({prompt tokens: (n, median TTFT)},
    {burst size: (n, median TTFT)}), burst size capped at 8."""
    sent = [r[0] for r in per_request]
    by_len, by_burst = {}, {}
    for s, n, t in per_request:
        by_len.setdefault(n, []).append(t)
        burst = min(sum(1 for x in sent if abs(x - s) <= window_ms), 8)
        by_burst.setdefault(burst, []).append(t)

    def med(d):
        return {k: (len(v), round(statistics.median(v), 1)) for k, v in sorted(d.items())}
    return med(by_len), med(by_burst)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="bench_serve output JSON")
    p.add_argument("--window", type=float, default=15.0, help="ms: requests sent this close form a burst")
    args = p.parse_args(argv)
    if not args.window > 0:
        p.error(f"--window: must be > 0 ms, got {args.window}")
    for f in args.json:
        res = json.load(open(f))
        for variant, points in res["variants"].items():
            for n, pt in points.items():
                if not isinstance(pt, dict) or not pt.get("per_request"):
                    continue
                by_len, by_burst = breakdown(pt["per_request"], args.window)
                print(f"{f} {variant} N={n}: TTFT p50 {pt['ttft_p50_ms']:.1f} ms, mean {pt['ttft_mean_ms']:.1f} ms")
                print("  by prompt tokens (requests, median TTFT ms):", by_len)
                print(f"  by burst size, sent within {args.window:g} ms (requests, median TTFT ms):", by_burst)


if __name__ == "__main__":
    main()
