"""Per-layer element-wise kernels at decode shapes: graphrt's Triton kernels vs FlashInfer's.

Side by side, device µs per call (one CUDA graph of back-to-back calls, events, median):
  add+rmsnorm   graphrt add_rms_norm            vs flashinfer.fused_add_rmsnorm
  silu*mul      graphrt silu_mul                vs flashinfer.silu_and_mul
  rope+append   graphrt rope_append_decode (1)  vs flashinfer apply_rope_with_cos_sin_cache_inplace
                                                   + append_paged_kv_cache (2 launches, as engines do)
Shapes: Llama-3.2-1B and Llama-3.1-8B, batch 1 / 16 / 64, bf16, page 16, context 1k.

    python tools/bench_kernels.py --out bench_kernels.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = {"llama-3.2-1b": (2048, 8192, 32, 8, 64), "llama-3.1-8b": (4096, 14336, 32, 8, 128)}


def graph_us(fn, torch, reps=50):
    from benchlib import device_us
    for _ in range(3):
        fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return device_us(g.replay, torch, reps=5, repeats=5) / reps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--out", default="bench_kernels.json")
    args = p.parse_args(argv)
    import flashinfer
    import torch

    from graphrt.kernels.activation import silu_mul
    from graphrt.kernels.norm import add_rms_norm
    from graphrt.kernels.rope_append import rope_append_decode
    from graphrt.attention.kvcache import PagedKVCache
    dev, bf = "cuda", torch.bfloat16
    rows = []
    for name, (h, inter, hq, hkv, d) in SHAPES.items():
        for b in [int(x) for x in args.batches.split(",")]:
            x, res = (torch.randn(b, h, device=dev, dtype=bf) for _ in range(2))
            w = torch.randn(h, device=dev, dtype=bf)
            gu = torch.randn(b, 2 * inter, device=dev, dtype=bf)
            act = torch.empty(b, inter, device=dev, dtype=bf)
            t = {"add+rmsnorm": (graph_us(lambda: add_rms_norm(x, res, w, 1e-5), torch),
                                 graph_us(lambda: flashinfer.fused_add_rmsnorm(x, res, w, 1e-5), torch)),
                 "silu*mul": (graph_us(lambda: silu_mul(gu, out=act), torch),
                              graph_us(lambda: flashinfer.silu_and_mul(gu, out=act), torch))}
            ctx, page = 1024, 16
            pages = ctx // page + 1
            k = torch.randn(b * pages, page, hkv, d, device=dev, dtype=bf)
            cache = PagedKVCache(k, torch.randn_like(k), "NHD")
            table = torch.arange(b * pages, dtype=torch.int32, device=dev).view(b, pages)
            lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
            err = torch.zeros(1, dtype=torch.int32, device=dev)
            qkv = torch.randn(b, (hq + 2 * hkv) * d, device=dev, dtype=bf)
            q_out = torch.empty(b, hq, d, device=dev, dtype=bf)
            pos = torch.full((b,), ctx - 1, dtype=torch.int64, device=dev)
            cs = torch.randn(4096, d, device=dev, dtype=torch.float32)
            indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * pages
            last = torch.full((b,), ctx % page or page, dtype=torch.int32, device=dev)
            batch_idx = torch.arange(b, dtype=torch.int32, device=dev)
            posi = torch.full((b,), ctx - 1, dtype=torch.int32, device=dev)
            qf, kf = torch.randn(b, hq * d, device=dev, dtype=bf), torch.randn(b, hkv * d, device=dev, dtype=bf)
            vf = torch.randn(b, hkv, d, device=dev, dtype=bf)

            def fi_rope_append():
                flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, qf, kf, d, cs, is_neox=True)
                flashinfer.append_paged_kv_cache(kf.view(b, hkv, d), vf, batch_idx, posi, (cache.k, cache.v),
                                                 table.view(-1), indptr, last, "NHD")
            t["rope+append"] = (graph_us(lambda: rope_append_decode(qkv, cs, cache, table, lens, err,
                                                                    num_q_heads=hq, q_out=q_out), torch),
                                graph_us(fi_rope_append, torch))
            for op, (ours, theirs) in t.items():
                rows.append(dict(shape=name, batch=b, op=op, graphrt_us=ours, flashinfer_us=theirs,
                                 choice="graphrt" if ours <= theirs else "flashinfer"))
                print(rows[-1], file=sys.stderr)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"{'shape':<13} {'bs':>3} {'op':<12} {'graphrt us':>10} {'flashinfer us':>13} {'faster':<10}")
    for r in rows:
        print(f"{r['shape']:<13} {r['batch']:>3} {r['op']:<12} {r['graphrt_us']:>10.2f} "
              f"{r['flashinfer_us']:>13.2f} {r['choice']:<10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
