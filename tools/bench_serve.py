"""Serving benchmark: real streaming HTTP clients against `graphrt serve`, side by side with the
same engine on host-planned FlashInfer graphs and with HF transformers `generate` (static cache).

    python tools/bench_serve.py --model DIR [--device cuda] [--concurrency 1,2,4,8,16]
    python tools/bench_serve.py --make tiny --device cpu --concurrency 1,2 --requests 2 \
        --output-len 6 --prompt-lens 4,12 --out-dir /tmp/bench                       # CPU smoke

Variants: `graphrt` (device-planned graphs: backend flashinfer on CUDA, torch-splitkv on CPU,
K steps per replay), `graphrt-k1` (the same with one step per replay) and `graphrt-mixed` (K
steps, prompts carried by the decode blocks: mixed_prefill_tokens = --mixed), both only when named
in --variants, `graphrt-hostplan` (backend flashinfer-hostplan, K=1: FlashInfer's plan() on
the host every step, the pattern of today's engines; CUDA only; both K=1 variants prefill
without pacing (max_prefill_stall None, unless --paced-k1): at K=1 a paced chunk would run between
every two steps, halving the decode rate while prompts wait), `hf` (transformers generate on a
left-padded batch of N prompts with a static cache, in this process: what a user would script).
Each server runs in a subprocess on 127.0.0.1; N client threads (tools/serve_load.py) each send
`--requests` streaming completions back to back (token-id prompts of mixed lengths, ignore_eos so
every request yields exactly --output-len tokens), bounded by --time-budget-s per point. Per
request: TTFT (send -> first token) and TPOT ((last token - first token) / (tokens - 1)); per
point: p50 / p99 over requests, and output tokens/s over the point's wall time; and, for
reference, the model's graph step time at batch N (in this process, after the servers:
tools/bench_engine.py's step_ms), with TPOT p50 / step (targets: <= 1.05 at N=1, <=
1.08 at N=8). Writes NAME.json, NAME.md (table) and NAME.png under --out-dir.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import k_or_auto, pyplot  # noqa: E402
from serve_load import run_point, stream_request, summarize, workload  # noqa: E402

VARIANTS = ("graphrt", "graphrt-hostplan", "hf")
EXTRA_VARIANTS = ("graphrt-k1", "graphrt-mixed")    # asked for by name (see the docstring)
NAME = "bench"


# ---- servers -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m graphrt.serve` in a subprocess, logging to LOG; ready when /health says ok."""

    def __init__(self, args, variant: str, log: Path):
        device_planned = "flashinfer" if args.device == "cuda" else "torch-splitkv"
        backend = {"graphrt": device_planned, "graphrt-k1": device_planned, "graphrt-mixed": device_planned,
                   "graphrt-hostplan": "flashinfer-hostplan"}[variant]
        k = args.steps_per_graph if variant in ("graphrt", "graphrt-mixed") else 1   # k1, host-planned: K=1
        cfg = {"backend": backend, "steps_per_graph": k, "max_batch": max(args.concurrency),
               "max_model_len": max(args.prompt_lens) + args.output_len,
               "max_waiting": 4 * max(args.concurrency), "served_model_name": NAME}
        if variant == "graphrt-mixed":
            cfg["mixed_prefill_tokens"] = args.mixed
        if k == 1 and not args.paced_k1:     # a token budget, as today's engines (see the docstring)
            cfg["max_prefill_stall"] = None
        self.config = cfg
        self.cfg_file = Path(tempfile.mkstemp(suffix=".yaml")[1])
        self.cfg_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items()))
        self.port, self.log = free_port(), log
        env = dict(os.environ)
        if args.device == "cpu":
            env.setdefault("TRITON_INTERPRET", "1")
        cmd = [sys.executable, "-m", "graphrt.serve", "--model", str(args.model), "--device", args.device,
               "--port", str(self.port), "--config", str(self.cfg_file), "--log-level", "info"]
        if args.graph_cache:
            cmd += ["--graph-cache", args.graph_cache]
        self.logf = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env,
                                     cwd=Path(__file__).resolve().parent.parent)
        self.startup_s = self._wait(args.startup_timeout_s)

    def _wait(self, timeout: float) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.25)
        self.close()
        raise RuntimeError(f"server not ready within {timeout} s; see {self.log}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()
        self.cfg_file.unlink(missing_ok=True)


# ---- HF transformers generate (static cache) -----------------------------------------------------
def hf_points(args, workloads: dict[int, list[list[int]]]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=dtype).to(args.device).eval()
    model.generation_config.eos_token_id = None
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    class Clock(BaseStreamer):               # put(): the prompt once, then one call per new token
        def __init__(self):
            self.t = []

        def put(self, value):
            sync()
            self.t.append(time.perf_counter())

        def end(self):
            pass

    def batch(prompts):
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=args.device)
        clock = Clock()
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.output_len,
                       min_new_tokens=args.output_len, do_sample=False, pad_token_id=0,
                       cache_implementation="static", streamer=clock)
        sync()
        first, last = clock.t[1], clock.t[-1]
        return [{"ttft_s": first - t0, "tpot_s": (last - first) / max(args.output_len - 1, 1),
                 "tokens": args.output_len} for _ in prompts]

    out = {}
    for n, prompts in workloads.items():
        batch(prompts[:n])                                        # warm-up (static cache, kernels)
        results, deadline, t0 = [], time.perf_counter() + args.time_budget_s, time.perf_counter()
        for i in range(0, len(prompts), n):
            if time.perf_counter() > deadline:
                break
            results += batch(prompts[i:i + n])
        out[n] = summarize(results, time.perf_counter() - t0, [])
        print(f"  hf N={n}: {fmt(out[n])}", flush=True)
    return out


