"""Prefill attention of one request side by side: graphrt's plan-free multi-query kernel in query
tiles (the prefill graphs' attention, kernels/multiquery_attention.py) at two key-block sizes vs
FlashInfer's batch prefill (planned once, outside the timing), device µs per call (CUDA events,
medians), for a prompt piece of T new tokens after C cached ones, per model shape.

    python tools/bench_prefill_attention.py --out prefill_attention.json     # a CUDA GPU

Prints a table and writes JSON: shape, T, C, splits, each variant's µs, their ratio to FlashInfer
and the max |difference| of the outputs against FlashInfer's.

--sweep: the kernel's launch configurations instead (split count, keys per block, warps, pipeline
stages), each timed as one CUDA graph of --layers calls over as many distinct caches (a step's
layers: the keys stream from memory, not the L2), with the split-KV combine; FlashInfer's batch
prefill over the same caches as the reference; the fastest configurations first.

    python tools/bench_prefill_attention.py --sweep --shapes llama-3.2-1b --tokens 32,64,128 \
        --cached 0,2048,4032 --out mq_sweep.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import device_us  # noqa: E402

SHAPES = {"llama-3.2-1b": (32, 8, 64), "llama-3.1-8b": (32, 8, 128)}   # Hq, Hkv, head_dim


def _case(torch, fi, shape, t, cached, caches=1, page=16):
    """T query tokens after `cached` keys at a shape's heads (CUDA, bf16): `caches` distinct
    paged caches, the block table, q, kv_lens, q_lens and FlashInfer's batch prefill planned for
    them (its reference output over the first cache)."""
    from graphrt.attention.kvcache import PagedKVCache
    hq, hkv, d = SHAPES[shape]
    dev = torch.device("cuda")
    n = cached + t
    pages = -(-n // page)
    kv = [PagedKVCache(torch.randn(pages, page, hkv, d, device=dev, dtype=torch.bfloat16),
                       torch.randn(pages, page, hkv, d, device=dev, dtype=torch.bfloat16), "NHD")
          for _ in range(caches)]
    table = torch.arange(pages, dtype=torch.int32, device=dev)[None]
    q = torch.randn(1, t, hq, d, device=dev, dtype=torch.bfloat16)
    lens = torch.tensor([n], dtype=torch.int32, device=dev)
    qlens = torch.tensor([t], dtype=torch.int32, device=dev)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(torch.tensor([0, t], dtype=torch.int32, device=dev), torch.tensor([0, pages], dtype=torch.int32, device=dev),
           table[0], torch.tensor([n - (pages - 1) * page], dtype=torch.int32, device=dev), hq, hkv, d, page,
           causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return kv, table, q, lens, qlens, w, w.run(q[0], (kv[0].k, kv[0].v))


def one(torch, fi, shape, t, cached):
    from graphrt.kernels.multiquery_attention import default_splits, multiquery_attention, query_tiles
    hq, hkv, _ = SHAPES[shape]
    (cache,), table, q, lens, qlens, w, ref = _case(torch, fi, shape, t, cached)
    splits = default_splits(q.device, query_tiles(t, hq // hkv)[2], hkv, 8192)
    row = {"shape": shape, "tokens": t, "cached": cached, "splits": splits}
    row["flashinfer_us"] = device_us(lambda: w.run(q[0], (cache.k, cache.v)), torch)
    for bn in (64, 128):
        run = lambda bn=bn: multiquery_attention(q, cache, table, lens, q_lens=qlens, splits=splits,  # noqa: E731
                                                 block_n=bn)
        out = run()
        row[f"graphrt_n{bn}_us"] = device_us(run, torch)
        row[f"graphrt_n{bn}_x_flashinfer"] = row[f"graphrt_n{bn}_us"] / row["flashinfer_us"]
        row[f"graphrt_n{bn}_max_abs_diff"] = float((out[0].float() - ref.float()).abs().max())
    return row


def sweep(torch, fi, shape, t, cached, layers):
    """Every launch configuration of the multi-query kernel for T tokens after `cached` ones,
    `layers` calls per graph over distinct caches -> rows sorted by µs (+ FlashInfer's)."""
    import itertools
    from graphrt.kernels.multiquery_attention import default_splits, multiquery_attention, piece_launch, query_tiles
    from graphrt.kernels.timing import graph_us
    hq, hkv, _ = SHAPES[shape]
    caches, table, q, lens, qlens, w, ref = _case(torch, fi, shape, t, cached, layers)
    out = torch.empty_like(q)
    default = default_splits(q.device, query_tiles(t, hq // hkv)[2], hkv, 8192)
    chosen = piece_launch(q.device, t, hq // hkv, hkv, 8192)        # (splits, block_n) a captured piece runs
    base = {"shape": shape, "tokens": t, "cached": cached, "layers": layers, "default_splits": default,
            "piece_launch": list(chosen)}
    fi_us = graph_us(lambda: [w.run(q[0], (c.k, c.v)) for c in caches], 4, 5)
    rows = []
    for sp, bn, nw, ns in itertools.product(sorted({1, 2, 4, 8, default, chosen[0]}), (32, 64, 128), (4, 8), (1, 2, 3, 4)):
        def run(c, sp=sp, bn=bn, nw=nw, ns=ns):
            return multiquery_attention(q, c, table, lens, q_lens=qlens, splits=sp, block_n=bn, out=out,
                                        num_warps=nw, num_stages=ns)
        try:
            run(caches[0])
            err = float((out[0].float() - ref.float()).abs().max())
            us = graph_us(lambda: [run(c) for c in caches], 4, 5)
        except Exception as e:                          # e.g. out of shared memory at this config
            rows.append(base | {"splits": sp, "block_n": bn, "num_warps": nw, "num_stages": ns,
                                "error": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        rows.append(base | {"splits": sp, "block_n": bn, "num_warps": nw, "num_stages": ns, "us": us,
                            "us_per_layer": us / layers, "x_flashinfer": us / fi_us, "max_abs_diff": err,
                            "flashinfer_us": fi_us})
    return sorted(rows, key=lambda r: r.get("us", float("inf")))


def main_sweep(a, torch, fi) -> int:
    res = []
    for s in a.shapes.split(","):
        for t in a.tokens.split(","):
            for c in a.cached.split(","):
                rows = sweep(torch, fi, s, int(t), int(c), a.layers)
                res.append(rows)
                ok = [r for r in rows if "us" in r]
                dflt = [r for r in ok if r["splits"] == r["default_splits"] and r["block_n"] == 64
                        and r["num_warps"] == 8 and r["num_stages"] == 3]
                print(f"{s} T={t} cached={c}: flashinfer {ok[0]['flashinfer_us'] / a.layers:.1f} us/layer; "
                      f"default (splits {ok[0]['default_splits']}, n64, w8, s3) "
                      f"{dflt[0]['us_per_layer'] if dflt else float('nan'):.1f}; best:")
                mine = [r for r in ok if [r["splits"], r["block_n"]] == r["piece_launch"] and r["num_warps"] == 8
                        and r["num_stages"] == 3]
                if mine:
                    print(f"   piece_launch (splits {mine[0]['splits']}, n{mine[0]['block_n']}, w8, s3): "
                          f"{mine[0]['us_per_layer']:.1f} us/layer")
                for r in ok[:6]:
                    print(f"   splits {r['splits']:>2} n{r['block_n']:<3} w{r['num_warps']} s{r['num_stages']}: "
                          f"{r['us_per_layer']:.1f} us/layer ({r['x_flashinfer']:.2f}x flashinfer, max|d| {r['max_abs_diff']:.3f})")
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "sweeps": res}, indent=1))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", default="32,512")
    p.add_argument("--cached", default="0,4096")
    p.add_argument("--out", default="bench_prefill_attention.json")
    p.add_argument("--sweep", action="store_true", help="the kernel's launch configurations (see above)")
    p.add_argument("--layers", type=int, default=16, help="--sweep: calls (distinct caches) per graph")
    a = p.parse_args(argv)
    if a.layers < 1:
        p.error(f"--layers: must be >= 1, got {a.layers}")
    import torch
    if not torch.cuda.is_available():
        print("bench_prefill_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    import flashinfer
    if a.sweep:
        return main_sweep(a, torch, flashinfer)
    rows = [one(torch, flashinfer, s, int(t), int(c)) for s in a.shapes.split(",")
            for t in a.tokens.split(",") for c in a.cached.split(",")]
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"{'shape':<14}{'T':>5}{'cached':>7}{'splits':>7}{'flashinfer':>11}{'n64':>8}{'x':>6}{'n128':>8}{'x':>6}"
          f"{'max|d|':>8}")
    for r in rows:
        print(f"{r['shape']:<14}{r['tokens']:>5}{r['cached']:>7}{r['splits']:>7}{r['flashinfer_us']:>11.1f}"
              f"{r['graphrt_n64_us']:>8.1f}{r['graphrt_n64_x_flashinfer']:>6.2f}{r['graphrt_n128_us']:>8.1f}"
              f"{r['graphrt_n128_x_flashinfer']:>6.2f}{r['graphrt_n64_max_abs_diff']:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
