"""FP8 quality on a trained checkpoint: held-out perplexity and greedy agreement, side by side.

    python tools/quality_fp8.py TARGET_DIR [--device cuda|cpu] [--variants bf16,fp8,fp8-kv,fp8+fp8-kv]
        [--max-files 64] [--window 512] [--decode-tokens 128] [--prompts 32] [--prompt-tokens 32]
        [--gen-tokens 64] [--json OUT] [--check]

TARGET_DIR: a model trained by tools/train_tiny.py (its held-out split is the one it was kept from).
Variants (one graphrt ModelRuntime each, the same kernels as the engine):
  bf16        the model dtype (bfloat16 on CUDA, float32 on CPU: the baseline)
  fp8         weights quantized per channel while loading (`quantization="fp8"`: W8A8)
  fp8-kv      model-dtype weights, FP8 (e4m3) KV cache (`kv_cache_dtype="fp8"`)
  fp8+fp8-kv  both
  int4        weights quantized while loading (`quantization="int4"`: round-to-nearest, group 128,
              or 64 / 32 where 128 does not divide a weight's columns; W4A16); not a default variant
The FP8 KV scales are calibrated by the runtime's first prefill, here a batch of training-split
files (never the held-out text), then fixed; the scales chosen are printed.

Measured per variant (tools/eval_ppl.py's procedures):
1. prefill perplexity: graphrt's chunked prefill with logits at every position; attention reads
   the K/V back from the pages (FP8 pages with fp8-kv);
2. decode perplexity: teacher-forced through the decode step (one step per replay, keep_logits)
   over the first --decode-tokens tokens of each file: every position reads its context from the
   KV cache as a decode step does;
3. greedy agreement with the bf16 variant: --prompts held-out prompts continued --gen-tokens
   tokens by each variant (argmax); identical sequences, mean identical prefix, matching tokens.
Ratios are over the bf16 variant's perplexity. --check exits 1 unless fp8 is within 1% and
fp8+fp8-kv within 2% of bf16 on both perplexities (the quality gates of FP8 serving).
Runs on a CPU at micro size (Triton through the interpreter):

    python tools/train_tiny.py --out /tmp/tiny --size micro --models target --steps 30
    python tools/quality_fp8.py /tmp/tiny/target --device cpu --max-files 2 --window 32 \\
        --decode-tokens 4 --prompts 2 --prompt-tokens 8 --gen-tokens 3 --rows 2   # a few minutes
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eval_ppl  # noqa: E402  (held-out sequences, prefill / decode NLL)
import train_tiny  # noqa: E402  (the corpus split)

VARIANTS = {"bf16": (None, "auto"), "fp8": ("fp8", "auto"), "fp8-kv": (None, "fp8"),
            "fp8+fp8-kv": ("fp8", "fp8"), "int4": ("int4", "auto")}   # name -> (quantization, kv_cache_dtype)
GATES = {"fp8": 1.01, "fp8+fp8-kv": 1.02}         # perplexity ratio over bf16, at most


def runtime(path, device, *, quantization, kv_cache_dtype, rows: int, context: int):
    """(model, ModelRuntime: 1-step graphs keeping logits, rows x context pages)."""
    from graphrt.config import RuntimeConfig
    from graphrt.checkpoint.loader import load_checkpoint
    from graphrt.checkpoint.decoder import build_model
    from graphrt.model.runtime import ModelRuntime
    cuda = device.type == "cuda"
    ck = load_checkpoint(path, device=device, dtype=torch.bfloat16 if cuda else torch.float32,
                         quantization=quantization)
    s, page = ck.spec, 16
    rc = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                       page_size=page, max_context_len=context, buckets=[rows],
                       dtype="bfloat16" if cuda else "float32",
                       backend="flashinfer" if cuda else "torch-splitkv",
                       kv_pool_pages=rows * -(-context // page), kv_cache_dtype=kv_cache_dtype)
    model = build_model(ck, max_positions=context)
    mrt = ModelRuntime(model, rc, device, steps_per_graph=1, keep_logits=True,
                       kv_scales=ck.kv_scales if rc.kv_fp8 else None)
    if cuda:
        mrt.capture()
    return model, mrt


def calibrate(mrt, tok, *, tokens: int) -> list | None:
    """The runtime's first prefill over training-split files (FP8 KV: it sets the scales)."""
    if mrt.kv_scale_source != "pending":
        return None if not mrt.config.kv_fp8 else [c.scale.tolist() for c in mrt.kv_caches]
    import sysconfig
    rows, ctx = mrt.config.max_batch, mrt.config.max_context_len
    root = Path(sysconfig.get_paths()["stdlib"])
    train = (r for r in train_tiny.stdlib_files(root) if not train_tiny.is_heldout(r))
    seqs = []
    for rel in train:                                 # the first training files, in path order
        ids = train_tiny.encode_files(tok, [(root / rel).read_text(encoding="utf-8", errors="replace")])[0]
        if len(ids) >= 16:
            seqs.append(ids[:min(ctx, tokens)])
        if len(seqs) == rows:
            break
    mrt.prefill([torch.tensor(s, dtype=torch.int64) for s in seqs], eval_ppl.block_table(rows, ctx)[:len(seqs)])
    return [c.scale.tolist() for c in mrt.kv_caches]


