"""Tensor-parallel decode benchmark: TP 1 vs 2 (vs 4 / 8 where the host has them).

Random bf16 models of the Llama-3.1-8B and Llama-3.1-70B shapes, built straight into each
rank's shard (graphrt.parallel.random_weights: every TP size holds slices of the same model),
one process per rank (graphrt.parallel.launch, NCCL), CUDA graphs with the all-reduces inside.
Side by side per row: weights bf16 or fp8 (per-channel W8A8, quantized from the same random
weights), and at TP > 1 the all-reduce: "nccl" (every message) or "oneshot" (FlashInfer's
one-shot kernel for every message it takes, parallel/allreduce.py; NCCL above its workspace).
Per (model, weights, TP, all-reduce, batch, context):
  step_us     device time of one decode step: CUDA events over back-to-back graph replays
              (median of 5 bursts), measured on rank 0 (every rank replays in lock step)
  ar_us       one all-reduce of [batch, hidden] bf16: a graph of 64 all-reduces / 64
  floor_us    (per-GPU weight bytes + per-GPU KV bytes) / measured D2D copy bandwidth
              + ar_us x all-reduces per step (2 per layer; the LM-head all-gather not counted)
70B at TP=1 is skipped (141 GB of bf16 weights do not fit one H200). Targets printed at the end:
8B batch 1: TP=2 step <= 0.62 x TP=1 step; 70B batch 1 ctx 1k: step <= 1.25 x (weight bytes /
copy bandwidth + ar_us x count).

    python tools/bench_tp.py --out OUT_DIR          # bench_tp.json, bench_tp.txt (+ bench_tp.png)
    python tools/bench_tp.py --out OUT_DIR --smoke  # CPU: 2 gloo ranks, a micro model, host µs
                                                    # (checks the rows and files, not a speed)
Without CUDA (and without --smoke) it writes a JSON with no rows and says why.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SHAPES = {  # hidden, intermediate, layers, q heads, kv heads, head_dim, vocab
    "micro": (128, 256, 2, 4, 2, 64, 301),                     # --smoke only (odd vocab)
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256),
    "llama-3.1-70b": (8192, 28672, 80, 64, 8, 128, 128256),
}
H200_BYTES = 141e9
AR_PER_GRAPH = 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--tp", default=None, help="TP sizes (default: 1,2,4,8 up to the GPU count)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--reps", type=int, default=20, help="graph replays per timed burst")
    p.add_argument("--weights", default="bf16,fp8", help="comma list of bf16, fp8 (per-channel W8A8)")
    p.add_argument("--allreduce", default="nccl,oneshot", help="comma list of nccl, oneshot (TP > 1)")
    p.add_argument("--smoke", action="store_true", help="CPU micro run (gloo, eager, host time)")
    p.add_argument("--out", required=True, help="output directory")
    return p.parse_args(argv)


def _spec(name):
    from graphrt.model.spec import LlamaSpec
    h, inter, layers, hq, hkv, d, vocab = SHAPES[name]
    return LlamaSpec(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_layers=layers,
                     num_heads=hq, num_kv_heads=hkv, head_dim=d, rms_norm_eps=1e-5, rope_theta=500000.0,
                     tie_word_embeddings=False, attention_bias=False, max_position_embeddings=16384)


def _events_us(fn, torch, reps, repeats=5):
    from benchlib import device_us
    return device_us(fn, torch, reps=reps, repeats=repeats)


def _route(tp, method, spec, batches, device, torch):
    """tp with every all-reduce on NCCL ("nccl") or on the one-shot kernel wherever it takes the
    message ("oneshot"; None when FlashInfer's kernel does not set up: the WARNING says why)."""
    if method == "nccl" or tp is None:
        return tp
    import dataclasses

    from graphrt.parallel.allreduce import AllReducer, AllReduceTable
    from graphrt.parallel.flashinfer_allreduce import open_oneshot
    one = open_oneshot(tp, max_tokens=max(batches), hidden=spec.hidden_size, dtype=torch.bfloat16, device=device)
    if one is None:
        return None
    return dataclasses.replace(tp, reducer=AllReducer(AllReduceTable(((1 << 62, "oneshot"),)),
                                                      tp.nccl_all_reduce, one))


def _allreduce_us(tp, n, hidden, torch):
    """One all-reduce of [n, hidden] bf16 through tp's route, from a graph of AR_PER_GRAPH of them
    (0 at TP=1)."""
    if tp is None:
        return 0.0
    from graphrt.kernels.timing import graph_us
    x = torch.zeros((n, hidden), dtype=torch.bfloat16, device="cuda")
    return graph_us(lambda: tp.all_reduce(x), AR_PER_GRAPH, 5, mode="thread_local")


def _weights(spec, kind, ctx, torch):
    from graphrt.parallel.random_weights import random_weights
    from graphrt.parallel.shard import shard_spec
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    w = random_weights(spec, dtype=dtype, device=ctx.device, seed=0, rank=ctx.rank, world_size=ctx.world_size)
    if kind == "fp8":
        from graphrt.model.fp8_weights import quantize_weights
        w = quantize_weights(w, shard_spec(spec, ctx.world_size), "channel")
    return w


def _weight_bytes(w) -> int:
    def nb(t):
        return t.nbytes if hasattr(t, "scale") else t.numel() * t.element_size()
    return sum(nb(t) for x in w.layers for t in (x.qkv, x.o, x.gate_up, x.down)) + nb(w.lm_head)


def _rank_bench(ctx, name, batches, contexts, reps, kinds, methods):
    """Every rank: its shard, its runtime, graphs; the same replays in lock step. Rank 0's rows."""
    import torch
    from graphrt import RuntimeConfig
    from graphrt.model.llama import LlamaDecoder
    from graphrt.parallel.driver import rank_runtime
    spec, dev, tp = _spec(name), ctx.device, ctx.world_size
    cuda = dev.type == "cuda"
    if cuda:
        from benchlib import copy_bandwidth
        bw = copy_bandwidth(torch)
    else:
        bw = float("nan")
    max_ctx = max(contexts) + 32
    pages = -(-max_ctx // 16)
    cfg = RuntimeConfig(num_qo_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                        page_size=16, max_context_len=max_ctx, buckets=sorted(batches),
                        dtype="bfloat16" if cuda else "float32", backend="flashinfer" if cuda else "torch-splitkv",
                        kv_pool_pages=max(batches) * pages + 1)
    rows = []
    for kind in kinds:
        t0 = time.perf_counter()
        weights = _weights(spec, kind, ctx, torch)
        weight_bytes = _weight_bytes(weights)
        for method in (methods if tp > 1 else ["-"]):
            route = _route(ctx.tp, method, spec, batches, dev, torch) if cuda else ctx.tp
            if route is None:
                rows.append(dict(model=name, weights=kind, tp=tp, allreduce=method, skipped="one-shot unavailable"))
                continue
            model = LlamaDecoder(spec, weights, max_positions=max_ctx, tp=route)
            if model.tp is not None and cuda:
                model.tp.warm_up(dev)
            mrt = rank_runtime(model, cfg, dev)
            mrt.capture()
            build_s = time.perf_counter() - t0
            for n in batches:
                ar_us = _allreduce_us(model.tp, n, spec.hidden_size, torch) if cuda else float("nan")
                for c in contexts:
                    need = -(-(c + 1) // 16)
                    table = torch.arange(n * need, dtype=torch.int32, device=dev).view(n, need)
                    lens = torch.full((n,), c, dtype=torch.int32, device=dev)
                    tokens = torch.zeros(n, dtype=torch.int64, device=dev)
                    for _ in range(2):
                        mrt.decode(tokens, table, lens)           # loads the bucket's inputs, warm
                    if cuda:
                        torch.cuda.synchronize()
                        step_us = _events_us(lambda: mrt.decode_slots(n, sampled=False), torch, reps)
                    else:                                          # smoke: host µs of eager steps
                        t1 = time.perf_counter()
                        mrt.decode(tokens, table, lens)
                        step_us = (time.perf_counter() - t1) * 1e6
                    ar_count = 2 * spec.num_layers if tp > 1 else 0
                    kv_bytes = spec.num_layers * n * c * (spec.num_kv_heads // tp) * spec.head_dim * 2 * 2
                    floor = (weight_bytes + kv_bytes) / bw * 1e6 + ar_us * ar_count
                    weight_floor = weight_bytes / bw * 1e6 + ar_us * ar_count
                    rows.append(dict(model=name, weights=kind, tp=tp, allreduce=method, batch=n, context=c,
                                     step_us=step_us, ar_us=ar_us, ar_count=ar_count,
                                     weight_bytes_per_gpu=weight_bytes, kv_bytes_per_gpu=kv_bytes,
                                     copy_bw_bytes_per_s=bw, floor_us=floor, weight_ar_floor_us=weight_floor,
                                     step_over_floor=step_us / floor, build_s=build_s))
                    if ctx.rank == 0:
                        print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()},
                              file=sys.stderr, flush=True)
            mrt = model = None                             # free before the next build
        weights = None
        if cuda:
            torch.cuda.empty_cache()
    return rows


def run(args) -> dict:
    import torch
    from graphrt.parallel.launch import launch
    kinds = [k for k in args.weights.split(",") if k]
    methods = [m for m in args.allreduce.split(",") if m]
    bad = [k for k in kinds if k not in ("bf16", "fp8")] + [m for m in methods if m not in ("nccl", "oneshot")]
    if bad:
        raise SystemExit(f"bench_tp: --weights / --allreduce: unknown {bad}")
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    if args.smoke:                                    # CPU: the rows and files, at micro size
        rows, contexts = [], [24]
        for tp in (1, 2):
            rows += launch(_rank_bench, tp, args=("micro", batches, contexts, 1, kinds, ["gloo"]),
                           backend="gloo", timeout_s=120, run_timeout_s=600)
        return {"device": "cpu (smoke: host µs, not a speed)", "gpus": 0, "rows": rows,
                "notes": ["--smoke: 2 gloo ranks on CPU, eager steps; oneshot rows need CUDA"], "targets": []}
    gpus = torch.cuda.device_count()
    if gpus < 2:
        note = f"skipped: {gpus} CUDA device(s) visible; TP 1 vs 2 needs two GPUs (--smoke runs the CPU check)"
        print(f"bench_tp: {note}", file=sys.stderr)
        return {"device": torch.cuda.get_device_name(0) if gpus else "none", "gpus": gpus, "rows": [],
                "notes": [note], "targets": []}
    sizes = [int(x) for x in args.tp.split(",")] if args.tp else [t for t in (1, 2, 4, 8) if t <= gpus]
    rows, notes = [], []
    for name in args.models.split(","):
        spec = _spec(name)
        params = spec.num_layers * (spec.qkv_rows * spec.hidden_size + spec.hidden_size * spec.num_heads
                                    * spec.head_dim + 3 * spec.intermediate_size * spec.hidden_size)
        params += 2 * spec.vocab_size * spec.hidden_size
        for tp in sizes:
            if tp > gpus:
                notes.append(f"{name} TP={tp}: skipped, {gpus} GPUs visible")
                continue
            if params * 2 / tp > 0.85 * H200_BYTES:
                notes.append(f"{name} TP={tp}: skipped, {params * 2 / tp / 1e9:.0f} GB of bf16 weights "
                             f"per GPU do not fit one H200 (141 GB)")
                continue
            t0 = time.perf_counter()
            rows += launch(_rank_bench, tp, args=(name, batches, contexts, args.reps, kinds, methods),
                           backend="nccl", timeout_s=300, run_timeout_s=600)
            print(f"{name} TP={tp}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"device": torch.cuda.get_device_name(0), "gpus": gpus, "rows": rows,
            "notes": notes, "targets": targets(rows)}


def targets(rows) -> list[dict]:
    """The issue's targets, evaluated where the rows exist."""
    out = []
    by = {(r["model"], r["weights"], r["tp"], r["allreduce"], r["batch"], r["context"]): r
          for r in rows if "step_us" in r}
    for (m, w, tp, ar, b, c), r in sorted(by.items()):
        one = by.get((m, w, 1, "-", b, c))
        if m == "llama-3.1-8b" and b == 1 and tp == 2 and one:
            ratio = r["step_us"] / one["step_us"]
            out.append(dict(target=f"8B {w} b1 ctx {c} {ar}: TP=2 step / TP=1 step <= 0.62", value=ratio,
                            met=ratio <= 0.62))
        if m == "llama-3.1-70b" and b == 1 and c == 1024 and tp == 2:
            ratio = r["step_us"] / r["weight_ar_floor_us"]
            out.append(dict(target=f"70B {w} b1 ctx 1k TP=2 {ar}: step / (weights / bw + all-reduces) <= 1.25",
                            value=ratio, met=ratio <= 1.25))
    return out


def table(result: dict) -> str:
    lines = [f"{result['gpus']} x {result['device']}",
             f"{'model':<14} {'w':<4} {'tp':>2} {'allreduce':<9} {'bs':>3} {'ctx':>5} {'step us':>8} {'ar us':>6} "
             f"{'#ar':>4} {'floor us':>8} {'x floor':>7} {'GB/gpu':>6}"]
    for r in result["rows"]:
        if "step_us" not in r:
            lines.append(f"{r['model']:<14} {r['weights']:<4} {r['tp']:>2} {r['allreduce']:<9} {r['skipped']}")
            continue
        lines.append(f"{r['model']:<14} {r['weights']:<4} {r['tp']:>2} {r['allreduce']:<9} {r['batch']:>3} "
                     f"{r['context']:>5} {r['step_us']:>8.1f} "
                     f"{r['ar_us']:>6.1f} {r['ar_count']:>4} {r['floor_us']:>8.1f} {r['step_over_floor']:>7.2f} "
                     f"{(r['weight_bytes_per_gpu'] + r['kv_bytes_per_gpu']) / 1e9:>6.1f}")
    lines += [f"note: {n}" for n in result["notes"]]
    lines += [f"target {'MET' if t['met'] else 'MISSED'}: {t['target']}: {t['value']:.3f}" for t in result["targets"]]
    return "\n".join(lines)


def plot(result: dict, png: Path) -> None:
    from benchlib import pyplot
    plt = pyplot()
    if plt is None or not result["rows"]:
        return
    done = [r for r in result["rows"] if "step_us" in r]
    keys = sorted({(r["model"], r["weights"], r["batch"], r["context"]) for r in done})
    series = sorted({(r["tp"], r["allreduce"]) for r in done})
    if not keys:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys)), 4))
    width = 0.8 / len(series)
    for j, (tp, ar) in enumerate(series):
        for i, k in enumerate(keys):
            r = next((r for r in done if (r["model"], r["weights"], r["batch"], r["context"]) == k
                      and (r["tp"], r["allreduce"]) == (tp, ar)), None)
            if r:
                ax.bar(i + j * width, r["step_us"], width, color=f"C{j}",
                       label=(f"TP={tp}" + (f" {ar}" if tp > 1 else "")) if i == 0 else None)
                if r["floor_us"] == r["floor_us"]:                     # not NaN (the CPU smoke)
                    ax.plot([i + j * width - width / 2, i + j * width + width / 2], [r["floor_us"]] * 2, "k-")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))])
    ax.set_xticklabels([f"{m.split('-')[-1]} {w}\nb{b} c{c}" for m, w, b, c in keys], fontsize=8)
    ax.set(ylabel="us / decode step (black: floor)", yscale="log", title="graphrt tensor-parallel decode")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "bench_tp.json").write_text(json.dumps(result, indent=1))
    text = table(result)
    (out / "bench_tp.txt").write_text(text + "\n")
    print(text)
    plot(result, out / "bench_tp.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
