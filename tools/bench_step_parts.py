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

Decode attention (one layer, bs B, context C): graphrt's multi-query kernel at Q = 1 (--attn-q:
also Q = 5, a k = 4 verify; its split-KV + combine: two launches) for several split counts (the
default_splits of the context marked *; the runner uses that of its max_context_len); compare with the FlashInfer decode
per layer from tools/profile_step.py (attention + merge families / layers).

Decode backends side by side (--parts decode): per layer, the attention backends' attend() as
the model step calls it (the bucket's prepare launch once, outside the graph; then one attend
per layer, in one CUDA graph, rotating over enough layers' KV caches to read past the L2):
graphrt's one-launch kernel (backend triton-decode) at several MAX_SPLITS and at its per-bucket
default (marked *), FlashInfer's decode (backend flashinfer, tensor-core and/or cuda-core:
attention + merge) and xqa (bf16 KV). prepare_us: the bucket's prepare launch alone (once per
step, shared by all layers).

    python tools/bench_step_parts.py --out bench_step_parts.json
    python tools/bench_step_parts.py --parts decode --batches 1,4,16 --contexts 1024,8192
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


def attention_rows(torch, batches, contexts, split_list, qs=(1,)) -> list[dict]:
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
                    auto = default_splits(torch.device("cuda"), b, hkv, c)
                    for nq in qs:
                        q = torch.randn(b, nq, hq, d, device="cuda", dtype=torch.bfloat16)
                        out = torch.empty_like(q)
                        for s in sorted(set(split_list + [auto])):
                            us = graph_us(lambda s=s: multiquery_attention(q, cache, table, lens, splits=s, out=out),
                                          20, 5)
                            kv_bytes = 2 * b * c * hkv * d * (2 if kv == "bf16" else 1)
                            rows.append({"attn": shape, "kv": kv, "batch": b, "context": c, "q": nq, "splits": s,
                                         "auto": s == auto, "us": us, "kv_bytes": kv_bytes})
                            print(f"attn {shape} kv={kv} bs{b} ctx{c} q={nq} splits={s}{'*' if s == auto else ' '}: "
                                  f"{us:7.2f} us", flush=True)
    return rows


