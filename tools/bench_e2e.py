"""End-to-end decode benchmark: whole Llama-shaped models, one process, side by side.

Random-weight models with the Llama-3.2-1B and Llama-3.1-8B shapes (bf16), batch x context grid.
Per configuration and variant:
  step_us      wall time per decode step in a loop that waits for every step (low concurrency)
  tok_s        tokens / s = batch / step time
  device_us    device time per step (CUDA events over back-to-back steps)
  idle         GPU idle fraction between steps: 1 - device_us / step_us
  launches     host graph launches (or eager steps) per token
Variants: eager (no graphs, device planner), hostplan (FlashInfer host plan() + graph replay, the
engines' pattern), graphrt (device-planned graph, 1 step), graphrt-k4 / -k8 (4 / 8 steps a graph),
graphrt-td-k4 (4 steps a graph, the one-launch triton-decode attention backend), gemm-only (a graph of the step's weight GEMMs alone, cuBLAS, fused qkv / gate_up + LM head: the
ceiling of any design that keeps these GEMMs). The floor is (weight bytes + KV bytes) / measured
D2D copy bandwidth; each row gives device/floor, device/gemm-only and the achieved bandwidth
(bytes over device time, TB/s and % of copy bandwidth). Prefill rows: 1 x 4k and 8 x 4k prompts
through ModelRuntime.prefill, tokens/s and MFU against the measured bf16 matmul rate and 790
TFLOP/s (FLOPs = 2 x matmul params x tokens + causal attention 2 x 2 x L x Hq x D x T^2 / 2).

FP8 weights (--weights bf16,fp8,fp8-tensor,fp8-head,fp8-tensor-head,fp8-block): the same random
model with qkv / o / gate_up / down quantized to e4m3 (per-channel; one scale per fused weight;
128 x 128 block scales; the LM head stays bf16, as FP8 checkpoints ship it, except in the -head
kinds); its floor counts the bytes actually streamed (FP8 data + float32 scales + the LM head +
KV), and its gemm-only graph runs the GEMMs the step makes (LlamaDecoder._mm: W8A8
torch._scaled_mm over FP8 rows; the FP8 GEMV for block scales).

int4 weights (--weights int4, int4-sym, int4-head): qkv / o / gate_up / down as graphrt's int4
layout (round-to-nearest, group 128, asymmetric; -sym: zero 8, no zeros streamed; -head: the LM
head too, untied heads only); the floor counts the packed codes + fp16 scales + uint8 zeros + the
bf16 LM head + KV. The step's GEMMs run int4_linear (the int4 GEMV, dequantized in registers, up
to 64 rows). --int4-kernels adds a per-shape grid: every int4 GEMV config and dequantize + cuBLAS
(one line each; columns: shape / batch; device µs per call from Linear.choose, weights rotated past
the L2; default_config's pick and the fastest marked), the default's and the best's x bytes floor,
and bf16's best (cuBLAS / GEMV) beside them. bf16, FP8 and int4 side by side in one run:

    python tools/bench_e2e.py --models llama-3.2-1b,llama-3.1-8b --weights bf16,fp8,int4 \
        --batches 1,16 --contexts 1024 --variants graphrt --no-prefill --int4-kernels

FP8 KV cache (--kv bf16,fp8): the same rows with the KV pool in e4m3 (kv_cache_dtype="fp8",
one byte per element: the floor counts half the KV bytes); FlashInfer planned with an FP8 KV
dtype, the scales folded on the device. At bs 16 / 8k context the 8B model's KV bytes exceed its
weights, so this is where FP8 KV shows:

    python tools/bench_e2e.py --models llama-3.1-8b --batches 16 --contexts 8192 \
        --variants graphrt-k4 --kv bf16,fp8 --no-prefill

With --count-kernels each row records the CUDA kernels per step (`kernels_per_step`):

    python tools/bench_e2e.py --models llama-3.2-1b,llama-3.1-8b --batches 1,16 --contexts 1024 \
        --variants graphrt --no-prefill --count-kernels

The decode step as one persistent kernel (graphrt/model/persistent.py): graphrt-persistent /
graphrt-persistent-k4 run greedy buckets <= 16 rows with decode_backend="persistent" (1 / 4
steps a graph; not in the default --variants), every other variant the kernel sequence; each row
records whether its bucket ran the persistent step (`persistent`). FP8 (per-channel / per-tensor
scales; W8A16 in the persistent step) and int4 (no act-order) weights run it too; fp8-block keeps
the sequence:

    python tools/bench_e2e.py --models llama-3.2-1b,llama-3.1-8b --batches 1,4,16 --contexts 1024 \
        --variants graphrt,graphrt-persistent --no-prefill
    python tools/bench_e2e.py --models llama-3.1-8b --weights bf16,fp8,int4 --batches 1,16 \
        --contexts 1024 --variants graphrt,graphrt-persistent --no-prefill

Split-K of the o and down GEMMs follows GRAPHRT_SPLITK (graphrt/model/splitk.py: unset / auto =
measured at capture, 1 = off, 2 / 4 = forced); each row records the (S_o, S_down) its bucket ran
(`splitk`). The gemm-only graph stays unsplit.

    python tools/bench_e2e.py --out bench_e2e.json --png bench_e2e.png
    python tools/bench_e2e.py --models llama-3.1-8b --weights bf16,fp8 --batches 1,16 \
        --contexts 1024 --variants graphrt --no-prefill --fp8-kernels
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
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152, True),     # the real model's geometry (docs/gguf.md)
}
VARIANTS = {"eager": ("flashinfer", 1, False), "hostplan": ("flashinfer-hostplan", 1, True),
            "graphrt": ("flashinfer", 1, True), "graphrt-k4": ("flashinfer", 4, True),
            "graphrt-k8": ("flashinfer", 8, True), "graphrt-td-k4": ("triton-decode", 4, True)}
# the decode step as one persistent kernel (graphrt/model/persistent.py: ModelRuntime
# decode_backend="persistent", greedy buckets <= 16 rows; every other variant runs the kernel
# sequence); not in the default --variants: run beside `graphrt` / `graphrt-k4`
PERSISTENT_VARIANTS = {"graphrt-persistent": ("flashinfer", 1, True, "auto"),
                       "graphrt-persistent-k4": ("flashinfer", 4, True, "auto")}
KV_KINDS = {"bf16": "auto", "fp8": "fp8"}   # --kv -> RuntimeConfig.kv_cache_dtype


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per measurement")
    p.add_argument("--no-prefill", dest="prefill", action="store_false", help="skip prefill rows")
    p.add_argument("--weights", default="bf16", help="comma list of bf16, fp8, fp8-tensor, fp8-head, fp8-tensor-head, "
                                                     "fp8-block, int4, int4-sym, int4-head")
    p.add_argument("--kv", default="bf16", help="comma list of KV cache dtypes: bf16, fp8 (e4m3)")
    p.add_argument("--count-kernels", action="store_true",
                   help="also count kernels per decode step (torch.profiler over 3 replays; each row's `kernels`)")
    p.add_argument("--fp8-kernels", action="store_true",
                   help="per-shape table: bf16 cuBLAS / bf16 GEMV vs FP8 GEMV candidates / _scaled_mm")
    p.add_argument("--int4-kernels", action="store_true",
                   help="per-shape table: bf16 cuBLAS / bf16 GEMV vs int4 GEMV configs / dequantize + cuBLAS")
    p.add_argument("--out", default="bench_e2e.json")
    p.add_argument("--png", default=None)
    args = p.parse_args(argv)
    kinds = ["bf16"] + sorted(WEIGHT_KINDS) + sorted(INT4_KINDS)
    bad = [k for k in args.weights.split(",") if k not in kinds]
    if bad:
        p.error(f"--weights: {bad[0]!r} is not one of {kinds}")
    variants = sorted(VARIANTS) + sorted(PERSISTENT_VARIANTS)
    bad = [v for v in args.variants.split(",") if v not in variants]
    if bad:
        p.error(f"--variants: {bad[0]!r} is not one of {variants}")
    return args


def random_model(name: str, torch):
    """A random bf16 LlamaDecoder of the named shape, built straight into the fused layout."""
    from graphrt.model import LlamaDecoder, LlamaSpec
    from graphrt.model.weights import LayerWeights, ModelWeights
    h, inter, layers, hq, hkv, d, vocab, tied = SHAPES[name]
    spec = LlamaSpec(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_layers=layers,
                     num_heads=hq, num_kv_heads=hkv, head_dim=d, rms_norm_eps=1e-5,
                     rope_theta=500000.0, tie_word_embeddings=tied, attention_bias=False,
                     max_position_embeddings=16384)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02

    def ones(n):
        return torch.ones(n, device="cuda", dtype=torch.bfloat16)
    embed = rnd(vocab, h)
    lw = tuple(LayerWeights(input_norm=ones(h), post_attn_norm=ones(h), qkv=rnd((hq + 2 * hkv) * d, h),
                            qkv_bias=None, q_norm=None, k_norm=None, o=rnd(h, hq * d),
                            gate_up=rnd(2 * inter, h), down=rnd(h, inter)) for _ in range(layers))
    weights = ModelWeights(embed=embed, final_norm=ones(h), lm_head=embed if tied else rnd(vocab, h),
                           layers=lw)
    model = LlamaDecoder(spec, weights)
    return model, streamed_bytes(weights)


def streamed_bytes(weights) -> int:
    """Bytes a decode step must read: every matmul weight once (FP8: data + scales; the
    embedding row is negligible)."""
    def nbytes(t):       # Fp8Weight / Int4Weight: their streamed bytes (codes, scales, zeros)
        return t.nbytes if hasattr(t, "block") or hasattr(t, "group_size") else t.numel() * t.element_size()
    return (sum(nbytes(t) for x in weights.layers for t in (x.qkv, x.o, x.gate_up, x.down))
            + nbytes(weights.lm_head))


WEIGHT_KINDS = {"fp8": ("channel", False), "fp8-tensor": ("fused-tensor", False),
                "fp8-tensor-head": ("fused-tensor", True),
                "fp8-head": ("channel", True), "fp8-block": ("block", False)}
INT4_KINDS = {"int4": (False, False), "int4-sym": (True, False), "int4-head": (False, True)}   # symmetric, head


def with_weights(model, kind: str, torch):
    """The model with its decoder linears as `kind` ("bf16": unchanged; "fp8": per-channel
    e4m3, W8A8; "fp8-tensor": one scale per fused weight (quantize_weights "fused-tensor");
    "fp8-head" / "fp8-tensor-head": the same with the LM head in FP8 too (untied heads only);
    "fp8-block": 128 x 128 block scales; "int4" / "int4-sym" / "int4-head": RTN group 128
    int4, asymmetric / symmetric / with the LM head) -> (model, streamed bytes)."""
    from graphrt.model import LlamaDecoder
    from graphrt.model.fp8_weights import quantize_weights
    from graphrt.model.int4_weights import quantize_weights_int4
    if kind == "bf16":
        return model, streamed_bytes(model.weights)
    if kind in INT4_KINDS:
        sym, head = INT4_KINDS[kind]
        w4 = quantize_weights_int4(model.weights, group_size=128, symmetric=sym, lm_head=head)
        return LlamaDecoder(model.spec, w4), streamed_bytes(w4)
    if kind not in WEIGHT_KINDS:
        raise SystemExit(f"--weights: {kind!r} is not bf16 or one of {sorted(WEIGHT_KINDS) + sorted(INT4_KINDS)}")
    strategy, head = WEIGHT_KINDS[kind]
    w8 = quantize_weights(model.weights, model.spec, strategy, lm_head=head)
    return LlamaDecoder(model.spec, w8), streamed_bytes(w8)


def fp8_kernel_rows(model, batches, torch) -> list[dict]:
    """Per distinct decode GEMM shape: device µs of bf16 cuBLAS / bf16 GEMV configs and of the
    FP8 GEMV configs / _scaled_mm (per-channel and block weights), from Linear.choose (CUDA
    graph, weights rotated past the L2), with each one's bytes floor."""
    from benchlib import copy_bandwidth
    from graphrt.model.linear import Linear
    from graphrt.model.quant import quantize_fp8
    bw, rows, layer = copy_bandwidth(torch), [], model.weights.layers[0]
    for name, w in (("qkv", layer.qkv), ("o", layer.o), ("gate_up", layer.gate_up),
                    ("down", layer.down)):
        for kind, lin in (("bf16", Linear(w)), ("fp8", Linear(quantize_fp8(w, "channel"))),
                          ("fp8-block", Linear(quantize_fp8(w, "block")))):
            lin.choose(batches)
            nbytes = w.numel() * 2 if kind == "bf16" else lin.weight.nbytes
            for m, times in lin.timings_us.items():
                best = min(times, key=times.get)
                rows.append(dict(shape=name, n=w.shape[0], k=w.shape[1], weights=kind, batch=m,
                                 best=best, best_us=times[best], floor_us=nbytes / bw * 1e6,
                                 best_over_floor=times[best] / (nbytes / bw * 1e6), times_us=times))
                print(rows[-1], file=sys.stderr)
    return rows


