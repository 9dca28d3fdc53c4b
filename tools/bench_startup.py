"""Start-up benchmark: cold start (compile + capture) vs warm start from a graph cache.

Each start runs in a fresh subprocess and reports seconds from process start to the first
verified replay:
  cold   empty FlashInfer JIT and Triton caches: compile every kernel, capture every bucket
  warm   DecodeRuntime.from_cache(DIR): cached kernels loaded (checked unchanged), buckets captured
  lazy   from_cache(DIR, lazy=True): buckets captured on first use (first replay = bucket 1)
  warm-preimported  a server that already imported FlashInfer, started with
         FLASHINFER_WORKSPACE_BASE=DIR/flashinfer: from_cache alone (ready_s counts from its call)

    python tools/bench_startup.py --config configs/llama-3.1-8b.yaml --cache /tmp/gc --out startup.json

The cache is built first with graphrt-capture if DIR holds none. Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()


def child(mode: str, config_path: str, cache: str) -> dict:
    """One start in this (fresh) process; times are seconds since process start, except that
    warm-preimported counts ready/first replay from the from_cache call (the engine has already
    paid for importing torch and FlashInfer)."""
    if mode == "cold":
        os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="fi-cold-")
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    if mode == "warm-preimported":
        os.environ["FLASHINFER_WORKSPACE_BASE"] = str((Path(cache) / "flashinfer").resolve())
        import flashinfer  # noqa: F401  (the engine imported it at its own start)
    import torch

    from graphrt import DecodeRuntime, PagedKVCache, load_config
    from graphrt.attention.reference import reference_decode
    from graphrt.attention.verify import random_batch, rel_error
    t_import = time.perf_counter() - T0
    config = load_config(config_path)
    kv = PagedKVCache.allocate(config, 1024, "cuda")
    torch.cuda.synchronize()
    t_kv = time.perf_counter() - T0
    origin = t_kv if mode == "warm-preimported" else 0.0
    if mode == "cold":
        rt = DecodeRuntime(config, kv, "cuda")
        rt.capture()
    else:
        rt = DecodeRuntime.from_cache(cache, kv_cache=kv, device="cuda", lazy=mode == "lazy")
    t_ready = time.perf_counter() - T0
    q, table, lens = random_batch(rt, 1, [1000], torch.Generator().manual_seed(0))
    out = rt.decode(q, table, lens)
    torch.cuda.synchronize()
    t_first = time.perf_counter() - T0
    k, v = kv.as_tuple()
    err = rel_error(out, reference_decode(q, k, v, table, lens))
    captured = len(rt.graphs.stats) if rt.graphs else 0
    kv_s = 0.0 if mode == "warm-preimported" else t_kv - t_import
    return {"mode": mode, "import_s": t_import, "kv_alloc_s": t_kv - t_import,
            "ready_s": t_ready - origin, "first_replay_s": t_first - origin,
            "to_first_replay_excl_kv_alloc_s": t_first - origin - kv_s,
            "buckets_captured": captured, "rel_err": err, "breakdown_s": rt.startup_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/llama-3.1-8b.yaml")
    p.add_argument("--cache", default="graph-cache/llama-3.1-8b")
    p.add_argument("--modes", default="cold,warm,lazy,warm-preimported")
    p.add_argument("--out", default="bench_startup.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.config, args.cache)))
        return 0
    cache = Path(args.cache)
    if not (cache / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "capture", "--config", args.config, "--out", str(cache),
                        "--no-progress"], check=True)
    results = []
    for mode in args.modes.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--config", args.config,
                               "--cache", str(cache)], capture_output=True, text=True)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{mode} start failed (rc {proc.returncode})")
        results.append(json.loads(line[0][7:]))
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"{'mode':<6} {'import s':>8} {'ready s':>8} {'1st replay s':>12} {'excl. KV alloc':>14} "
          f"{'captured':>8} {'rel err':>8}")
    for r in results:
        print(f"{r['mode']:<6} {r['import_s']:>8.2f} {r['ready_s']:>8.2f} {r['first_replay_s']:>12.2f} "
              f"{r['to_first_replay_excl_kv_alloc_s']:>14.2f} {r['buckets_captured']:>8} {r['rel_err']:>8.1e}"
              f"  {({k: round(v, 2) for k, v in r['breakdown_s'].items()})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