def _layers_past_l2(kv_bytes: int) -> int:
    return max(2, min(64, -(-2 * L2_BYTES // kv_bytes)))


def decode_rows(torch, batches, contexts, split_list, kernels, *, device="cuda", variants=()) -> list[dict]:
    """Per-layer device µs of the decode backends (see the module docstring)."""
    from graphrt import PagedKVCache, RuntimeConfig
    from graphrt.attention.backends import make_backend
    from graphrt.attention.backends.triton_decode import TritonDecodeBackend
    from graphrt.attention.buffers import StaticBuffers
    from graphrt.kernels.timing import graph_us
    dev, rows, page = torch.device(device), [], 16
    for shape, (hq, hkv, d) in ATTN.items():
        for kv in ("bf16", "fp8"):
            for b in batches:
                for c in contexts:
                    pages = -(-c // page)
                    cfg = RuntimeConfig(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=page,
                                        max_context_len=c, buckets=[b], dtype="bfloat16", backend="flashinfer",
                                        kv_cache_dtype="fp8" if kv == "fp8" else "auto",
                                        kv_pool_pages=b * pages + 1)
                    kv_bytes = 2 * b * c * hkv * d * (2 if kv == "bf16" else 1)
                    caches = [PagedKVCache.allocate(cfg, b * pages + 1, dev, seed=i)
                              for i in range(_layers_past_l2(kv_bytes))]
                    view = StaticBuffers(cfg, dev).view(b)
                    q = torch.randn(b, hq, d, device=dev, dtype=torch.bfloat16)
                    out = torch.empty_like(q)

                    def time_backend(backend, label, splits=None, default=False):
                        backend.setup([view])
                        view.block_table.copy_(torch.arange(b * pages, dtype=torch.int32, device=dev).view(b, pages))
                        view.seq_lens.fill_(c)
                        if backend.needs_host_inputs:                           # a host-plan fallback
                            backend.host_prepare(view, view.seq_lens.cpu())
                        backend.prepare(view)                                   # the step's plan, once
                        prep = graph_us(lambda: backend.prepare(view), 20, 5)

                        def layers():
                            for cache in caches:
                                backend.attend(view, q, cache, out)
                        us = graph_us(layers, 5, 5) / len(caches)
                        rows.append({"decode": shape, "kv": kv, "batch": b, "context": c, "kernel": label,
                                     "splits": splits, "default": default, "us": us, "prepare_us": prep,
                                     "kv_bytes": kv_bytes, "gb_s": kv_bytes / us / 1e3,
                                     "layers_rotated": len(caches)})
                        mark = "*" if default else " "
                        print(f"decode {shape} kv={kv} bs{b} ctx{c} {label:<22} splits={splits or '-'}{mark}: "
                              f"{us:7.2f} us/layer  ({kv_bytes / us / 1e3:6.0f} GB/s)  prepare {prep:5.2f} us",
                              flush=True)
                    if "triton-decode" in kernels:
                        auto = TritonDecodeBackend(cfg, caches[0], dev)
                        auto.setup([view])
                        default = auto.max_splits[b]
                        for s in sorted(set(split_list + [default])):
                            time_backend(TritonDecodeBackend(cfg, caches[0], dev, max_splits={b: s}),
                                         "triton-decode", s, s == default)
                        for opt in variants:                             # kernel tuning variants
                            label = "triton-decode-" + "-".join(f"{k[0]}{v}" for k, v in opt.items())
                            for s in sorted({default, max(1, default // 2), min(64, default * 2)}):
                                try:
                                    time_backend(TritonDecodeBackend(cfg, caches[0], dev, max_splits={b: s},
                                                                     kernel_options=opt), label, s, False)
                                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: say so
                                    print(f"decode {shape} kv={kv} bs{b} ctx{c} {label} splits={s}: skipped "
                                          f"({type(e).__name__}: {str(e)[:120]})")
                    for name in ("flashinfer", "flashinfer-cuda-core", "xqa"):
                        if name not in kernels or (name == "xqa" and kv == "fp8"):
                            continue
                        kcfg = cfg.replace(decode_kernel="cuda-core") if name.endswith("cuda-core") else cfg
                        try:
                            backend = make_backend(kcfg, caches[0], dev, name=name.replace("-cuda-core", ""),
                                                   parity_sets=1)
                            time_backend(backend, name)
                        except Exception as e:  # noqa: BLE001 - a library this GPU cannot run: say so
                            print(f"decode {shape} kv={kv} bs{b} ctx{c} {name}: skipped ({type(e).__name__}: {e})")
                    del caches
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
    _decode_summary(rows)
    return rows


def _decode_summary(rows) -> None:
    """One line per (shape, kv, batch, context): triton-decode's default and best vs the others."""
    print(f"\n{'shape':<5} {'kv':<4} {'bs':>4} {'ctx':>6} {'default':>14} {'best':>14} "
          f"{'flashinfer':>10} {'fi cuda-core':>12} {'xqa':>7}   (us per layer)")
    keys = sorted({(r["decode"], r["kv"], r["batch"], r["context"]) for r in rows})
    for key in keys:
        mine = [r for r in rows if (r["decode"], r["kv"], r["batch"], r["context"]) == key]
        ours = [r for r in mine if r["kernel"] == "triton-decode"]
        other = {r["kernel"]: r["us"] for r in mine if r["kernel"] != "triton-decode"}
        dflt = next((f"{r['us']:.2f} (S={r['splits']})" for r in ours if r["default"]), "-")
        best = min(ours, key=lambda r: r["us"], default=None)
        best_s = f"{best['us']:.2f} (S={best['splits']})" if best else "-"
        cell = lambda name: f"{other[name]:.2f}" if name in other else "-"   # noqa: E731
        print(f"{key[0]:<5} {key[1]:<4} {key[2]:>4} {key[3]:>6} {dflt:>14} {best_s:>14} "
              f"{cell('flashinfer'):>10} {cell('flashinfer-cuda-core'):>12} {cell('xqa'):>7}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1,16")
    p.add_argument("--splits", default="1,2,4,8")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--attn-splits", default="1,4,8,16,32")
    p.add_argument("--attn-q", default="1", help="query tokens per row of the multi-query kernel (5: a k = 4 verify)")
    p.add_argument("--decode-splits", default="1,2,4,8,16,32,64", help="triton-decode MAX_SPLITS values")
    p.add_argument("--decode-kernels", default="triton-decode,flashinfer,flashinfer-cuda-core,xqa")
    p.add_argument("--decode-variants", default="",
                   help="triton-decode tuning variants, e.g. 'stages=2;stages=3,block_n=128;fp8_dot=q' (each at the "
                        "default MAX_SPLITS, half and double)")
    p.add_argument("--parts", default="gemm,attention,decode", help="of gemm, splitk, attention, decode")
    p.add_argument("--out", default="bench_step_parts.json")
    args = p.parse_args(argv)
    try:
        attn_q = [int(x) for x in args.attn_q.split(",") if x]
    except ValueError:
        attn_q = []
    if not attn_q or min(attn_q) < 1:
        print(f"bench_step_parts: --attn-q: comma-separated ints >= 1, got {args.attn_q!r}", file=sys.stderr)
        return 2
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
        out["attention"] = attention_rows(torch, ints(args.batches), ints(args.contexts), ints(args.attn_splits),
                                          attn_q)
        Path(args.out).write_text(json.dumps(out, indent=1))
    if "decode" in args.parts:
        out["decode"] = decode_rows(torch, ints(args.batches), ints(args.contexts), ints(args.decode_splits),
                                    args.decode_kernels.split(","), variants=[
                                        {k: int(v) if v.isdigit() else v for k, v in (kv.split("=") for kv in var.split(","))}
                                        for var in args.decode_variants.split(";") if var])
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