def int4_kernel_rows(model, batches, torch) -> list[dict]:
    """Per distinct decode GEMM shape: device µs of bf16 cuBLAS / GEMV configs and of every int4
    GEMV config / dequantize + cuBLAS (RTN g128 asymmetric and symmetric), from Linear.choose
    (CUDA graph, weights rotated past the L2), with each one's bytes floor and the config
    default_config picks (`default`)."""
    from benchlib import copy_bandwidth
    from graphrt.kernels.gemv_int4 import default_config
    from graphrt.model.linear import Linear
    from graphrt.model.quant.int4 import quantize_int4
    bw, rows, layer = copy_bandwidth(torch), [], model.weights.layers[0]
    for name, w in (("qkv", layer.qkv), ("o", layer.o), ("gate_up", layer.gate_up), ("down", layer.down)):
        for kind, lin in (("bf16", Linear(w)), ("int4", Linear(quantize_int4(w, 128))),
                          ("int4-sym", Linear(quantize_int4(w, 128, symmetric=True)))):
            lin.choose(batches)
            nbytes = w.numel() * 2 if kind == "bf16" else lin.weight.nbytes
            for m, times in lin.timings_us.items():
                best = min(times, key=times.get)
                default = default_config(w.shape[0], w.shape[1], 128, m).name if kind != "bf16" else None
                rows.append(dict(shape=name, n=w.shape[0], k=w.shape[1], weights=kind, batch=m,
                                 best=best, best_us=times[best], floor_us=nbytes / bw * 1e6,
                                 best_over_floor=times[best] / (nbytes / bw * 1e6), times_us=times,
                                 default=default, default_us=times.get(default)))
                print(rows[-1], file=sys.stderr)
            del lin
            torch.cuda.empty_cache()
    return rows


