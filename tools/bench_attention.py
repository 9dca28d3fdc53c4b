"""Side-by-side decode-attention benchmark: graphrt device-planned vs host-planned FlashInfer vs XQA.

One process, one KV pool, the same inputs for every variant. Per (bucket, context, variant):

  host_us    host time per step of the serving loop: for graphrt and xqa one graph replay (inputs
             already in the static buffers); for flashinfer-hostplan the engines' pattern: build the
             paged-KV CSR on the host, plan(), replay. Timed over bursts of steps with no sync.
  decode_us  host time of DecodeRuntime.decode() with device inputs (input copies + replay).
  device_us  CUDA events over back-to-back replays of the bucket's graph.
  sync_us    step time of a loop that waits for every step (host work + replay + synchronize).
  kv_bw      KV bytes read per step / device time, as a fraction of the measured D2D copy bandwidth.
  rel_err    against the float32 torch reference (computed once per shape).

Prints a table (medians), writes JSON and, where matplotlib is installed, a PNG.
    python tools/bench_attention.py --out bench.json
    python tools/bench_attention.py --plot-from bench.json --png bench.png   (CPU is fine)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchlib import copy_bandwidth, device_us, median_burst, median_sync_step, pyplot

VARIANTS = {  # name: (backend, decode_kernel)
    "graphrt-tc": ("flashinfer", "tensor-core"),
    "graphrt-cc": ("flashinfer", "cuda-core"),
    "hostplan-tc": ("flashinfer-hostplan", "tensor-core"),
    "hostplan-cc": ("flashinfer-hostplan", "cuda-core"),
    "xqa": ("xqa", "tensor-core"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/llama-3.1-8b.yaml")
    p.add_argument("--buckets", default="1,2,4,8,16,32,64,128")
    p.add_argument("--contexts", default="512,1024,4096,32768")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=100, help="steps per host-timing burst")
    p.add_argument("--repeats", type=int, default=5, help="bursts per measurement (median taken)")
    p.add_argument("--out", default="bench_attention.json")
    p.add_argument("--png", default=None)
    p.add_argument("--plot-from", default=None, help="only plot an existing JSON (no GPU needed)")
    return p.parse_args(argv)


def replay_floor(torch, args):
    """Host and device µs of replaying a graph that holds one 1-element kernel."""
    x = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    host = median_burst(g.replay, args.steps, args.repeats, torch.cuda.synchronize)
    return host, device_us(g.replay, torch)


def run(args) -> dict:
    import torch

    from graphrt import DecodeRuntime, PagedKVCache, load_config
    from graphrt.attention.reference import reference_decode
    from graphrt.attention.verify import rel_error

    buckets = [int(x) for x in args.buckets.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    variants = args.variants.split(",")
    base = load_config(args.config).replace(buckets=buckets, max_context_len=max(contexts))
    pages_per_seq = base.max_pages_per_seq
    pool = max(buckets) * pages_per_seq + 16
    kv = PagedKVCache.allocate(base, pool, "cuda")
    bw = copy_bandwidth(torch)
    print(f"device {torch.cuda.get_device_name()} | D2D copy {bw / 1e12:.2f} TB/s | pool {pool} pages",
          file=sys.stderr)
    floor_host, floor_dev = replay_floor(torch, args)
    print(f"graph-replay floor (one 1-element kernel): host {floor_host:.1f} us, device {floor_dev:.1f} us",
          file=sys.stderr)
    runtimes = {}
    for name in variants:
        backend, kernel = VARIANTS[name]
        rt = DecodeRuntime(base.replace(decode_kernel=kernel), kv, "cuda", backend=backend)
        rt.capture()
        runtimes[name] = rt
    gen = torch.Generator().manual_seed(0)
    rows = []
    sync = torch.cuda.synchronize
    for bs in buckets:
        for ctx in contexts:
            q = torch.randn((bs, base.num_qo_heads, base.head_dim), generator=gen).to("cuda", base.torch_dtype)
            perm = torch.randperm(pool, generator=gen)[: bs * pages_per_seq].to(torch.int32)
            table_cpu = perm.view(bs, pages_per_seq)
            lens_cpu = torch.full((bs,), ctx, dtype=torch.int32)
            table, lens = table_cpu.cuda(), lens_cpu.cuda()
            k, v = kv.as_tuple()
            ref = reference_decode(q, k, v, table, lens, layout=base.kv_layout)
            kv_bytes = bs * ctx * base.num_kv_heads * base.head_dim * 2 * kv.k.element_size()
            for name, rt in runtimes.items():
                view = rt.static_inputs(bs)
                out = rt.decode(q, table_cpu if rt.backend.needs_host_inputs else table,
                                lens_cpu if rt.backend.needs_host_inputs else lens).clone()
                err = rel_error(out, ref)
                if rt.backend.needs_host_inputs:
                    def step(rt=rt, view=view):  # host plan() from CPU lengths, then replay
                        rt.replay(view, seq_lens_cpu=lens_cpu)
                    decode_us = None
                else:
                    def step(rt=rt, view=view):
                        rt.replay(view)
                    decode_us = median_burst(lambda rt=rt: rt.decode(q, table, lens), args.steps,
                                              args.repeats, sync)
                host_us = median_burst(step, args.steps, args.repeats, sync)
                sync_us = median_sync_step(step, args.steps, sync)
                dev_us = device_us(lambda rt=rt, view=view: rt.replay(view), torch)
                rows.append(dict(variant=name, bucket=bs, context=ctx, host_us=host_us,
                                 decode_us=decode_us, device_us=dev_us, sync_us=sync_us,
                                 kv_bw_frac=kv_bytes / (dev_us * 1e-6) / bw, rel_err=err,
                                 planner=getattr(rt.backend, "planner", "none")))
    return {"device": torch.cuda.get_device_name(), "copy_bw_bytes_per_s": bw,
            "replay_floor_host_us": floor_host, "replay_floor_device_us": floor_dev,
            "config": base.to_dict(), "rows": rows}


def print_table(result: dict) -> None:
    rows = result["rows"]
    if "replay_floor_host_us" in result:
        print(f"graph-replay floor: host {result['replay_floor_host_us']:.1f} us, device "
              f"{result['replay_floor_device_us']:.1f} us; D2D copy {result['copy_bw_bytes_per_s'] / 1e12:.2f} TB/s")
    print(f"{'variant':<12} {'bs':>4} {'ctx':>6} {'host us':>8} {'decode us':>9} {'device us':>9} "
          f"{'sync us':>8} {'kv bw':>6} {'rel err':>8}")
    for r in rows:
        dec = f"{r['decode_us']:.1f}" if r["decode_us"] is not None else "-"
        print(f"{r['variant']:<12} {r['bucket']:>4} {r['context']:>6} {r['host_us']:>8.1f} {dec:>9} "
              f"{r['device_us']:>9.1f} {r['sync_us']:>8.1f} {r['kv_bw_frac']:>6.2f} {r['rel_err']:>8.1e}")
    by = {(r["variant"], r["bucket"], r["context"]): r for r in rows}
    print("\nratios (graphrt-tc vs hostplan-tc): host, device-time overhead, sync-loop step")
    for (v, b, c), r in sorted(by.items()):
        h = by.get(("hostplan-tc", b, c))
        if v == "graphrt-tc" and h:
            print(f"  bs {b:>4} ctx {c:>6}: host {r['host_us']:.1f}/{h['host_us']:.1f} us, device "
                  f"+{r['device_us'] - h['device_us']:.1f} us ({(r['device_us'] / h['device_us'] - 1) * 100:+.1f}%), "
                  f"sync step x{r['sync_us'] / h['sync_us']:.2f}")


def plot(result: dict, png: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = result["rows"]
    contexts = sorted({r["context"] for r in rows})
    fig, axes = plt.subplots(2, len(contexts), figsize=(5 * len(contexts), 8), squeeze=False)
    for j, ctx in enumerate(contexts):
        for variant in sorted({r["variant"] for r in rows}):
            pts = sorted((r["bucket"], r["host_us"], r["device_us"]) for r in rows
                         if r["variant"] == variant and r["context"] == ctx)
            xs = [p[0] for p in pts]
            axes[0][j].plot(xs, [p[1] for p in pts], marker="o", label=variant)
            axes[1][j].plot(xs, [p[2] for p in pts], marker="o", label=variant)
        for i, what in enumerate(("host us / step", "device us / step")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch (bucket)")
            ax.set_ylabel(what)
            ax.set_title(f"context {ctx}")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(f"decode attention, {result['device']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}", file=sys.stderr)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_from:
        result = json.loads(Path(args.plot_from).read_text())
    else:
        result = run(args)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result)
    if args.png:
        plot(result, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
