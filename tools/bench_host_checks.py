"""Host time of a prefill's input checks (graphrt/attention/inputs.py: check_prefill), this tree's
against a baseline revision's, side by side in one process (no GPU: the checks run on the host).

    python tools/bench_host_checks.py --baseline 418a19a --out-dir docs/results

The baseline's inputs.py is read with `git show REV:graphrt/attention/inputs.py` and loaded as its
own module (it imports only torch and graphrt.attention.buckets), so both run on the same inputs,
interleaved. Cases: one short prompt after a cached prefix (an engine's repeated-prefix turn or a
paced chunk), one long prompt, four prompts of 512 tokens; a table of 512 pages a row. Per case
the median over --repeats bursts of --calls calls, µs per call, and the ratio. Writes
NAME.json and NAME.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = (("1 x 32 tokens after 4096 cached", 1, 32, 4096), ("1 x 4128 tokens", 1, 4128, 0),
         ("4 x 512 tokens", 4, 512, 0))


def _baseline(rev: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:graphrt/attention/inputs.py"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "inputs_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("inputs_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="a git revision whose check_prefill is the baseline")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out-dir", default="docs/results")
    p.add_argument("--name", default="bench_host_checks")
    a = p.parse_args(argv)
    if a.calls < 1 or a.repeats < 1:
        p.error("--calls, --repeats: must be >= 1")
    import torch

    from benchlib import median_burst
    from graphrt import RuntimeConfig
    from graphrt.attention import inputs as current
    base = _baseline(a.baseline)
    c = RuntimeConfig(num_qo_heads=32, num_kv_heads=8, head_dim=64, page_size=16, max_context_len=8192,
                      buckets=[1, 2, 4, 8, 16], dtype="float32", backend="reference", kv_pool_pages=20000)
    cpu, rows = torch.device("cpu"), []
    for label, n, length, start in CASES:
        gen = torch.Generator().manual_seed(n * length)
        prompts = [torch.randint(0, 128256, (length,), generator=gen) for _ in range(n)]
        table = torch.arange(1, 1 + n * 512, dtype=torch.int32).view(n, 512)
        starts = [start] * n
        us = {}
        for name, mod in (("baseline", base), ("current", current)):
            call = lambda m=mod: m.check_prefill(c, cpu, 20000, 128256, prompts, table, starts)  # noqa: E731
            for _ in range(10):
                call()
            us[name] = median_burst(call, a.calls, a.repeats, lambda: None)
        rows.append({"case": label, "baseline_us": round(us["baseline"], 1), "current_us": round(us["current"], 1),
                     "ratio": round(us["baseline"] / us["current"], 2)})
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = {"baseline": a.baseline, "calls": a.calls, "repeats": a.repeats, "rows": rows}
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=1))
    md = [f"check_prefill host time, this tree vs {a.baseline} (median of {a.repeats} bursts of {a.calls} calls)", "",
          "| case | baseline us | current us | baseline / current |", "|---|---|---|---|"]
    md += [f"| {r['case']} | {r['baseline_us']} | {r['current_us']} | {r['ratio']} |" for r in rows]
    (out / f"{a.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