def print_int4_grid(rows: list[dict]) -> None:
    """The int4 kernel table: one line per int4 GEMV config (and dequantize + cuBLAS), one column
    per (shape, batch), device µs per call; * marks default_config's pick, ! the fastest; then
    the default / best x floor and bf16's best for the same shape."""
    for model in sorted({r["model"] for r in rows if r["weights"].startswith("int4")}):
        for kind in ("int4", "int4-sym"):
            mine = [r for r in rows if r["model"] == model and r["weights"] == kind]
            if not mine:
                continue
            cols = [(r["shape"], r["batch"]) for r in mine]
            print(f"\n{kind} GEMV, {model}: device us per call (weights past L2); * default_config, ! fastest")
            print(f"{'config':<44}" + "".join(f"{f'{s}/{b}':>11}" for s, b in cols))
            for name in sorted({c for r in mine for c in r["times_us"]}):
                cells = []
                for r in mine:
                    us = r["times_us"].get(name)
                    mark = ("!" if name == r["best"] else "") + ("*" if name == r["default"] else "")
                    cells.append(f"{'-' if us is None else f'{us:.1f}{mark}':>11}")
                print(f"{'dequantize + cublas' if name == 'cublas' else name:<44}" + "".join(cells))
            for label, key in (("floor (bytes / copy bw)", "floor_us"), ("default x floor", None),
                               ("best x floor", "best_over_floor")):
                vals = [r[key] if key else (r["default_us"] or float("nan")) / r["floor_us"] for r in mine]
                print(f"{label:<44}" + "".join(f"{v:>11.2f}" for v in vals))
            bf = {(r["shape"], r["batch"]): r["best_us"] for r in rows if r["model"] == model and r["weights"] == "bf16"}
            print(f"{'bf16 best (cuBLAS / GEMV)':<44}" + "".join(f"{bf.get(c, float('nan')):>11.1f}" for c in cols))
            print(f"{'bf16 best / int4 default':<44}" + "".join(
                f"{bf.get(c, float('nan')) / (r['default_us'] or float('nan')):>11.2f}" for c, r in zip(cols, mine)))


