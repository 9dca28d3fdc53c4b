"""#29's side-by-side table from one tools/device/step_final.sh call: every decode row, the gates, the
per-kernel profiles, FP8 quality and the verify step, read from the call's log directory.

    python tools/device/step_final_table.py /tmp/step_final        # markdown on stdout

Inputs (any may be missing: a step that timed out is reported as missing, never guessed):
  e2e_*.json / e2e_*.log   tools/bench_e2e.py (rows from the log's per-row dicts when the JSON
                           was not written because the process was cut by its bound)
  profile_*.json           tools/profile_step.py
  quality_fp8.json         tools/quality_fp8.py
  verify_bs1_1k.json       tools/bench_spec.py part 1 (decode step vs a verify of q = 5 tokens)
A gate takes the fastest row of its (model, weights, KV, batch, context) over the attention
backends measured (FlashInfer and triton-decode: graphrt-capture measures both per bucket).
"""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

GATES = [  # (label, model, weights ("fp8": best FP8 kind), batch, context, at most x floor)
    ("8B bf16 bs 1 / 1k", "llama-3.1-8b", "bf16", 1, 1024, 1.15),
    ("1B bf16 bs 1 / 1k", "llama-3.2-1b", "bf16", 1, 1024, 1.40),
    ("8B bf16 bs 16 / 1k", "llama-3.1-8b", "bf16", 16, 1024, 1.20),
    ("8B bf16 bs 16 / 8k", "llama-3.1-8b", "bf16", 16, 8192, 1.20),
    ("1B bf16 bs 16 / 1k", "llama-3.2-1b", "bf16", 16, 1024, 1.50),
    ("8B FP8 weights bs 1 / 1k", "llama-3.1-8b", "fp8", 1, 1024, 1.25),
    ("1B FP8 weights bs 1 / 1k", "llama-3.2-1b", "fp8", 1, 1024, 1.60),
]
KV_SPEEDUP, KV_FLOOR, VERIFY = 1.25, 1.20, 1.10      # FP8 KV at 8B bs 16 / 8k; verify / decode at bs 1
QUALITY = {"fp8": 1.01, "fp8+fp8-kv": 1.02}          # held-out perplexity over bf16, at most (both passes)


def e2e_rows(d: Path) -> tuple[list[dict], list[str]]:
    """Every bench_e2e row of the call, and the devices / copy bandwidths the files name."""
    rows, heads = [], []
    for log in sorted(d.glob("e2e_*.log")):
        js = log.with_suffix(".json")
        if js.exists():
            r = json.loads(js.read_text())
            rows += r["rows"]
            heads.append(f"{js.name}: {r['device']}, copy {r['copy_bw_bytes_per_s'] / 1e12:.2f} TB/s")
            continue
        got = [row for x in log.read_text().splitlines() if x.startswith("{'model'") and (row := literal(x))]
        rows += got
        heads.append(f"{log.name}: no JSON (cut by its bound?), {len(got)} rows from the log")
    for r in rows:                                   # rows of tools older than --weights / --kv
        r.setdefault("weights", "bf16")
        r.setdefault("kv", "bf16")
    return rows, heads


def literal(line: str) -> dict | None:
    """A row dict bench_e2e printed to stderr, or None (a line cut short when the process was killed)."""
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError):
        return None


def best(rows, model, weights, kv, batch, ctx):
    """The fastest row of a configuration over backends (weights "fp8": over every FP8 kind)."""
    ok = [r for r in rows if r["model"] == model and r["kv"] == kv and r["batch"] == batch and r["context"] == ctx
          and (r["weights"] == weights or (weights == "fp8" and r["weights"].startswith("fp8")))]
    return min(ok, key=lambda r: r["device_us"]) if ok else None


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def gate_row(label: str, value: str, limit: str, ok: bool | None, where: str) -> str:
    return f"| {label} | {value} | {limit} | {'-' if ok is None else verdict(ok)} | {where} |"


def rows_section(rows, heads) -> list[str]:
    out = ["## Decode step rows (tools/bench_e2e.py, random weights, device us per step)", ""]
    out += [f"- {h}" for h in heads]
    out += ["", "| model | weights | KV | variant | bs / ctx | device us | floor us | x floor | x GEMM-only | split-K |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['weights']} | {r['kv']} | {r['variant']} | {r['batch']} / {r['context']} "
                   f"| {r['device_us']:.0f} | {r['floor_us']:.0f} | {r['device_over_floor']:.2f} "
                   f"| {r['device_over_gemm_only']:.2f} | {r.get('splitk')} |")
    return out


