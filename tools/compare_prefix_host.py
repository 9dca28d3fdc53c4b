"""tools/bench_prefix_host.py for this tree against a baseline revision, in alternating runs.

    python tools/compare_prefix_host.py --baseline 877e79a --out-dir docs/results --name prefix_host_cpu

The baseline's graphrt/ is taken with `git archive REV graphrt` into a temporary directory; each
run is one process of tools/bench_prefix_host.py (this tree's tool and stub executor) with
PYTHONPATH at the baseline's tree or this one, alternating (baseline, current) --runs times per
shape, so a shared machine's load falls on both alike. Shapes: PREFIX+SUFFIX tokens (--shapes;
default 4096+32, the H200 benchmark's repeated prefix, and 480+96, a chat turn's). Per (shape,
case, tree): the median of the runs' medians of first_us (µs from add_request to the first token;
host only: a stub executor). Writes NAME.json (every run) and NAME.md (the table). CPU host
figures of the engine alone, not a GPU TTFT.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = Path(__file__).resolve().parent / "bench_prefix_host.py"


def _run(tree: Path, prefix: int, suffix: int, rounds: int) -> dict:
    """One bench_prefix_host.py process over `tree`'s graphrt -> {case: first_us median, ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run([sys.executable, str(TOOL), "--prefix-len", str(prefix), "--suffix-len", str(suffix),
                        "--rounds", str(rounds), "--out", str(out)], env=env, check=True,
                       capture_output=True, text=True)
        return {r["case"]: r for r in json.loads(out.read_text())["rows"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="a git revision of this repository")
    p.add_argument("--shapes", default="4096+32,480+96", help="PREFIX+SUFFIX tokens, comma-separated")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=40, help="requests per case in one run")
    p.add_argument("--out-dir", default="docs/results")
    p.add_argument("--name", default="prefix_host_cpu")
    a = p.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in s.split("+")) for s in a.shapes.split(",")]
    except ValueError:
        p.error(f"--shapes: expected PREFIX+SUFFIX[,...], got {a.shapes!r}")
    if a.runs < 1 or a.rounds < 1 or any(len(s) != 2 for s in shapes):
        p.error("--runs, --rounds >= 1; --shapes PREFIX+SUFFIX")
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.baseline], check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "graphrt"], check=True,
                                capture_output=True, text=True).stdout.strip())
    runs = []
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "graphrt"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        for i in range(a.runs):
            for prefix, suffix in shapes:
                for tree, label in ((Path(base), "baseline"), (ROOT, "current")):
                    rows = _run(tree, prefix, suffix, a.rounds)
                    runs.append({"run": i, "shape": f"{prefix}+{suffix}", "tree": label, "rows": rows})
                    print(f"run {i} {prefix}+{suffix} {label:8} " + "  ".join(
                        f"{c} {r['first_us']:.0f}" for c, r in rows.items()), flush=True)
    table = []
    for prefix, suffix in shapes:
        shape = f"{prefix}+{suffix}"
        for case in runs[0]["rows"]:
            med = {t: statistics.median(r["rows"][case]["first_us"] for r in runs if r["shape"] == shape
                                        and r["tree"] == t) for t in ("baseline", "current")}
            cached = next(r["rows"][case]["cached_tokens"] for r in runs if r["shape"] == shape)
            table.append({"shape": shape, "case": case, "baseline_us": med["baseline"], "current_us": med["current"],
                          "cached_tokens": cached})
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps({
        "what": "host µs from add_request to the first token over a stub executor, baseline vs current "
                "tree, alternating runs (tools/compare_prefix_host.py); CPU host figures, not a GPU TTFT",
        "baseline": rev, "current": head + ("+dirty" if dirty else ""), "runs_per_tree": a.runs,
        "rounds_per_run": a.rounds, "table": table, "runs": runs}, indent=1))
    lines = [f"Host µs from add_request to the first token (stub executor: no device work), baseline {rev} vs "
             f"{head}{' (+ uncommitted)' if dirty else ''}; median of {a.runs} alternating runs of {a.rounds} "
             f"requests per case. CPU host figures (a shared 2-core machine), not an H200 TTFT.", "",
             "| prompt (prefix+suffix) | case | cached tokens | baseline us | current us | current / baseline |",
             "|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['shape']} | {r['case']} | {r['cached_tokens']} | {r['baseline_us']:.0f} | "
                     f"{r['current_us']:.0f} | {r['current_us'] / r['baseline_us']:.2f} |")
    (out / f"{a.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