def gemm_only_us(model, n: int, torch) -> float:
    """Device µs of one graph holding only the step's weight GEMMs at batch n, as the step
    calls them (LlamaDecoder._mm: cuBLAS for bf16 weights; W8A8 torch._scaled_mm over FP8
    rows for per-tensor / per-channel FP8; the FP8 GEMV for block-scaled)."""
    from benchlib import device_us
    from graphrt.kernels.fp8 import quantize_rows
    w, h = model.weights, model.spec.hidden_size

    def act(k, weight):
        x = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        return quantize_rows(x) if model._fp8_in(weight) else x
    layer0 = w.layers[0]
    x, a = act(h, layer0.qkv), act(model.spec.num_heads * model.spec.head_dim, layer0.o)
    gu, m = act(h, layer0.gate_up), act(model.spec.intermediate_size, layer0.down)
    xh = act(h, w.lm_head)

    def step():
        for layer in w.layers:
            model._mm(x, layer.qkv)
            model._mm(a, layer.o)
            model._mm(gu, layer.gate_up)
            model._mm(m, layer.down)
        model._mm(xh, w.lm_head)
    step()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return device_us(g.replay, torch, reps=10, repeats=5)


def matmul_tflops(torch) -> float:
    """Measured dense bf16 matmul rate (8192^3, random data), TFLOP/s."""
    from benchlib import device_us
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    us = device_us(lambda: a @ b, torch, reps=20, repeats=5)
    return 2 * 8192 ** 3 / (us * 1e-6) / 1e12


