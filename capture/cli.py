"""graphrt-capture --config configs/X.yaml: capture every bucket, verify it, print a table.

On a machine without CUDA it runs the same pipeline eagerly with the reference backend (Triton
kernels through the interpreter) and says so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graphrt-capture", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML runtime config (see configs/)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    p.add_argument("--backend", default=None, help="override the config's backend")
    p.add_argument("--steps", type=int, default=1, help="verification batches per bucket")
    p.add_argument("--json", default=None, help="write the per-bucket report here")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before graphrt imports triton kernels
    from graphrt import DecodeRuntime, PagedKVCache, load_config
    from graphrt.verify import TOLERANCE, verify_bucket

    config = load_config(args.config)
    backend = args.backend or config.backend
    if device == "cpu" and backend not in ("reference", "torch-splitkv"):
        print(f"graphrt-capture: no CUDA device: running eagerly with the torch-splitkv backend "
              f"(the device planner's schedule executed in torch; config backend {backend!r} "
              f"needs a GPU)")
        backend = "torch-splitkv"
    if backend == "auto":
        backend = "flashinfer"
    kv = PagedKVCache.allocate(config, config.pool_pages, device)
    t0 = time.perf_counter()
    rt = DecodeRuntime(config, kv, device, backend=backend)
    rt.capture(progress=not args.no_progress)
    setup_s = time.perf_counter() - t0
    mode = "CUDA graphs" if rt.uses_graphs else "eager"
    tol = TOLERANCE[config.dtype]
    rows, failed = rt.report(), []
    for row in rows:
        row["rel_err"] = verify_bucket(rt, row["bucket"], seed=config.seed + row["bucket"], steps=args.steps)
        if not row["rel_err"] <= tol:
            failed.append(row["bucket"])
    print(f"\nconfig {config.name} ({args.config}) | backend {rt.backend.name} | {mode} on {rt.device} "
          f"| setup+capture {setup_s:.2f} s | tolerance {tol:g}")
    print(f"{'bucket':>6} {'capture ms':>10} {'graph MB':>9} {'buffers KB':>10} {'rel err':>9}  planner")
    for r in rows:
        cap = f"{r['capture_ms']:.1f}" if r["capture_ms"] is not None else "-"
        mb = f"{r['graph_bytes'] / 2**20:.2f}" if r["graph_bytes"] is not None else "-"
        print(f"{r['bucket']:>6} {cap:>10} {mb:>9} {r['buffer_bytes'] / 1024:>10.1f} "
              f"{r['rel_err']:>9.2e}  {r.get('planner', '-')}")
    total_graph = sum(r["graph_bytes"] or 0 for r in rows)
    print(f"graph memory, all buckets: {total_graph / 2**20:.2f} MB; static buffers: "
          f"{rt.buffers.nbytes() / 2**20:.2f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": config.to_dict(), "mode": mode, "rows": rows}, f, indent=1)
    if failed:
        print(f"FAILED verification: buckets {failed} above tolerance {tol:g}", file=sys.stderr)
        return 1
    print("all buckets verified against the float32 reference")
    return 0