def gates_section(rows, d: Path) -> list[str]:
    out = ["", "## #29 gates", "", "| gate | measured | at most | verdict | row |", "|---|---|---|---|---|"]
    for label, m, w, n, ctx, most in GATES:
        r = best(rows, m, w, "bf16", n, ctx)
        out.append(gate_row(f"{label} x floor", f"{r['device_over_floor']:.2f}", most, r["device_over_floor"] <= most,
                            f"{r['weights']} {r['variant']} {r['device_us']:.0f} us") if r
                   else gate_row(f"{label} x floor", "missing", most, None, "-"))
    for w in sorted({r["weights"] for r in rows if r["batch"] == 16 and r["context"] == 8192}):
        a, b = (best(rows, "llama-3.1-8b", w, kv, 16, 8192) for kv in ("bf16", "fp8"))
        if a and b:
            sp = a["device_us"] / b["device_us"]
            out.append(gate_row(f"8B bs 16 / 8k, {w} weights: bf16 KV / FP8 KV", f"{sp:.2f}x faster",
                                f">= {KV_SPEEDUP}", sp >= KV_SPEEDUP, f"{a['variant']} {a['device_us']:.0f} us vs "
                                f"{b['variant']} {b['device_us']:.0f} us"))
            out.append(gate_row(f"8B bs 16 / 8k, {w} weights, FP8 KV x its floor", f"{b['device_over_floor']:.2f}",
                                KV_FLOOR, b["device_over_floor"] <= KV_FLOOR, f"floor {b['floor_us']:.0f} us"))
    v = d / "verify_bs1_1k.json"
    for r in json.loads(v.read_text())["models"] if v.exists() else []:
        vus = r["verify_us"]                                 # JSON keys: q as a string
        out.append(gate_row(f"verify (q = 5) / decode, {r['model']} bs {r['batch']} / {r['context']}",
                            f"{r['ratio_q5']:.3f}", VERIFY, r["ratio_q5"] <= VERIFY,
                            f"decode {r['decode_us']:.0f} us, verify q = 5 {vus.get('5', float('nan')):.0f} us, "
                            f"q = 1 {vus.get('1', float('nan')):.0f} us"))
    if not v.exists():
        out.append(gate_row("verify (q = 5) / decode, 8B bs 1 / 1k", "missing", VERIFY, None, "-"))
    return out


def quality_section(d: Path) -> list[str]:
    out, q = ["", "## FP8 quality on the trained tiny target (tools/quality_fp8.py)", ""], d / "quality_fp8.json"
    if not q.exists():
        return out + ["missing (see quality_fp8.log)"]
    res = json.loads(q.read_text())
    base = res["variants"]["bf16"]
    out += [f"{res['files']} held-out files, {res['decode_files']} decoded, {res['prompts']} greedy prompts", "",
            "| variant | prefill ppl | ratio | decode ppl | ratio | greedy identical | mean prefix | token match "
            "| gate |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["variants"].items():
        ratios = [r["prefill_ppl"] / base["prefill_ppl"]]
        if "decode_ppl" in r:
            ratios.append(r["decode_ppl"] / base["decode_ppl"])
        dec = f"{r['decode_ppl']:.3f} | {ratios[1]:.4f}" if len(ratios) > 1 else "- | -"
        gate, g = QUALITY.get(name), r["greedy"]
        out.append(f"| {name} | {r['prefill_ppl']:.3f} | {ratios[0]:.4f} | {dec} | {g['identical']}/{g['sequences']} "
                   f"| {g['mean_identical_prefix']:.1f} | {g['token_match']:.3f} "
                   f"| {'-' if gate is None else f'{verdict(max(ratios) <= gate)} (at most {gate})'} |")
    return out


def profiles_section(d: Path) -> list[str]:
    out = ["", "## Per-kernel profiles (tools/profile_step.py: family us per step / launches)", ""]
    for f in sorted(d.glob("profile_*.json")):
        r = json.loads(f.read_text())
        fam = ", ".join(f"{k} {us:.0f}/{r['families_launches'][k]:.0f}"
                        for k, us in sorted(r["families_us"].items(), key=lambda kv: -kv[1]))
        step, kern = r["device_us_per_step"], r["kernel_us_per_step"]
        out.append(f"- {r['model']} {r['weights']} {r['backend']} kv={r['kv']} bs {r['batch']} / {r['context']}: "
                   f"{step:.0f} us, kernels {kern:.0f} us in {r['launches_per_step']:.0f} launches, gaps "
                   f"{step - kern:.0f} us, split-K {r.get('splitk')}: {fam}")
    return out


def main(argv=None) -> int:
    d = Path((argv or sys.argv[1:] or ["."])[0])
    rows, heads = e2e_rows(d)
    out = rows_section(rows, heads) + gates_section(rows, d) + quality_section(d) + profiles_section(d)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