def prefill_rows(name, model, torch, peak_tflops, weights="bf16"):
    """Prefill 1 x 4k and 8 x 4k prompts: tokens/s and MFU."""
    from graphrt import RuntimeConfig
    from graphrt.model.runtime import ModelRuntime
    s, rows = model.spec, []
    for n, t in ((1, 4096), (8, 4096)):
        pages = t // 16 + 1
        cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                            page_size=16, max_pages_per_seq=pages, buckets=[n], dtype="bfloat16",
                            backend="flashinfer", kv_pool_pages=n * pages + 1)
        mrt = ModelRuntime(model, cfg, "cuda")
        table = torch.arange(n * pages, dtype=torch.int32).view(n, pages).cuda()
        prompts = [torch.randint(0, s.vocab_size, (t,), device="cuda") for _ in range(n)]
        mrt.prefill(prompts, table)                                  # warm-up (plans, compiles)
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            mrt.prefill(prompts, table)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        sec = statistics.median(times)
        params = sum(x.shape[0] * x.shape[1] for layer in model.weights.layers
                     for x in (layer.qkv, layer.o, layer.gate_up, layer.down))
        flops = 2 * params * n * t + 2 * 2 * s.num_layers * s.num_heads * s.head_dim * t * t / 2 * n
        flops += 2 * model.weights.lm_head.shape[0] * model.weights.lm_head.shape[1] * n                  # last-token logits
        rows.append(dict(model=name, weights=weights, prompts=n, prompt_len=t, seconds=sec, tok_s=n * t / sec,
                         tflops=flops / sec / 1e12, mfu_measured=flops / sec / 1e12 / peak_tflops,
                         mfu_790=flops / sec / 1e12 / 790))
        print(rows[-1], file=sys.stderr)
        del mrt
        torch.cuda.empty_cache()
    return rows


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


