"""Decode-shape GEMMs: cuBLAS vs graphrt's Triton GEMV candidates, side by side (H200, bf16).

Per (shape, batch): device µs per call (one CUDA graph of back-to-back calls, events, median),
the weight floor (weight bytes / measured copy bandwidth) and each variant's ratio to it; the
fastest is what `graphrt.model.linear.Linear.choose` would pick at capture.

    python tools/bench_gemv.py --out bench_gemv.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchlib import copy_bandwidth

SHAPES = {  # name: (N, K)
    "1b-qkv": (3072, 2048), "1b-o": (2048, 2048), "1b-gate_up": (16384, 2048),
    "1b-down": (2048, 8192), "1b-lm_head": (128256, 2048),
    "8b-qkv": (6144, 4096), "8b-o": (4096, 4096), "8b-gate_up": (28672, 4096),
    "8b-down": (4096, 14336), "8b-lm_head": (128256, 4096),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--out", default="bench_gemv.json")
    args = p.parse_args(argv)
    import torch

    from graphrt.model.linear import CUBLAS, Linear
    bw = copy_bandwidth(torch)
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * 0.02
        lin = Linear(w)
        lin.choose(batches)  # rotates over weight copies that exceed the L2
        floor = n * k * 2 / bw * 1e6
        for m in batches:
            t = lin.timings_us[m]
            best = min(t, key=t.get)
            rows.append(dict(shape=name, n=n, k=k, batch=m, floor_us=floor, timings_us=t,
                             cublas_us=t[CUBLAS], best=best, best_us=t[best]))
            print(rows[-1], file=sys.stderr)
        del w, lin
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "copy_bw_bytes_per_s": bw, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'shape':<12} {'bs':>3} {'floor us':>8} {'cublas us':>9} {'x floor':>7} {'best':<32} "
          f"{'best us':>7} {'x floor':>7}")
    for r in rows:
        print(f"{r['shape']:<12} {r['batch']:>3} {r['floor_us']:>8.1f} {r['cublas_us']:>9.1f} "
              f"{r['cublas_us'] / r['floor_us']:>7.2f} {r['best']:<32} {r['best_us']:>7.1f} "
              f"{r['best_us'] / r['floor_us']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
