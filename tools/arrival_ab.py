"""The arrival stall of two source trees side by side: medians over repeated bench_prefix runs.

bench_prefix's arrival row (8 streams decoding, a long prompt arrives) moves from run to run by
a few hundredths in its TPOT p99 (the 6th largest of ~600 samples), and now and then by far more
(one run in eight above 2x). Run the "before" and "after" trees in turn on one machine, one
bench_prefix process each (a tree cannot share a process with another), then:

    python tools/arrival_ab.py DIR --out DIR/arrival_ab     # DIR/arrival_{before,after}_N.json

Writes OUT.json and OUT.md: per variant the runs' rows (the first arrival row of each file) and
the median, min and max of TPOT p99 / steady p50, largest gap / steady gap, TPOT p50 and the long
prompt's TTFT, and after / before of each median.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

KEYS = ("p99_over_steady_p50", "gap_over_steady_gap", "tpot_p50_ms", "steady_tpot_p50_ms", "long_ttft_ms")
VARIANTS = ("before", "after")


def collect(folder: Path) -> dict:
    """{variant: [(run, row)]} from folder/arrival_{variant}_{run}.json (the first arrival row)."""
    out = {v: [] for v in VARIANTS}
    for f in sorted(folder.glob("arrival_*_*.json")):
        m = re.fullmatch(r"arrival_(before|after)_(\d+)\.json", f.name)
        if not m:
            continue
        rows = json.loads(f.read_text()).get("arrival") or {}
        if rows:
            out[m.group(1)].append((int(m.group(2)), next(iter(rows.values()))))
    for v in out:
        out[v].sort(key=lambda x: x[0])
    return out


def summarize(runs: dict) -> dict:
    res = {}
    for v, rows in runs.items():
        if not rows:
            continue
        res[v] = {"runs": len(rows), "per_run": {k: [round(r[k], 4) for _, r in rows] for k in KEYS}}
        for k in KEYS:
            xs = [r[k] for _, r in rows]
            res[v][k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    if all(v in res for v in VARIANTS):
        res["after_over_before"] = {k: res["after"][k]["median"] / res["before"][k]["median"] for k in KEYS}
    return res


def table(res: dict) -> str:
    lines = ["| variant | runs | TPOT p99 / steady p50: median (min-max) | largest gap / steady gap | "
             "TPOT p50 ms | steady TPOT p50 ms | long TTFT ms |", "|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        if v not in res:
            continue
        r = res[v]
        p, g = r["p99_over_steady_p50"], r["gap_over_steady_gap"]
        lines.append(f"| {v} | {r['runs']} | {p['median']:.2f} ({p['min']:.2f}-{p['max']:.2f}) | "
                     f"{g['median']:.2f} ({g['min']:.2f}-{g['max']:.2f}) | {r['tpot_p50_ms']['median']:.2f} | "
                     f"{r['steady_tpot_p50_ms']['median']:.2f} | {r['long_ttft_ms']['median']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="folder of arrival_{before,after}_N.json (bench_prefix --name arrival_VARIANT_N)")
    p.add_argument("--out", default=None, help="output stem (default DIR/arrival_ab)")
    a = p.parse_args(argv)
    folder = Path(a.dir)
    if not folder.is_dir():
        p.error(f"dir: {a.dir!r} is not a folder")
    runs = collect(folder)
    if not any(runs.values()):
        p.error(f"dir: no arrival_before_N.json / arrival_after_N.json with an arrival row in {a.dir!r}")
    res = summarize(runs)
    out = Path(a.out) if a.out else folder / "arrival_ab"
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    md = table(res)
    out.with_suffix(".md").write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