# ---- the model's graph step time (the targets' reference) ----------------------------------------
def step_times(args) -> dict:
    """Graph step time at batch N (tools/bench_engine.py's step_ms: K-step replays back to back,
    time / K) for the graphrt variant's settings, at the workload's mean prompt length."""
    import torch
    from bench_engine import step_ms

    from graphrt import LLM
    max_len = max(args.prompt_lens) + args.output_len
    llm = LLM(args.model, device=args.device, max_batch=max(args.concurrency), steps_per_graph=args.steps_per_graph,
              max_model_len=max_len, backend="flashinfer" if args.device == "cuda" else "torch-splitkv")
    prompt_len = round(statistics.fmean(args.prompt_lens))
    reps = max(1, min(32, (max_len - prompt_len - 1) // llm.config.steps_per_graph))
    out = {n: step_ms(llm, n, prompt_len, torch, reps) for n in args.concurrency}
    print(f"  graph step ms at N={list(out)}: {[round(v, 3) for v in out.values()]}", flush=True)
    del llm
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return out


# ---- driver ------------------------------------------------------------------------------------
def fmt(r: dict) -> str:
    if not r or r.get("tpot_p50_ms") is None:
        return f"no result {r.get('errors') if r else ''}"
    return (f"TTFT p50 {r['ttft_p50_ms']:.1f} p99 {r['ttft_p99_ms']:.1f} ms | TPOT p50 {r['tpot_p50_ms']:.2f} "
            f"p99 {r['tpot_p99_ms']:.2f} ms | {r['tokens_per_s']:.1f} tok/s | {r['requests']} req")


def table(res: dict) -> str:
    steps = res.get("graph_step_ms") or {}
    head = ("| variant | N | requests | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | tokens/s "
            "| TPOT p50 / graph step |\n|---|---|---|---|---|---|---|---|---|")
    rows = []
    for variant, points in res["variants"].items():
        if "skipped" in points:
            rows.append(f"| {variant} | - | - | skipped: {points['skipped']} | | | | | |")
            continue
        for n, r in points.items():
            if r.get("tpot_p50_ms") is None:
                rows.append(f"| {variant} | {n} | 0 | failed: {'; '.join(r.get('errors', []))[:80]} | | | | | |")
                continue
            ratio = (f"{r['tpot_p50_ms'] / steps[n]:.3f} (step {steps[n]:.3f} ms)"
                     if n in steps and variant == "graphrt" else "-")
            rows.append(f"| {variant} | {n} | {r['requests']} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
                        f"{r['tpot_p50_ms']:.2f} | {r['tpot_p99_ms']:.2f} | {r['tokens_per_s']:.1f} | {ratio} |")
    return head + "\n" + "\n".join(rows) + "\n"


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for variant, points in res["variants"].items():
        ns = [n for n, r in points.items() if isinstance(r, dict) and r.get("tpot_p50_ms") is not None]
        if not ns:
            continue
        get = lambda key: [points[n][key] for n in ns]  # noqa: E731
        axes[0].plot(ns, get("tpot_p50_ms"), "o-", label=f"{variant} p50")
        axes[0].plot(ns, get("tpot_p99_ms"), "x--", label=f"{variant} p99")
        axes[1].plot(ns, get("ttft_p50_ms"), "o-", label=f"{variant} p50")
        axes[2].plot(ns, get("tokens_per_s"), "o-", label=variant)
    steps = res.get("graph_step_ms") or {}
    if steps:
        axes[0].plot(list(steps), list(steps.values()), "k:", label="graph step (K-step replay / K)")
    for ax, title in zip(axes, ("time per output token (ms)", "time to first token (ms)", "output tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"graphrt serve: {res['setup']['model']} on {res['setup']['device']}, "
                 f"{res['setup']['output_len']} output tokens", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory (HF layout)")
    src.add_argument("--make", metavar="SHAPE", help="write a random checkpoint of this shape first "
                     "(tools/make_checkpoint.py: tiny, llama-3.2-1b, llama-3.1-8b, qwen3-8b)")
    p.add_argument("--make-dir", default=None, help="where --make writes (default: a temp dir)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--requests", type=int, default=4, help="requests per client per point")
    p.add_argument("--prompt-lens", default="32,128,512,1024", help="mixed prompt lengths (tokens)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--steps-per-graph", type=k_or_auto, default="auto",
                   help="K of the graphrt variant: an int >= 1 or auto (the engine's default)")
    p.add_argument("--time-budget-s", type=float, default=120.0, help="per (variant, N) point")
    p.add_argument("--mixed", type=int, default=256, help="mixed_prefill_tokens of the graphrt-mixed variant")
    p.add_argument("--paced-k1", action="store_true",
                   help="keep the engine's default max_prefill_stall for the K=1 variants")
    p.add_argument("--startup-timeout-s", type=float, default=1200.0)
    p.add_argument("--no-step-time", action="store_true", help="skip measuring the graph step time at each N")
    p.add_argument("--graph-cache", default=None, help="passed to the graphrt servers")
    p.add_argument("--out-dir", default="docs/results")
    p.add_argument("--name", default=None, help="output file stem (default bench_serve_<device>)")
    a = p.parse_args(argv)
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    a.prompt_lens = [int(x) for x in a.prompt_lens.split(",")]
    a.variants = a.variants.split(",")
    bad = sorted(set(a.variants) - set(VARIANTS + EXTRA_VARIANTS))
    if bad:
        p.error(f"--variants: unknown {bad}; choose from {list(VARIANTS + EXTRA_VARIANTS)}")
    for name in ("requests", "output_len"):                # steps_per_graph: checked by k_or_auto
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(a, name)}")
    if min(a.concurrency) < 1 or min(a.prompt_lens) < 1:
        p.error("--concurrency and --prompt-lens: every value must be >= 1")
    return a


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cpu":                  # graphrt's Triton kernels, interpreted (before graphrt is imported)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.make:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from make_checkpoint import write_checkpoint
        out = Path(args.make_dir or tempfile.mkdtemp(prefix=f"graphrt-{args.make}-"))
        t0 = time.perf_counter()
        args.model = str(write_checkpoint(out, args.make, dtype="float32" if args.device == "cpu" else "bfloat16"))
        print(f"wrote a random {args.make} checkpoint to {args.model} in {time.perf_counter() - t0:.1f} s")
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    workloads = {n: workload(n, args.requests, args.prompt_lens, vocab) for n in args.concurrency}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"bench_serve_{args.device}"
    res = {"setup": {k: v for k, v in vars(args).items() if k not in ("make_dir",)}, "variants": {}}
    for variant in args.variants:
        print(f"== {variant}", flush=True)
        if variant == "graphrt-hostplan" and args.device != "cuda":
            res["variants"][variant] = {"skipped": "FlashInfer runs on CUDA only"}
            continue
        if variant == "hf":
            res["variants"][variant] = hf_points(args, workloads)
            continue
        server = Server(args, variant, out_dir / f"{stem}_{variant}.log")
        try:
            print(f"  ready in {server.startup_s:.1f} s ({server.config})", flush=True)
            stream_request(server.port, workloads[args.concurrency[0]][0], args.output_len, 600, model=NAME)  # warm-up
            points = {}
            for n in args.concurrency:
                points[n] = run_point(server.port, workloads[n], n, output_len=args.output_len,
                                      time_budget_s=args.time_budget_s, model=NAME)
                print(f"  N={n}: {fmt(points[n])}", flush=True)
            res["variants"][variant] = points
            res.setdefault("servers", {})[variant] = {"startup_s": server.startup_s, "config": server.config}
        finally:
            server.close()
    if not args.no_step_time and "graphrt" in args.variants:
        print("== graph step time", flush=True)
        res["graph_step_ms"] = step_times(args)
    (out_dir / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    md = table(res)
    (out_dir / f"{stem}.md").write_text(f"# bench_serve: {args.model} on {args.device}\n\n{md}")
    plot(res, out_dir / f"{stem}.png")
    print(md)
    return res


if __name__ == "__main__":
    main()
