"""Constrained (structured-output) decoding against free decoding, end to end through `LLM`.

    python tools/bench_structured.py MODEL_DIR [--batch 1 8] [--max-tokens 128] [--spec none ngram]
        [--device cuda] [--out results/structured]

Per speculation setting (none, or n-gram: one `LLM(MODEL_DIR, speculative=...)` each) x batch
size x workload: free (ignore_eos, the same max_tokens), JSON schema, regex, choice. Each row: the
mean generated tokens per stream, TPOT (wall time of the batch's generate after a warm-up run /
the mean tokens per stream; prefill included, the same few prompt tokens in every row) and
tokens/s (all streams). Constrained rows run one-step blocks, launched after the previous
block's tokens are read (docs/structured-output.md): the gap to `free` is that cost. Writes
OUT.json, OUT.md (the table) and OUT.png (TPOT per workload, one bar group per batch size).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import pyplot  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 4, "maxItems": 8},
    "score": {"type": "integer", "minimum": 0, "maximum": 100},
    "kind": {"enum": ["report", "note", "memo"]}}, "required": ["title", "tags", "score", "kind"],
    "additionalProperties": False}
WORKLOADS = {"free": None, "json": {"json": SCHEMA}, "regex": {"regex": r"([a-z]{3,8} ){8,24}[a-z]+\."},
             "choice": {"choice": ["positive", "negative", "neutral"]}}
PROMPT = "Write a short structured summary of the quarterly report."


def run(llm, batch: int, workload: str, max_tokens: int) -> dict:
    from graphrt import SamplingParams
    so = WORKLOADS[workload]
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i, ignore_eos=so is None,
                             structured_outputs=so) for i in range(batch)]
    llm.generate([PROMPT] * batch, params, use_tqdm=False)            # warm-up (grammar compiled, cached)
    t0 = time.perf_counter()
    outs = llm.generate([PROMPT] * batch, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    toks = [len(o.outputs[0].token_ids) for o in outs]
    mean = sum(toks) / len(toks)
    return {"batch": batch, "workload": workload, "tokens_per_stream": mean, "tpot_ms": wall / mean * 1e3,
            "tokens_per_s": sum(toks) / wall, "wall_s": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--spec", nargs="+", default=["none", "ngram"], choices=["none", "ngram"])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="structured")
    a = p.parse_args(argv)
    if any(b < 1 for b in a.batch) or a.max_tokens < 1:
        print("bench_structured: --batch and --max-tokens must be >= 1", file=sys.stderr)
        return 2
    from graphrt import LLM
    rows = []
    for spec in a.spec:
        kw = {} if spec == "none" else {"speculative": {"method": "ngram", "num_tokens": 4}}
        llm = LLM(a.model, device=a.device, max_batch=max(a.batch), **kw)
        for b in a.batch:
            for w in a.workloads:
                r = run(llm, b, w, a.max_tokens) | {"spec": spec}
                rows.append(r)
                print(f"{spec:6} bs={b:<3} {w:7} {r['tokens_per_stream']:6.1f} tok  TPOT {r['tpot_ms']:8.2f} ms  "
                      f"{r['tokens_per_s']:9.1f} tok/s", flush=True)
        del llm
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"model": a.model, "device": a.device, "rows": rows}, indent=1))
    lines = ["| spec | batch | workload | tokens/stream | TPOT ms | tokens/s | TPOT / free |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        free = next((x for x in rows if x["spec"] == r["spec"] and x["batch"] == r["batch"]
                     and x["workload"] == "free"), None)
        ratio = f"{r['tpot_ms'] / free['tpot_ms']:.3f}" if free else "-"
        lines.append(f"| {r['spec']} | {r['batch']} | {r['workload']} | {r['tokens_per_stream']:.1f} | "
                     f"{r['tpot_ms']:.2f} | {r['tokens_per_s']:.1f} | {ratio} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['spec']}\nbs{r['batch']}\n{r['workload']}" for r in rows]
        ax.bar(range(len(rows)), [r["tpot_ms"] for r in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=6)
        ax.set_ylabel("TPOT (ms)")
        ax.set_title("free vs constrained decoding")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