def kernels_per_step(mrt, n, ctx, torch, replays: int = 3) -> float:
    """CUDA kernels per decode step (copies and memsets left out): torch.profiler over `replays`
    decode calls (K steps each), as tools/profile_step.py counts them."""
    from torch.profiler import ProfilerActivity, profile
    pages = mrt.config.max_pages_per_seq                     # measure()'s table width
    table = torch.arange(n * pages, dtype=torch.int32).view(n, pages)
    lens = torch.full((n,), ctx, dtype=torch.int32)
    tokens = torch.zeros(n, dtype=torch.int64, device="cuda")
    tb, lb = (table, lens) if mrt.backend.needs_host_inputs else (table.cuda(), lens.cuda())
    mrt.decode(tokens, tb, lb)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            mrt.decode(tokens, tb, lb)
        torch.cuda.synchronize()
    count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                and "Memcpy" not in e.name and "Memset" not in e.name)
    return count / (replays * mrt.k)


def run(args) -> dict:
    import torch

    from graphrt import RuntimeConfig
    from graphrt.model.runtime import ModelRuntime
    bw = copy_bandwidth(torch)
    peak = matmul_tflops(torch)
    rows, prefill, kernels = [], [], []
    for name, wkind in [(m, k) for m in args.models.split(",") for k in args.weights.split(",")]:
        model, _ = random_model(name, torch)
        if args.fp8_kernels and wkind == args.weights.split(",")[0]:
            kernels += [dict(model=name, **r) for r in
                        fp8_kernel_rows(model, [int(x) for x in args.batches.split(",")], torch)]
        if args.int4_kernels and wkind == args.weights.split(",")[0]:
            kernels += [dict(model=name, **r) for r in
                        int4_kernel_rows(model, [int(x) for x in args.batches.split(",")], torch)]
        model, weight_bytes = with_weights(model, wkind, torch)
        torch.cuda.empty_cache()
        s = model.spec
        gemm = {n: gemm_only_us(model, n, torch) for n in [int(x) for x in args.batches.split(",")]}
        if args.prefill:
            prefill += prefill_rows(name, model, torch, peak, wkind)
        for ctx in [int(x) for x in args.contexts.split(",")]:
            for n in [int(x) for x in args.batches.split(",")]:
                pages = -(-(ctx + args.steps * 8 + 16) // 16)
                for variant, kv in [(v, x) for v in args.variants.split(",") for x in args.kv.split(",")]:
                    known = VARIANTS | {v: x[:3] for v, x in PERSISTENT_VARIANTS.items()}
                    if variant not in known:
                        raise SystemExit(f"--variants: {variant!r} is not one of {sorted(known)}")
                    backend, k, graphs = known[variant]
                    decode_backend = "persistent" if variant in PERSISTENT_VARIANTS else "sequence"
                    if kv not in KV_KINDS:
                        raise SystemExit(f"--kv: {kv!r} is not one of {sorted(KV_KINDS)}")
                    cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                                        head_dim=s.head_dim, page_size=16, max_pages_per_seq=pages,
                                        buckets=[n], dtype="bfloat16", backend=backend,
                                        kv_pool_pages=n * pages + 1, kv_cache_dtype=KV_KINDS[kv])
                    mrt = ModelRuntime(model, cfg, "cuda", steps_per_graph=k, decode_backend=decode_backend)
                    if graphs:
                        mrt.capture()
                    step_us, dev_us, launches = measure(mrt, n, ctx, args.steps, torch)
                    n_kernels = kernels_per_step(mrt, n, ctx, torch) if args.count_kernels else None
                    kv_bytes = s.num_layers * n * ctx * s.num_kv_heads * s.head_dim * 2 * (1 if kv == "fp8" else 2)
                    floor = (weight_bytes + kv_bytes) / bw * 1e6
                    rows.append(dict(model=name, weights=wkind, kv=kv, variant=variant, batch=n, context=ctx,
                                     step_us=step_us,
                                     tok_s=n / step_us * 1e6, device_us=dev_us,
                                     idle=max(0.0, 1 - dev_us / step_us), launches_per_token=launches,
                                     splitk=list(mrt.splitk.get(n)) if mrt.splitk else [1, 1],
                                     persistent=bool(mrt.persistent and mrt.persistent.get(n)),
                                     kernels_per_step=n_kernels,
                                     floor_us=floor, gemm_only_us=gemm[n],
                                     device_over_floor=dev_us / floor,
                                     device_over_gemm_only=dev_us / gemm[n],
                                     achieved_tb_s=(weight_bytes + kv_bytes) / dev_us / 1e6,
                                     pct_copy_bw=(weight_bytes + kv_bytes) / (dev_us * 1e-6) / bw * 100))
                    print(rows[-1], file=sys.stderr)
                    del mrt
                    torch.cuda.empty_cache()
        del model
    return {"device": torch.cuda.get_device_name(), "copy_bw_bytes_per_s": bw,
            "matmul_tflops": peak, "rows": rows, "prefill": prefill, "fp8_kernels": kernels}


