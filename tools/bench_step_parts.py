"""Pieces of a decode step timed alone on the GPU: the decode GEMMs with split-K by a view, and
decode attention kernels per layer. Table + JSON.

GEMM split-K by a view (no new kernel): x [M, K] @ W[N, K].T as one GEMM of x.view(S*M, K/S)
against W.view(S*N, K/S) -> Y' [S*M, S*N]; Y[m, r] = sum_s Y'[S*m + s, S*r + s]. Same weight
bytes, S x more output tiles for cuBLAS(Lt) to spread over the SMs; the diagonal sum is what a
consumer kernel would read. Timed: the GEMM alone (bf16 F.linear; FP8 torch._scaled_mm with
per-tensor scales, rows padded to 16), in one CUDA graph rotating over weight copies past the L2.

graphrt's split-K path (--parts splitk): the o and down GEMMs as the decode step runs them
(graphrt.model.splitk.split_matmul, or the unsplit F.linear / fp8_matmul at S = 1) followed by
their consumer add_rms_norm, which sums the S partials as it loads: what the GEMM-alone rows
leave out (the partials' extra output bytes, read back strided). FP8: per-tensor weight scales.

Decode attention (one layer, bs B, context C): graphrt's multi-query kernel at Q = 1 (its
split-KV + combine: two launches) for several split counts; compare with the FlashInfer decode
per layer from tools/profile_step.py (attention + merge families / layers).

    python tools/bench_step_parts.py --out bench_step_parts.json
    python tools/bench_step_parts.py --parts splitk --ms 1,4,16,64 --splits 1,2,4
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GEMMS = {  # name: (N, K)
    "8b.qkv": (6144, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096), "8b.down": (4096, 14336),
    "1b.qkv": (3072, 2048), "1b.o": (2048, 2048), "1b.gate_up": (16384, 2048), "1b.down": (2048, 8192),
}
ATTN = {"8b": (32, 8, 128), "1b": (32, 8, 64)}   # q heads, kv heads, head dim
L2_BYTES = 128 << 20


def gemm_rows(torch, ms, splits, bw) -> list[dict]:
    from graphrt.kernels.timing import graph_us
    fp8 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda", dtype=torch.float32)
    rows = []
    for name, (n, k) in GEMMS.items():
        for dtype in ("bf16", "fp8"):
            esz = 2 if dtype == "bf16" else 1
            w0 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            ws = [w0 if dtype == "bf16" else w0.to(fp8) for _ in range(max(2, min(16, L2_BYTES // (n * k * esz))))]
            ws = [w.clone() for w in ws]
            for m in ms:
                for s in splits:
                    if k % s or (k // s) % 16:
                        continue
                    rows_x = s * m
                    pad = rows_x if dtype == "bf16" else -(-rows_x // 16) * 16
                    x = torch.randn(pad, k // s, device="cuda", dtype=torch.bfloat16)
                    if dtype == "fp8":
                        x = x.to(fp8)
                    views = [w.view(s * n, k // s) for w in ws]
                    if dtype == "bf16":
                        def run(views=views, x=x):
                            for w in views:
                                torch.nn.functional.linear(x, w)
                    else:
                        def run(views=views, x=x):
                            for w in views:
                                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                    us = graph_us(run, 10, 5) / len(views)
                    floor = n * k * esz / bw * 1e6
                    rows.append({"gemm": name, "dtype": dtype, "m": m, "split": s, "us": us,
                                 "floor_us": floor, "x_floor": us / floor})
                    print(f"{name:<11} {dtype:<4} M={m:<3} S={s}: {us:7.2f} us  x floor {us / floor:5.2f}", flush=True)
    return rows


def splitk_rows(torch, ms, splits, bw) -> list[dict]:
    from graphrt.kernels.fp8 import quantize_rows
    from graphrt.kernels.norm import add_rms_norm
    from graphrt.kernels.timing import graph_us
    from graphrt.model.linear import fp8_matmul
    from graphrt.model.quant import quantize_fp8
    from graphrt.model.splitk import split_matmul, splittable
    one = torch.ones((), device="cuda", dtype=torch.float32)
    rows = []
    for name, (n, k) in GEMMS.items():
        if name.split(".")[1] not in ("o", "down"):
            continue
        for dtype in ("bf16", "fp8"):
            esz = 2 if dtype == "bf16" else 1
            w0 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            count = max(2, min(16, L2_BYTES // (n * k * esz)))
            ws = [w0.clone() if dtype == "bf16" else quantize_fp8(w0, "tensor") for _ in range(count)]
            norm = torch.ones(n, device="cuda", dtype=torch.bfloat16)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                x = x if dtype == "bf16" else quantize_rows(x)
                res = torch.zeros(m, n, device="cuda", dtype=torch.bfloat16)
                for s in splits:
                    if not splittable(ws[0], s):
                        continue

                    def run(s=s, x=x, res=res):
                        for w in ws:
                            y = split_matmul(x, w, s, unit=one) if s > 1 else (
                                torch.nn.functional.linear(x, w) if dtype == "bf16" else fp8_matmul(x, w, unit=one))
                            add_rms_norm(y, res, norm, 1e-5)
                    us = graph_us(run, 10, 5) / len(ws)
                    floor = n * k * esz / bw * 1e6
                    rows.append({"gemm": name, "dtype": dtype, "m": m, "split": s, "us": us,
                                 "floor_us": floor, "x_floor": us / floor})
                    print(f"splitk {name:<8} {dtype:<4} M={m:<3} S={s}: {us:7.2f} us GEMM + add_rms_norm  "
                          f"x floor {us / floor:5.2f}", flush=True)
    return rows


def attention_rows(torch, batches, contexts, split_list) -> list[dict]:
    from graphrt.kernels.multiquery_attention import default_splits, multiquery_attention
    from graphrt.kernels.timing import graph_us

    class Cache:                                     # the two fields multiquery_attention reads
        def __init__(self, k, v, fp8, scale):
            self.k, self.v, self.layout, self.fp8, self.scale = k, v, "NHD", fp8, scale

        def as_tuple(self):
            return self.k, self.v
    rows, page = [], 16
    for shape, (hq, hkv, d) in ATTN.items():
        for kv in ("bf16", "fp8"):
            for b in batches:
                for c in contexts:
                    pages = -(-c // page)
                    kd = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
                    k = (torch.randn(b * pages + 1, page, hkv, d, device="cuda", dtype=torch.bfloat16)).to(kd)
                    v = (torch.randn(b * pages + 1, page, hkv, d, device="cuda", dtype=torch.bfloat16)).to(kd)
                    cache = Cache(k, v, kv == "fp8", torch.ones(2, device="cuda"))
                    table = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
                    lens = torch.full((b,), c, dtype=torch.int32, device="cuda")
                    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
                    out = torch.empty_like(q)
                    auto = default_splits(q.device, b, hkv, c)
                    for s in sorted(set(split_list + [auto])):
                        us = graph_us(lambda s=s: multiquery_attention(q, cache, table, lens, splits=s, out=out), 20, 5)
                        kv_bytes = 2 * b * c * hkv * d * (2 if kv == "bf16" else 1)
                        rows.append({"attn": shape, "kv": kv, "batch": b, "context": c, "splits": s,
                                     "auto": s == auto, "us": us, "kv_bytes": kv_bytes})
                        print(f"attn {shape} kv={kv} bs{b} ctx{c} splits={s}{'*' if s == auto else ' '}: {us:7.2f} us",
                              flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1,16")
    p.add_argument("--splits", default="1,2,4,8")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--attn-splits", default="1,4,8,16,32")
    p.add_argument("--parts", default="gemm,attention", help="of gemm, splitk, attention")
    p.add_argument("--out", default="bench_step_parts.json")
    args = p.parse_args(argv)
    import torch
    sys.path.insert(0, str(Path(__file__).parent))
    from benchlib import copy_bandwidth
    bw = copy_bandwidth(torch)
    out = {"copy_bw": bw}
    ints = lambda s: [int(x) for x in s.split(",") if x]   # noqa: E731
    if "gemm" in args.parts:
        out["gemm"] = gemm_rows(torch, ints(args.ms), ints(args.splits), bw)
        Path(args.out).write_text(json.dumps(out, indent=1))
    if "splitk" in args.parts:
        out["splitk"] = splitk_rows(torch, ints(args.ms), ints(args.splits), bw)
        Path(args.out).write_text(json.dumps(out, indent=1))
    if "attention" in args.parts:
        out["attention"] = attention_rows(torch, ints(args.batches), ints(args.contexts), ints(args.attn_splits))
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
