"""Where the persistent decode step's time goes: a per-unit timeline of one step on the GPU.

Random bf16 Llama-shaped model (tools/bench_e2e.py's, all layers, the real vocabulary), the
given batch and context; the step (graphrt/kernels/persistent/) launched alone from a CUDA graph
for its device µs per step against the floor (weight + KV bytes over the measured copy
bandwidth), then once more built with timeline=True: every unit stamps the GPU's global timer
at its start, when its wait returned, and at its end (timeline.py). Per unit kind: units, total
µs (summed over the programs), µs per unit, the wait share, bytes streamed and the rate while
streaming (one program's GB/s), and the step's span, the programs' busy share, the aggregate
rate and each layer's average window. A comma list in --num-warps / --block-k / --prefetch /
--prefetch-bytes / --splits / --stages runs every combination (each one compiles the kernel
twice); --stages N streams the GEMV weights through a shared-memory ring of N chunks (0: three
chunks in registers, the default; kernels/persistent/gemv_ring.py). --weights: the model's linear
weights as bench_e2e's kinds (bf16; fp8, fp8-tensor, fp8-head, ...: FP8 e4m3, W8A16 in the step;
int4, int4-sym, int4-head: graphrt's int4; fp8-block is refused by the step), one run each; the
bytes per unit are the quantized tiles' (scales and zeros not counted).

    python tools/profile_persistent.py --model llama-3.2-1b --batch 1 --context 1024 --out persistent_1b.json
    python tools/profile_persistent.py --model llama-3.1-8b --num-warps 4,8 --block-k 128,256
    python tools/profile_persistent.py --model llama-3.2-1b --stages 0,2,4,6,8,12 --out stages_1b.json
    python tools/profile_persistent.py --model llama-3.1-8b --weights bf16,fp8,int4 --out formats_8b.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from bench_e2e import INT4_KINDS, SHAPES, WEIGHT_KINDS, random_model, with_weights
from benchlib import copy_bandwidth


def _ints(p, text: str, name: str, lo: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < lo for v in vals):
        p.error(f"--{name}: expected a comma list of ints >= {lo}, got {text!r}")
    return vals


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-1b", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=1, help="decode rows, 1..16")
    p.add_argument("--context", type=int, default=1024, help="tokens cached per row (+ the new one)")
    p.add_argument("--num-warps", default="8", help="warps per program (comma list)")
    p.add_argument("--block-k", default="256", help="Tiles.block_k: K columns of a 16-row weight chunk (comma list)")
    p.add_argument("--prefetch", default="1", help="L2 prefetch distance in units, 0 = off (comma list)")
    p.add_argument("--prefetch-bytes", default=str(128 << 10),
                   help="at most this much of a tile prefetched (comma list)")
    p.add_argument("--splits", default="0", help="KV splits per (row, kv head), 0 = the default (comma list)")
    p.add_argument("--stages", default="0",
                   help="GEMV weight chunks in a shared-memory ring, 0 = three in registers (comma list)")
    p.add_argument("--programs-per-sm", default="1",
                   help="programs in the grid per SM (2 with --num-warps 4: two co-resident programs an SM; "
                        "the cooperative launch refuses a grid that cannot be resident) (comma list)")
    p.add_argument("--weights", default="bf16", help="comma list of weight kinds (bench_e2e's): bf16, fp8, int4, ...")
    p.add_argument("--replays", type=int, default=20, help="steps per timed graph")
    p.add_argument("--out", default="profile_persistent.json")
    args = p.parse_args(argv)
    if not 1 <= args.batch <= 16:
        p.error(f"--batch: expected 1..16, got {args.batch}")
    if args.context < 1:
        p.error(f"--context: expected >= 1, got {args.context}")
    if args.replays < 1:
        p.error(f"--replays: expected >= 1, got {args.replays}")
    kinds = ["bf16"] + sorted(WEIGHT_KINDS) + sorted(INT4_KINDS)
    args.weights = args.weights.split(",")
    bad = [k for k in args.weights if k not in kinds]
    if bad:
        p.error(f"--weights: {bad[0]!r} is not one of {kinds}")
    args.num_warps = _ints(p, args.num_warps, "num-warps", 1)
    args.block_k = _ints(p, args.block_k, "block-k", 16)
    args.prefetch = _ints(p, args.prefetch, "prefetch", 0)
    args.prefetch_bytes = _ints(p, args.prefetch_bytes, "prefetch-bytes", 0)
    args.splits = _ints(p, args.splits, "splits", 0)
    args.stages = _ints(p, args.stages, "stages", 0)
    args.programs_per_sm = _ints(p, args.programs_per_sm, "programs-per-sm", 1)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.kernels.persistent import PersistentStep, Tiles
    from graphrt.kernels.persistent.timeline import layers_table, summarize, unit_bytes
    from graphrt.kernels.timing import graph_us
    from graphrt.model.persistent import geometry

    base, _ = random_model(args.model, torch)
    s, n, ctx = base.spec, args.batch, args.context
    per_row = -(-(ctx + 1) // 16)
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (n * per_row, 16, s.num_kv_heads, s.head_dim)
    caches = [PagedKVCache(torch.randn(shape, generator=gen, device="cuda").bfloat16(),
                           torch.randn(shape, generator=gen, device="cuda").bfloat16()) for _ in range(s.num_layers)]
    table = torch.arange(n * per_row, dtype=torch.int32, device="cuda").view(n, per_row)
    lens = torch.full((n,), ctx + 1, dtype=torch.int32, device="cuda")        # ctx cached + the new token
    tokens = torch.randint(0, s.vocab_size, (n,), generator=gen, device="cuda")
    out = torch.zeros(n, dtype=torch.int64, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    bw = copy_bandwidth(torch)         # the floor's bandwidth: bytes moved by a copy (read + written) per second, as bench_e2e
    dev = torch.cuda.get_device_properties(0)
    results = []
    for wk, warps, bk, pf, pfb, sp, st, per_sm in itertools.product(args.weights, args.num_warps, args.block_k,
                                                                    args.prefetch, args.prefetch_bytes, args.splits,
                                                                    args.stages, args.programs_per_sm):
        model, _ = with_weights(base, wk, torch)
        cfg = dict(weights=wk, num_warps=warps, block_k=bk, prefetch=pf, prefetch_bytes=pfb, splits=sp, stages=st,
                   programs_per_sm=per_sm)
        kw = dict(geometry=geometry(model), rows=n, eps=s.rms_norm_eps, tiles=Tiles(block_k=bk, splits=sp),
                  max_context_len=ctx + 64, num_warps=warps, prefetch=pf, prefetch_bytes=pfb, stages=st,
                  programs=per_sm * dev.multi_processor_count)
        try:
            step = PersistentStep(model.weights, caches, model.cos_sin, **kw)
            step_us = graph_us(lambda: step.launch(tokens, lens, table, out, err), args.replays, 5)
            timed = PersistentStep(model.weights, caches, model.cos_sin, timeline=True, **kw)
            spans = []
            for _ in range(3):
                timed.launch(tokens, lens, table, out, err)
                torch.cuda.synchronize()
                spans.append(timed.timeline.cpu())
        except Exception as e:                           # noqa: BLE001 - one configuration's failure, reported
            print(f"{cfg}: failed: {type(e).__name__}: {str(e)[:300]}")
            results.append({**cfg, "error": f"{type(e).__name__}: {e}"})
            continue
        sch = timed.schedule
        nbytes = unit_bytes(sch, lens.tolist(), kv_bytes=2)
        rep = summarize(sch, spans[-1], nbytes)
        layers = layers_table(sch, spans[-1])
        windows = [max(w[1] for k, w in d.items() if k != "layer") - min(w[0] for k, w in d.items() if k != "layer")
                   for d in layers[:-1]]
        head = layers[-1].get("lm_head", [0.0, 0.0])
        floor_us = rep["total"]["bytes"] / bw * 1e6
        res = {**cfg, "model": args.model, "batch": n, "context": ctx, "device": dev.name, "programs": sch.programs,
               "splits_used": sch.splits, "device_us": step_us, "floor_us": floor_us, "x_floor": step_us / floor_us,
               "copy_tb_s": bw * 2 / 1e12, "bytes": rep["total"]["bytes"], "timeline": rep,
               "layer_window_us": statistics.mean(windows) if windows else 0.0,
               "head_window_us": head[1] - head[0],
               "device_error": int(err)}
        results.append(res)
        print(f"\n{args.model} bs{n} ctx{ctx} {dev.name} programs {sch.programs} S {sch.splits} {cfg}: "
              f"device {step_us:.0f} us/step, floor {floor_us:.0f} us ({step_us / floor_us:.2f}x), timeline span "
              f"{rep['span_us']:.0f} us, aggregate {rep['aggregate_gb_s']:.0f} GB/s, busy "
              f"{100 * statistics.mean(rep['busy_share']):.0f}%, timer step {rep['timer_step_ns']} ns, layer window "
              f"{res['layer_window_us']:.1f} us, lm_head window {res['head_window_us']:.1f} us")
        print(f"  {'unit':<10} {'count':>6} {'total us':>10} {'us/unit':>8} {'wait %':>7} {'MB':>8} {'GB/s/prog':>9}")
        for name, k in sorted(rep["kinds"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"  {name:<10} {k['units']:>6} {k['us']:>10.0f} {k['us_per_unit']:>8.2f} "
                  f"{100 * k['wait_us'] / max(k['us'], 1e-9):>6.0f}% {k['bytes'] / 1e6:>8.1f} {k['gb_s']:>9.1f}")
        del step, timed, model
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