def print_table(result: dict) -> None:
    print(f"copy bandwidth {result['copy_bw_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
          f"{result['matmul_tflops']:.0f} TFLOP/s ({result['device']})")
    print(f"{'model':<13} {'weights':<9} {'kv':<4} {'variant':<21} {'bs':>3} {'ctx':>5} {'step us':>8} {'tok/s':>8} "
          f"{'device us':>9} {'idle':>5} {'floor us':>8} {'x floor':>7} {'gemm us':>8} {'x gemm':>6} "
          f"{'TB/s':>5} {'%bw':>4} {'pers':>4} {'kernels':>7}")
    for r in result["rows"]:
        print(f"{r['model']:<13} {r.get('weights', 'bf16'):<9} {r.get('kv', 'bf16'):<4} {r['variant']:<21} {r['batch']:>3} {r['context']:>5} {r['step_us']:>8.1f} "
              f"{r['tok_s']:>8.0f} {r['device_us']:>9.1f} {r['idle']:>5.2f} {r['floor_us']:>8.1f} "
              f"{r['device_over_floor']:>7.2f} {r['gemm_only_us']:>8.1f} {r['device_over_gemm_only']:>6.2f} "
              f"{r['achieved_tb_s']:>5.2f} {r['pct_copy_bw']:>4.0f} "
              f"{'yes' if r.get('persistent') else 'no':>4} {r['kernels_per_step'] if r.get('kernels_per_step') is not None else '-':>7}")
    print_int4_grid(result.get("fp8_kernels", []))
    for r in result.get("fp8_kernels", []):
        if r["weights"].startswith("int4"):
            continue
        print(f"gemm {r['model']:<13} {r['shape']:<8} {r['n']:>6}x{r['k']:<6} {r['weights']:<9} bs {r['batch']:>3}: "
              f"best {r['best']:<28} {r['best_us']:>7.1f} us, floor {r['floor_us']:>6.1f} us, "
              f"x{r['best_over_floor']:.2f}")
    for r in result.get("prefill", []):
        print(f"prefill {r['model']:<13} {r.get('weights', 'bf16'):<9} {r['prompts']} x {r['prompt_len']}: {r['seconds'] * 1e3:.1f} ms, "
              f"{r['tok_s']:.0f} tok/s, {r['tflops']:.0f} TFLOP/s, MFU {r['mfu_790'] * 100:.0f}% of 790 "
              f"({r['mfu_measured'] * 100:.0f}% of measured)")


def plot(result: dict, png: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = result["rows"]
    keys = sorted({(r["model"], r["context"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (model, ctx) in zip(axes[0], keys):
        for wk in sorted({r.get("weights", "bf16") for r in rows}):
            for variant in list(VARIANTS) + list(PERSISTENT_VARIANTS):
                pts = sorted((r["batch"], r["step_us"]) for r in rows if r["model"] == model and
                             r["context"] == ctx and r["variant"] == variant and r.get("weights", "bf16") == wk)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{variant} {wk}")  # (every kv kind)
            floor = sorted((r["batch"], r["floor_us"]) for r in rows if r["model"] == model and
                           r["context"] == ctx and r["variant"] == "graphrt" and r.get("weights", "bf16") == wk)
            if floor:
                ax.plot(*zip(*floor), "--", label=f"floor {wk}")
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
