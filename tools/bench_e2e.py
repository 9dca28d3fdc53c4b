"""End-to-end decode benchmark: whole Llama-shaped models, one process, side by side.

Random-weight models with the Llama-3.2-1B and Llama-3.1-8B shapes (bf16), batch x context grid.
Per configuration and variant:
  step_us      wall time per decode step in a loop that waits for every step (low concurrency)
  tok_s        tokens / s = batch / step time
  device_us    device time per step (CUDA events over back-to-back steps)
  idle         GPU idle fraction between steps: 1 - device_us / step_us
  launches     host graph launches (or eager steps) per token
Variants: eager (no graphs, device planner), hostplan (FlashInfer host plan() + graph replay, the
engines' pattern), graphrt (device-planned graph, 1 step), graphrt-k4 / -k8 (4 / 8 steps a graph).
The floor is (weight bytes + KV bytes) / measured D2D copy bandwidth.

    python tools/bench_e2e.py --out bench_e2e.json --png bench_e2e.png
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchlib import copy_bandwidth, pyplot

SHAPES = {  # hidden, intermediate, layers, q heads, kv heads, head_dim, vocab, tied
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, True),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256, False),
}
VARIANTS = {"eager": ("flashinfer", 1, False), "hostplan": ("flashinfer-hostplan", 1, True),
            "graphrt": ("flashinfer", 1, True), "graphrt-k4": ("flashinfer", 4, True),
            "graphrt-k8": ("flashinfer", 8, True)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per measurement")
    p.add_argument("--out", default="bench_e2e.json")
    p.add_argument("--png", default=None)
    return p.parse_args(argv)


def random_model(name: str, torch):
    from graphrt.models import LlamaDecoder, LlamaSpec
    h, inter, layers, hq, hkv, d, vocab, tied = SHAPES[name]
    spec = LlamaSpec(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_layers=layers,
                     num_heads=hq, num_kv_heads=hkv, head_dim=d, rms_norm_eps=1e-5,
                     rope_theta=500000.0, tie_word_embeddings=tied, attention_bias=False)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02)
    sd = {"embed_tokens.weight": rnd(vocab, h), "norm.weight": torch.ones(h, device="cuda")}
    if not tied:
        sd["lm_head.weight"] = rnd(vocab, h)
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": rnd(hq * d, h), p + "self_attn.k_proj.weight": rnd(hkv * d, h),
                   p + "self_attn.v_proj.weight": rnd(hkv * d, h), p + "self_attn.o_proj.weight": rnd(h, hq * d),
                   p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
                   p + "mlp.down_proj.weight": rnd(h, inter),
                   p + "input_layernorm.weight": torch.ones(h, device="cuda"),
                   p + "post_attention_layernorm.weight": torch.ones(h, device="cuda")})
    model = LlamaDecoder.from_state_dict(spec, sd, dtype=torch.bfloat16, device="cuda")
    weight_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    return model, weight_bytes


def measure(mrt, n, ctx, steps, torch):
    """(step_us in a host-synchronous loop, device_us per step back to back, launches per token)."""
    k = mrt.k
    pages = -(-(ctx + steps * k + k) // mrt.config.page_size)
    table = torch.arange(n * pages, dtype=torch.int32).view(n, pages)
    lens = torch.full((n,), ctx, dtype=torch.int32)
    tokens = torch.zeros(n, dtype=torch.int64, device="cuda")
    host_inputs = mrt.backend.needs_host_inputs
    tb, lb = (table, lens) if host_inputs else (table.cuda(), lens.cuda())
    for _ in range(2):
        mrt.decode(tokens, tb, lb)
    torch.cuda.synchronize()
    walls = []
    for i in range(steps):
        t0 = time.perf_counter()
        mrt.decode(tokens, tb, lb + i * k if host_inputs else lb)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6 / k)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(steps):
        mrt.decode(tokens, tb, lb)
    b.record()
    b.synchronize()
    return statistics.median(walls), a.elapsed_time(b) * 1e3 / (steps * k), 1.0 / k


def run(args) -> dict:
    import torch

    from graphrt import RuntimeConfig
    from graphrt.model_runtime import ModelRuntime
    bw = copy_bandwidth(torch)
    rows = []
    for name in args.models.split(","):
        model, weight_bytes = random_model(name, torch)
        s = model.spec
        for ctx in [int(x) for x in args.contexts.split(",")]:
            for n in [int(x) for x in args.batches.split(",")]:
                pages = -(-(ctx + args.steps * 8 + 16) // 16)
                for variant in args.variants.split(","):
                    backend, k, graphs = VARIANTS[variant]
                    cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                                        head_dim=s.head_dim, page_size=16, max_pages_per_seq=pages,
                                        buckets=[n], dtype="bfloat16", backend=backend,
                                        kv_pool_pages=n * pages + 1)
                    mrt = ModelRuntime(model, cfg, "cuda", steps_per_graph=k)
                    if graphs:
                        mrt.capture()
                    step_us, dev_us, launches = measure(mrt, n, ctx, args.steps, torch)
                    kv_bytes = s.num_layers * n * ctx * s.num_kv_heads * s.head_dim * 2 * 2
                    rows.append(dict(model=name, variant=variant, batch=n, context=ctx, step_us=step_us,
                                     tok_s=n / step_us * 1e6, device_us=dev_us,
                                     idle=max(0.0, 1 - dev_us / step_us), launches_per_token=launches,
                                     floor_us=(weight_bytes + kv_bytes) / bw * 1e6))
                    print(rows[-1], file=sys.stderr)
                    del mrt
                    torch.cuda.empty_cache()
        del model
    return {"device": torch.cuda.get_device_name(), "copy_bw_bytes_per_s": bw, "rows": rows}


def print_table(result: dict) -> None:
    print(f"{'model':<13} {'variant':<11} {'bs':>3} {'ctx':>5} {'step us':>8} {'tok/s':>8} "
          f"{'device us':>9} {'idle':>5} {'floor us':>8} {'launch/tok':>10}")
    for r in result["rows"]:
        print(f"{r['model']:<13} {r['variant']:<11} {r['batch']:>3} {r['context']:>5} {r['step_us']:>8.1f} "
              f"{r['tok_s']:>8.0f} {r['device_us']:>9.1f} {r['idle']:>5.2f} {r['floor_us']:>8.1f} "
              f"{r['launches_per_token']:>10.3f}")


def plot(result: dict, png: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = result["rows"]
    keys = sorted({(r["model"], r["context"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (model, ctx) in zip(axes[0], keys):
        for variant in VARIANTS:
            pts = sorted((r["batch"], r["step_us"]) for r in rows
                         if r["model"] == model and r["context"] == ctx and r["variant"] == variant)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=variant)
        floor = sorted((r["batch"], r["floor_us"]) for r in rows if r["model"] == model
                       and r["context"] == ctx and r["variant"] == "graphrt")
        if floor:
            ax.plot(*zip(*floor), "k--", label="floor")
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="us / token step", title=f"{model} ctx {ctx}")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result)
    if args.png:
        plot(result, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