@torch.no_grad()
def greedy(mrt, prompts: list[list[int]], gen_tokens: int) -> list[list[int]]:
    """Greedy continuations through the runtime (prefill, then one decode step per replay)."""
    rows, ctx, out = mrt.config.max_batch, mrt.config.max_context_len, []
    for b in range(0, len(prompts), rows):
        ps = prompts[b: b + rows]
        n, table = len(ps), eval_ppl.block_table(rows, ctx)[: len(ps)]
        logits = mrt.prefill([torch.tensor(p, dtype=torch.int64) for p in ps], table)
        toks = [logits.argmax(-1).cpu()]
        lens = torch.tensor([len(p) + 1 for p in ps], dtype=torch.int32)
        for _ in range(gen_tokens - 1):
            toks.append(mrt.decode(toks[-1].to(mrt.device), table, lens)[0].cpu().clone())
            lens += 1
        out += torch.stack(toks, 1).tolist()
    return out


def agreement(got: list[list[int]], ref: list[list[int]]) -> dict:
    prefix = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r)) for g, r in zip(got, ref)]
    same = sum(a == b for g, r in zip(got, ref) for a, b in zip(g, r))
    total = sum(len(r) for r in ref)
    return {"identical": sum(p == len(r) for p, r in zip(prefix, ref)), "sequences": len(ref),
            "mean_identical_prefix": sum(prefix) / max(1, len(prefix)), "token_match": same / max(1, total)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "int4"))
    p.add_argument("--max-files", type=int, default=64)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--rows", type=int, default=8, help="sequences per batch (the runtime's bucket)")
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--chunk-tokens", type=int, default=4096)
    p.add_argument("--json", default=None)
    p.add_argument("--check", action="store_true", help="exit 1 when a quality gate fails")
    a = p.parse_args(argv)
    bad = [v for v in a.variants.split(",") if v not in VARIANTS]
    if bad or "bf16" not in a.variants.split(","):
        p.error(f"--variants: {bad or 'bf16 missing'}; choose from {list(VARIANTS)} (bf16 is the baseline)")
    for key in ("max_files", "window", "rows", "decode_tokens", "prompts", "prompt_tokens", "gen_tokens"):
        if getattr(a, key) < 1:
            p.error(f"--{key.replace('_', '-')}: must be >= 1, got {getattr(a, key)}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    cuda = a.device == "cuda" or (a.device is None and torch.cuda.is_available())
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")          # before graphrt's kernels load
    from transformers import AutoTokenizer
    device = torch.device("cuda" if cuda else "cpu")
    tok = AutoTokenizer.from_pretrained(a.checkpoint)
    seqs = eval_ppl.heldout_sequences(tok, max_files=a.max_files, window=a.window)
    long = [s for s in seqs if len(s) >= a.decode_tokens + 1]
    prompts = eval_ppl.prompt_windows(seqs, prompts=a.prompts, prompt_tokens=a.prompt_tokens)
    context = max(a.window, a.prompt_tokens + a.gen_tokens) + 16
    res = {"checkpoint": str(a.checkpoint), "device": str(device), "files": len(seqs),
           "decode_files": len(long), "prompts": len(prompts), "variants": {}}
    base_greedy = None
    for name in a.variants.split(","):
        quant, kv = VARIANTS[name]
        t0 = time.perf_counter()
        model, mrt = runtime(a.checkpoint, device, quantization=quant, kv_cache_dtype=kv,
                             rows=a.rows, context=context)
        r = {"kv_scales": calibrate(mrt, tok, tokens=a.window)}
        nll = eval_ppl.graphrt_prefill_nll(model, mrt, seqs, chunk_tokens=a.chunk_tokens)
        r["prefill_ppl"] = eval_ppl.ppl(torch.cat(nll))
        if long:
            r["decode_ppl"] = eval_ppl.ppl(eval_ppl.graphrt_decode_nll(mrt, long, a.decode_tokens))
        outs = greedy(mrt, prompts, a.gen_tokens)
        if name == "bf16":
            base_greedy = outs
        r["greedy"] = agreement(outs, base_greedy) if base_greedy is not None else None
        r["seconds"] = round(time.perf_counter() - t0, 1)
        res["variants"][name] = r
        print(f"{name}: {r}", file=sys.stderr)
        del model, mrt
    failed = report(res)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 1 if a.check and failed else 0


def report(res: dict) -> list[str]:
    """Print the table; returns the failed gates."""
    v = res["variants"]
    base = v["bf16"]
    print(f"{res['checkpoint']} on {res['device']}: {res['files']} held-out files, {res['decode_files']} "
          f"decoded, {res['prompts']} greedy prompts")
    print(f"{'variant':<11} {'prefill ppl':>11} {'ratio':>6} {'decode ppl':>10} {'ratio':>6} "
          f"{'identical':>9} {'prefix':>6} {'tokens':>6} {'gate':>5}")
    failed = []
    for name, r in v.items():
        ratios = [r["prefill_ppl"] / base["prefill_ppl"]]
        if "decode_ppl" in r:
            ratios.append(r["decode_ppl"] / base["decode_ppl"])
        r["ratios"] = ratios
        gate = GATES.get(name)
        ok = gate is None or max(ratios) <= gate
        if not ok:
            failed.append(name)
        g = r["greedy"]
        dec = f"{r['decode_ppl']:>10.3f} {ratios[1]:>6.4f}" if "decode_ppl" in r else f"{'-':>10} {'-':>6}"
        print(f"{name:<11} {r['prefill_ppl']:>11.3f} {ratios[0]:>6.4f} {dec} "
              f"{g['identical']:>4}/{g['sequences']:<4} {g['mean_identical_prefix']:>6.1f} "
              f"{g['token_match']:>6.3f} {('-' if gate is None else 'ok' if ok else 'FAIL'):>5}")
        if r["kv_scales"]:
            ks = [x[0] for x in r["kv_scales"]]
            vs = [x[1] for x in r["kv_scales"]]
            print(f"  FP8 KV scales: k {min(ks):.4g}..{max(ks):.4g}, v {min(vs):.4g}..{max(vs):.4g}")
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
