"""Experiment: a decode GEMV that loads its first weight tiles before waiting on the previous
kernel (programmatic dependent launch), against cuBLAS, in a chain shaped like the step.

Weights do not depend on the previous kernel, so a GEMV launched with PDL can issue its first
weight loads while the kernel before it (an RMSNorm, rope, attention) still runs, and wait
(griddepcontrol.wait) only before it reads x. The chain: L layers of
    y = x @ W_l.T  (cuBLAS, or the GEMV: PRE weight tiles loaded before the wait)
    x = add_rms_norm(y, residual, w)  (graphrt's kernel, PDL)
in one CUDA graph; device us per layer (median of repeats), and the GEMV alone. Table + JSON.

    python tools/bench_gemv_pdl.py --out bench_gemv_pdl.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

SHAPES = {"8b.o": (4096, 4096), "8b.down": (4096, 14336), "8b.qkv": (6144, 4096),
          "1b.o": (2048, 2048), "1b.down": (2048, 8192)}
CONFIGS = [  # block_n, block_k, pre, warps, stages
    (16, 512, 0, 4, 3), (16, 512, 2, 4, 3), (16, 256, 4, 4, 3), (32, 256, 2, 4, 3),
    (32, 512, 2, 8, 3), (16, 512, 2, 4, 4), (8, 512, 2, 4, 3), (16, 1024, 1, 8, 3),
]


@triton.jit
def _gemv_pdl_kernel(x_ptr, w_ptr, y_ptr, M, N, K, sx, sw, sy, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE: tl.constexpr,
                     PDL: tl.constexpr, DOT: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K].T, K a multiple of BLOCK_K and >= PRE * BLOCK_K; grid
    (cdiv(N, BLOCK_N),). The first PRE weight tiles are loaded before the PDL wait."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    m_ok = rm < M
    wp = w_ptr + rn.to(tl.int64)[:, None] * sw + rk[None, :]
    if PRE >= 1:
        w0 = tl.load(wp, mask=n_ok[:, None], other=0.0)
    if PRE >= 2:
        w1 = tl.load(wp + BLOCK_K, mask=n_ok[:, None], other=0.0)
    if PRE >= 3:
        w2 = tl.load(wp + 2 * BLOCK_K, mask=n_ok[:, None], other=0.0)
    if PRE >= 4:
        w3 = tl.load(wp + 3 * BLOCK_K, mask=n_ok[:, None], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    xp = x_ptr + rm[:, None] * sx + rk[None, :]
    if DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PRE >= 1:
        xt = tl.load(xp, mask=m_ok[:, None], other=0.0)
        acc = _acc(acc, xt, w0, DOT)
    if PRE >= 2:
        xt = tl.load(xp + BLOCK_K, mask=m_ok[:, None], other=0.0)
        acc = _acc(acc, xt, w1, DOT)
    if PRE >= 3:
        xt = tl.load(xp + 2 * BLOCK_K, mask=m_ok[:, None], other=0.0)
        acc = _acc(acc, xt, w2, DOT)
    if PRE >= 4:
        xt = tl.load(xp + 3 * BLOCK_K, mask=m_ok[:, None], other=0.0)
        acc = _acc(acc, xt, w3, DOT)
    for k0 in range(PRE * BLOCK_K, K, BLOCK_K):
        wt = tl.load(wp + k0, mask=n_ok[:, None], other=0.0)
        xt = tl.load(xp + k0, mask=m_ok[:, None], other=0.0)
        acc = _acc(acc, xt, wt, DOT)
    if DOT:
        tl.store(y_ptr + rm[:, None] * sy + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
    else:
        tl.store(y_ptr + rn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _acc(acc, xt, wt, DOT: tl.constexpr):
    if DOT:
        return acc + tl.dot(xt, tl.trans(wt), out_dtype=tl.float32)
    return acc + tl.sum(wt.to(tl.float32) * tl.sum(xt.to(tl.float32), axis=0)[None, :], axis=1)


def gemv_pdl(x, w, out, cfg, pdl: bool):
    """x [M, K], w [N, K] -> out [M, N] (M <= 16; M == 1 uses the dot-free body)."""
    bn, bk, pre, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    dot = m > 1
    extra = {"launch_pdl": True} if pdl else {}
    _gemv_pdl_kernel[(triton.cdiv(n, bn),)](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
                                            BLOCK_M=16 if dot else 1, BLOCK_N=bn, BLOCK_K=bk, PRE=pre,
                                            PDL=pdl, DOT=dot, num_warps=warps, num_stages=stages, **extra)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--ms", default="1")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--out", default="bench_gemv_pdl.json")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from graphrt.kernels.norm import add_rms_norm
    from graphrt.kernels.timing import graph_us
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(args.layers)]
        norm_w = torch.ones(n if n == k else k, device=dev, dtype=dt)
        for m in [int(v) for v in args.ms.split(",")]:
            x = torch.randn(m, k, device=dev, dtype=dt)
            ref = x.float() @ ws[0].float().t()
            y = torch.empty(m, n, device=dev, dtype=dt)
            res = torch.zeros(m, n, device=dev, dtype=dt)
            nw = torch.ones(n, device=dev, dtype=dt)
            for cfg in [None] + CONFIGS:
                if cfg is not None and (k % cfg[1] or k < cfg[2] * cfg[1] or (m > 1 and cfg[0] < 16)):
                    continue
                if cfg is not None:
                    got = gemv_pdl(x, ws[0], y, cfg, False).float()
                    err = float((got - ref).abs().max() / ref.abs().max())
                else:
                    err = 0.0
                label = "cublas" if cfg is None else "gemv-n%d-k%d-pre%d-w%d-s%d" % cfg
                if dev != "cuda":
                    print(f"{name} M={m} {label}: rel err {err:.2e}")
                    rows.append({"shape": name, "m": m, "kernel": label, "rel_err": err})
                    continue

                def alone(cfg=cfg):
                    for w in ws:
                        (torch.nn.functional.linear(x, w, out=y) if cfg is None else gemv_pdl(x, w, y, cfg, True))

                def chain(cfg=cfg):    # square shapes only: the norm's output feeds the next GEMV
                    h = x
                    for w in ws:
                        o = torch.nn.functional.linear(h, w) if cfg is None else gemv_pdl(h, w, y, cfg, True)
                        h = add_rms_norm(o, res, nw, 1e-5)
                a_us = graph_us(alone, 5, 5) / len(ws)
                c_us = graph_us(chain, 5, 5) / len(ws) if n == k else None
                floor = n * k * 2 / 4.2e12 * 1e6
                rows.append({"shape": name, "m": m, "kernel": label, "alone_us": a_us, "chain_us": c_us,
                             "floor_us": floor, "rel_err": err})
                print(f"{name:<8} M={m} {label:<28} alone {a_us:7.2f} us (x{a_us / floor:4.2f})  chain/layer "
                      f"{'-' if c_us is None else f'{c_us:7.2f}'} us  err {err:.1e}", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
