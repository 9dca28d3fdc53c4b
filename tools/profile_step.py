"""Where a whole-model decode step's device time goes: torch.profiler over captured-graph replays.

Random bf16 Llama-shaped model (tools/bench_e2e.py's), batch / context given, one step per graph;
kernel time per step grouped by kernel family, the launch count, and device time per step.
--weights: bf16, or an FP8 format of bench_e2e.with_weights (fp8 = per-channel W8A8, fp8-tensor,
fp8-head = per-channel with an FP8 LM head, fp8-tensor(-head) = one scale per fused weight,
fp8-block). Programmatic dependent launch of the
element-wise kernels follows GRAPHRT_PDL (RuntimeOptions.pdl, graphrt/model/options.py); split-K
of the o and down GEMMs follows GRAPHRT_SPLITK (RuntimeOptions.splitk: unset or auto = measured at
capture, 1 = off, 2 / 4 = forced); the S used is printed and kept in the JSON.
--decode-backend persistent: the greedy step as one persistent launch (graphrt/model/persistent.py;
its kernel is the "persistent" family), whether the bucket ran it printed and kept in the JSON.

--mixed C (with --chunk-at S): the same decode rows in a step that also prefills C tokens of one
more slot at positions [S, S + C) (model/mixed.py: what the engine's mixed_prefill_tokens blocks
run), profiled after the plain step in the same process: both steps' families side by side, and
what the chunk adds.

    python tools/profile_step.py --model llama-3.1-8b --batch 1 --context 1024 --out profile.json
    python tools/profile_step.py --model llama-3.2-1b --batch 8 --mixed 64 --chunk-at 3968 --out mixed.json
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from bench_e2e import random_model, with_weights

FAMILIES = [("persistent", r"_step_kernel"), ("fp8_quant", r"quantize_rows|quantize_tiles"), ("fp8_scales", r"apply_scales"),
            ("gemm", r"nvjet|gemm|cutlass|sm90_xmma|splitK|Kernel2|gemv"), ("attention", r"BatchPrefill|BatchDecode|Decode|Prefill|decode_attention"),
            ("merge", r"MergeStates|merge"), ("rope_append", r"rope_append"), ("norm", r"rms_norm"),
            ("silu_mul", r"silu_mul"), ("prepare", r"prepare"), ("argmax/sample", r"argmax|sample|sort"),
            ("embedding", r"index|gather|embedding")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--weights", default="bf16", help="bf16, fp8, fp8-tensor, fp8-head, fp8-tensor-head, fp8-block")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--backend", default="flashinfer", help="attention backend (flashinfer, xqa, ...)")
    p.add_argument("--kv", default="auto", help="KV cache dtype: auto (the model's) or fp8")
    p.add_argument("--decode-backend", default="sequence", choices=["sequence", "persistent", "auto"],
                   help="sequence (the kernel sequence), persistent (one persistent launch a greedy step), auto")
    p.add_argument("--mixed", type=int, default=0, help="C: also profile a step carrying C prompt tokens")
    p.add_argument("--chunk-at", type=int, default=0, help="S: the chunk's first position (tokens already cached)")
    p.add_argument("--out", default="profile_step.json")
    args = p.parse_args(argv)
    if args.mixed < 0 or args.chunk_at < 0:
        p.error(f"--mixed / --chunk-at: must be >= 0, got {args.mixed} / {args.chunk_at}")
    if args.chunk_at and not args.mixed:
        p.error("--chunk-at: needs --mixed C > 0 (the chunk it places)")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from graphrt import RuntimeConfig
    from graphrt.model.runtime import ModelRuntime
    model, _ = random_model(args.model, torch)
    model, _ = with_weights(model, args.weights, torch)
    torch.cuda.empty_cache()
    s, n, ctx, c = model.spec, args.batch, args.context, args.mixed
    pages = -(-(max(ctx, args.chunk_at + c) + 64) // 16)
    rows = n + 1 if c else n                     # the chunk's slot: one more (padding) row
    cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                        page_size=16, max_pages_per_seq=pages, buckets=[rows], dtype="bfloat16",
                        backend=args.backend, kv_pool_pages=rows * pages + 1,
                        kv_cache_dtype=args.kv)
    mrt = ModelRuntime(model, cfg, "cuda", decode_backend=args.decode_backend,
                       **({"mixed_prefill_tokens": c} if c else {}))
    mrt.capture()
    table = torch.arange(rows * pages, dtype=torch.int32, device="cuda").view(rows, pages)
    lens = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
    if c:
        lens[n] = 0                               # the chunk's slot decodes nothing
    tokens = torch.zeros(rows, dtype=torch.int64, device="cuda")
    chunk = torch.randint(0, s.vocab_size, (c,)) if c else None
    row = table[n].cpu().numpy() if c else None

    def plain():
        mrt.decode(tokens[:n], table[:n], lens[:n])

    def mixed():                                  # the slots as the engine leaves them, then a chunk
        mrt.slots.load(rows, tokens, table, lens, None)
        mrt.stage_chunk(n, chunk.clone(), args.chunk_at, table_row=row)
        mrt.decode_slots(rows, sampled=False, chunk=True)

    def measure(step):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.replays):
                step()
            torch.cuda.synchronize()
        fam_us, fam_n, names = defaultdict(float), defaultdict(int), defaultdict(float)
        total_us, launches = 0.0, 0
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA or "Memcpy" in e.name or "Memset" in e.name:
                continue
            us = e.device_time / args.replays if hasattr(e, "device_time") else e.cuda_time / args.replays
            fam = next((f for f, rx in FAMILIES if re.search(rx, e.name)), "other")
            fam_us[fam] += us
            fam_n[fam] += 1
            names[e.name[:80]] += us
            total_us += us
            launches += 1
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(args.replays):
            step()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / args.replays, total_us, launches, fam_us, fam_n, names

    step_us, total_us, launches, fam_us, fam_n, names = measure(plain)
    chunked = measure(mixed) if c else None
    split = list(mrt.splitk.get(rows))
    out = {"model": args.model, "weights": args.weights, "backend": args.backend, "kv": args.kv, "pdl": "1" if mrt.options.pdl else "0",
           "splitk_env": str(mrt.options.splitk), "splitk": split, "splitk_source": mrt.splitk.source,
           "decode_backend": args.decode_backend, "persistent": bool(mrt.persistent and mrt.persistent.get(rows)),
           "batch": n, "context": ctx, "device_us_per_step": step_us,
           "kernel_us_per_step": total_us, "launches_per_step": launches / args.replays,
           "families_us": dict(fam_us), "families_launches": {k: v / args.replays for k, v in fam_n.items()},
           "top_kernels_us": dict(sorted(names.items(), key=lambda kv: -kv[1])[:25])}
    if chunked is not None:
        m_step, m_total, m_launches, m_fam, m_n, m_names = chunked
        out["mixed"] = {"chunk_tokens": c, "chunk_at": args.chunk_at, "device_us_per_step": m_step,
                        "kernel_us_per_step": m_total, "launches_per_step": m_launches / args.replays,
                        "families_us": dict(m_fam), "families_launches": {k: v / args.replays for k, v in m_n.items()},
                        "top_kernels_us": dict(sorted(m_names.items(), key=lambda kv: -kv[1])[:25]),
                        "added_us": m_step - step_us}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{args.model} {args.weights} {args.backend} kv={args.kv} pdl={out['pdl']} splitk={split} persistent={'yes' if out['persistent'] else 'no'} bs{n} ctx{ctx}: device {step_us:.0f} us/step, kernels {total_us:.0f} us in "
          f"{launches / args.replays:.0f} launches (gaps {step_us - total_us:.0f} us)")
    for f, us in sorted(fam_us.items(), key=lambda kv: -kv[1]):
        print(f"  {f:<14} {us:8.1f} us  {fam_n[f] / args.replays:6.0f} launches")
    if chunked is not None:
        m = out["mixed"]
        print(f"with a {c}-token chunk at {args.chunk_at}: device {m['device_us_per_step']:.0f} us/step "
              f"(+{m['added_us']:.0f} us), kernels {m['kernel_us_per_step']:.0f} us in {m['launches_per_step']:.0f} launches")
        for f in sorted(set(fam_us) | set(m["families_us"]), key=lambda f: -m["families_us"].get(f, 0.0)):
            print(f"  {f:<14} {fam_us.get(f, 0.0):8.1f} -> {m['families_us'].get(f, 0.0):8.1f} us  "
                  f"{fam_n.get(f, 0) / args.replays:4.0f} -> {m['families_launches'].get(f, 0):4.0f} launches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
