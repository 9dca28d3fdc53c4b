"""Prefill attention of one request side by side: graphrt's plan-free multi-query kernel in query
tiles (the prefill graphs' attention, kernels/multiquery_attention.py) at two key-block sizes vs
FlashInfer's batch prefill (planned once, outside the timing), device µs per call (CUDA events,
medians), for a prompt piece of T new tokens after C cached ones, per model shape.

    python tools/bench_prefill_attention.py --out prefill_attention.json     # a CUDA GPU

Prints a table and writes JSON: shape, T, C, splits, each variant's µs, their ratio to FlashInfer
and the max |difference| of the outputs against FlashInfer's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import device_us  # noqa: E402

SHAPES = {"llama-3.2-1b": (32, 8, 64), "llama-3.1-8b": (32, 8, 128)}   # Hq, Hkv, head_dim


def one(torch, fi, shape, t, cached, page=16):
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.kernels.multiquery_attention import default_splits, multiquery_attention, query_tiles
    hq, hkv, d = SHAPES[shape]
    dev = torch.device("cuda")
    n = cached + t
    pages = -(-n // page)
    k = torch.randn(pages, page, hkv, d, device=dev, dtype=torch.bfloat16)
    cache = PagedKVCache(k, torch.randn_like(k), "NHD")
    table = torch.arange(pages, dtype=torch.int32, device=dev)[None]
    q = torch.randn(1, t, hq, d, device=dev, dtype=torch.bfloat16)
    lens = torch.tensor([n], dtype=torch.int32, device=dev)
    qlens = torch.tensor([t], dtype=torch.int32, device=dev)
    splits = default_splits(dev, query_tiles(t, hq // hkv)[2], hkv, 8192)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(torch.tensor([0, t], dtype=torch.int32, device=dev), torch.tensor([0, pages], dtype=torch.int32, device=dev),
           table[0], torch.tensor([n - (pages - 1) * page], dtype=torch.int32, device=dev), hq, hkv, d, page,
           causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    ref = w.run(q[0], (cache.k, cache.v))
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", default="32,512")
    p.add_argument("--cached", default="0,4096")
    p.add_argument("--out", default="bench_prefill_attention.json")
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_prefill_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    import flashinfer
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
