"""A real pretrained model from a llama.cpp GGUF file (SmolLM2-135M-Instruct Q4_1: docs/gguf.md)
through graphrt against HF transformers: greedy agreement and decode tokens/s.

    python tools/bench_real_model.py --gguf FILE --out $OUT/real_model.json      # GPU (bf16)
    python tools/bench_real_model.py --gguf FILE --smoke --device cpu --out x.json  # a CPU check

Part 1, greedy agreement: PROMPTS (24 chat turns through the file's chat template), --max-tokens
each, end-of-sequence ignored: graphrt (LLM(FILE), bf16 on CUDA), HF float32 and HF bf16
(LlamaForCausalLM over the tensors transformers' own GGUF reader dequantizes: hf_model_from_gguf).
A prompt agrees when its tokens equal HF float32's; at the first divergence the float32 top-2
logit margin there is reported (a near-tie or not). The issue's bar: graphrt's agreement >= HF
bf16's - 2.
Part 2, decode tokens/s per stream at 1 and --streams concurrent streams: graphrt without
speculation, with n-gram speculation (num_tokens 4), host-planned (backend flashinfer-hostplan,
K=1: FlashInfer's plan() on the host every step), the persistent decode step (the runtime's
decode_backend "persistent", set through GRAPHRT_DECODE_BACKEND while its engine is built), and HF
generate (bf16, static cache). Decode
rate = (tokens - 1) / (time(tokens) - time(1 token)) over the same prompts, so prefill and
first-token costs cancel. Two workloads: chat (PROMPTS) and quote (ask the model to repeat a
passage: where n-gram lookup pays). Writes JSON (--out) and a markdown table (--out with .md).
Part 3, with --llama-bench BIN (llama.cpp's `llama-bench`, built with CUDA): llama.cpp's own batch-1
generation rate on the same file, `BIN -m FILE -ngl 99 -p 0 -n --tokens -r 5 -o json` (all layers
on the GPU, its defaults otherwise), the mean of its repetitions, as the table's `llama.cpp` row at
1 stream (llama-bench times generation alone: compare with the decode rates above).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = [
    "What is the capital of France?", "Give me three tips for staying healthy.", "What is 17 times 23?",
    "Write a haiku about the sea.", "Explain photosynthesis in one sentence.", "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.", "What is the boiling point of water in Fahrenheit?",
    "Name the planets of the solar system.", "What is a prime number?", "Summarize the plot of Cinderella.",
    "How do I make a cup of tea?", "What does a CPU do?", "List three primary colors.",
    "Why is the sky blue?", "Write a Python function that reverses a string.", "What is the largest ocean?",
    "Describe a cat in two sentences.", "What year did World War II end?", "How many legs does a spider have?",
    "What is machine learning?", "Suggest a name for a bakery.", "What is the square root of 144?",
    "Tell me a short joke.",
]
QUOTE = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
         "step. All that glitters is not gold. Actions speak louder than words.")


def hf_model_from_gguf(path, dtype, device):
    """LlamaForCausalLM holding the tensors transformers' GGUF reader dequantizes from `path`
    (its own reading: dequantize + q/k unpermute), in `dtype` on `device`; needs no accelerate."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    meta = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    cfg = LlamaConfig(**{k: v for k, v in meta.items() if k not in ("model_type", "_model_name_or_path")})
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(cfg)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = LlamaForCausalLM(cfg).to(dtype)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()):
        raise RuntimeError(f"{path}: transformers' GGUF reader left missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.to(device).eval()


def chat_ids(tok, prompts) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    import torch
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def margin_at(model, prompt: list[int], tokens: list[int], i: int) -> float:
    """HF's top-2 logit gap after prompt + tokens[:i] (float32 logits)."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:i]], device=model.device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def agreement(args, tok, llm) -> dict:
    import torch
    from graphrt import SamplingParams
    prompts = chat_ids(tok, PROMPTS[:args.prompts])
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    f32 = hf_model_from_gguf(args.gguf, torch.float32, args.device)
    ref = [hf_greedy(f32, p, args.max_tokens) for p in prompts]
    runs = {"graphrt": ours}
    if not args.smoke:
        bf16 = hf_model_from_gguf(args.gguf, torch.bfloat16, args.device)
        runs["hf_bf16"] = [hf_greedy(bf16, p, args.max_tokens) for p in prompts]
        del bf16
    out = {}
    for name, seqs in runs.items():
        rows = []
        for p, got, want in zip(prompts, seqs, ref):
            i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
            rows.append({"agree": i is None, "first_divergence": i,
                         "hf_f32_margin": None if i is None else margin_at(f32, p, want, i)})
        out[name] = {"agree": sum(r["agree"] for r in rows), "of": len(rows), "prompts": rows}
        print(f"  {name}: {out[name]['agree']}/{len(rows)} prompts equal HF float32 over {args.max_tokens} tokens; "
              f"margins at divergences {[round(r['hf_f32_margin'], 4) for r in rows if not r['agree']]}", flush=True)
    return out


def built(args, kw: dict):
    """LLM(args.gguf) with keywords `kw`; its "env" entry (variables -> values) is set while the
    engine is built (the runtime reads its overrides once, at construction), then restored."""
    import os

    from graphrt import LLM
    env = kw.pop("env", {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return LLM(str(args.gguf), device=args.device, max_batch=max(args.streams), **kw)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def graphrt_rate(llm, prompts: list[list[int]], n: int) -> float:
    """Decode tokens/s per stream over `prompts` (one generate call, end-of-sequence ignored)."""
    from graphrt import SamplingParams
    def run(tokens):
        t0 = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
        return time.perf_counter() - t0
    run(n)                                                   # warm-up: kernels, first-use costs
    return (n - 1) / max(run(n) - run(1), 1e-9)


def hf_rate(model, prompts: list[list[int]], n: int) -> float:
    import torch
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)

    def run(tokens):
        sync()
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                       do_sample=False, pad_token_id=0, eos_token_id=None, cache_implementation="static")
        sync()
        return time.perf_counter() - t0
    run(n)
    return (n - 1) / max(run(n) - run(1), 1e-9)


def rates(args, tok, llm, save) -> dict:
    """Part 2 (see the module doc); `llm`: the plain graphrt engine (reused); save(rows) after each point."""
    import torch

    workloads = {"chat": chat_ids(tok, PROMPTS),
                 "quote": chat_ids(tok, [f"Repeat this text exactly: {QUOTE}"] * len(PROMPTS))}
    if args.smoke:
        del workloads["quote"]
    variants = {"graphrt": None, "graphrt-ngram": {"speculative": {"method": "ngram", "num_tokens": 4}}}
    if args.device == "cuda" and not args.smoke:
        variants["graphrt-hostplan"] = {"backend": "flashinfer-hostplan", "steps_per_graph": 1}
        variants["graphrt-persistent"] = {"env": {"GRAPHRT_DECODE_BACKEND": "persistent"}}
    out = {}
    for name, kw in variants.items():
        engine = llm if kw is None else built(args, dict(kw))
        for wl, prompts in workloads.items():
            for s in args.streams:
                out[(name, wl, s)] = graphrt_rate(engine, prompts[:s], args.tokens)
                print(f"  {name} {wl} streams={s}: {out[(name, wl, s)]:.1f} tokens/s per stream", flush=True)
                save(out)
        if engine is not llm:
            engine.shutdown()
            del engine
    model = hf_model_from_gguf(args.gguf, torch.bfloat16 if args.device == "cuda" else torch.float32, args.device)
    for wl, prompts in workloads.items():
        for s in args.streams:
            out[("hf-generate", wl, s)] = hf_rate(model, prompts[:s], args.tokens)
            print(f"  hf-generate {wl} streams={s}: {out[('hf-generate', wl, s)]:.1f} tokens/s per stream", flush=True)
            save(out)
    return out


def llama_bench(binary: Path, gguf: Path, tokens: int, timeout_s: float = 300) -> dict:
    """llama.cpp's batch-1 generation rate on `gguf`: {"tokens_per_s", "stdev", "command", "build"}
    or {"error": ...} (one line: a missing binary, a failed run or unreadable output)."""
    cmd = [str(binary), "-m", str(gguf), "-ngl", "99", "-p", "0", "-n", str(tokens), "-r", "5", "-o", "json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        rows = json.loads(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:300], "command": " ".join(cmd)}
    if not rows:
        return {"error": f"rc {r.returncode}: {(r.stderr.strip().splitlines() or ['no output'])[-1][:300]}",
                "command": " ".join(cmd)}
    row = rows[-1]
    return {"tokens_per_s": float(row["avg_ts"]), "stdev": float(row.get("stddev_ts", 0.0)), "command": " ".join(cmd),
            "build": f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})",
            "backend": row.get("backends", row.get("backend", "?")), "gpu": row.get("gpu_info", "?")}


def table(res: dict) -> str:
    lines = ["| variant | workload | " + " | ".join(f"{s} stream(s) tok/s" for s in res["streams"]) + " |",
             "|---|---|" + "---|" * len(res["streams"])]
    for key in sorted({(r["variant"], r["workload"]) for r in res["rates"]}):
        vals = {r["streams"]: r["tokens_per_s_per_stream"] for r in res["rates"] if (r["variant"], r["workload"]) == key}
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{vals.get(s, float('nan')):.1f}" for s in res["streams"]) + " |")
    lc = res.get("llama_cpp")
    if isinstance(lc, dict) and "tokens_per_s" in lc:
        lines.append("| llama.cpp (llama-bench tg) | generation | " + " | ".join(
            f"{lc['tokens_per_s']:.1f}" if s == 1 else "-" for s in res["streams"]) + " |")
    lines += ["", "| greedy vs HF float32 | prompts equal | margins at divergences |", "|---|---|---|"]
    for name, r in res["agreement"].items():
        m = [round(p["hf_f32_margin"], 4) for p in r["prompts"] if not p["agree"]]
        lines.append(f"| {name} | {r['agree']}/{r['of']} | {m} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True, type=Path, help="the .gguf file (SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"part 1's prompts (1..{len(PROMPTS)})")
    p.add_argument("--max-tokens", type=int, default=32, help="part 1's tokens per prompt")
    p.add_argument("--tokens", type=int, default=128, help="part 2's tokens per stream")
    p.add_argument("--streams", default="1,8", help="part 2's concurrent streams (comma list)")
    p.add_argument("--no-rates", dest="do_rates", action="store_false", help="part 1 only")
    p.add_argument("--smoke", action="store_true", help="2 prompts, 4 tokens, 1 stream, chat only, no HF bf16: a CPU check")
    p.add_argument("--llama-bench", type=Path, default=None,
                   help="llama.cpp's llama-bench binary (CUDA build): its batch-1 generation rate on the same file")
    p.add_argument("--out", default="real_model.json")
    a = p.parse_args(argv)
    if a.llama_bench is not None and not a.llama_bench.is_file():
        p.error(f"--llama-bench: {a.llama_bench} is not a file")
    if not a.gguf.is_file():
        p.error(f"--gguf: {a.gguf} is not a file")
    try:
        a.streams = sorted({int(s) for s in a.streams.split(",")})
    except ValueError:
        p.error(f"--streams: expected a comma list of ints, got {a.streams!r}")
    if a.smoke:
        a.prompts, a.max_tokens, a.tokens, a.streams = 2, 4, 4, [1]
    for name in ("prompts", "max_tokens", "tokens"):
        if not 1 <= getattr(a, name) <= (len(PROMPTS) if name == "prompts" else 4096):
            p.error(f"--{name.replace('_', '-')}: {getattr(a, name)} out of range")
    if min(a.streams) < 1 or max(a.streams) > len(PROMPTS):
        p.error(f"--streams: each in [1, {len(PROMPTS)}], got {a.streams}")
    if a.tokens < 2:
        p.error("--tokens: at least 2 (the decode rate is measured between the first and the last)")
    return a


def main(argv=None) -> int:
    import torch

    from graphrt import LLM
    from graphrt.checkpoint.loader import load_tokenizer
    args = parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = load_tokenizer(args.gguf)
    t0 = time.perf_counter()
    llm = LLM(str(args.gguf), device=args.device, max_batch=max(8, max(args.streams)))
    load_s = time.perf_counter() - t0
    print(f"LLM({args.gguf.name}) on {args.device}: {load_s:.1f} s ({llm.checkpoint.load_s:.2f} s reading weights)",
          flush=True)
    res = {"gguf": str(args.gguf), "device": args.device,
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "dtype": str(llm.checkpoint.dtype),
           "llm_start_s": load_s, "weights_s": llm.checkpoint.load_s, "streams": args.streams,
           "max_tokens": args.max_tokens, "tokens": args.tokens, "rates": [], "llama_cpp": "not measured"}
    out = Path(args.out)

    def save(rows=None):
        if rows is not None:
            res["rates"] = [{"variant": v, "workload": w, "streams": s, "tokens_per_s_per_stream": r}
                            for (v, w, s), r in rows.items()]
        out.write_text(json.dumps(res, indent=2))
    res["agreement"] = agreement(args, tok, llm)
    save()
    if args.do_rates:
        rates(args, tok, llm, save)
    llm.shutdown()
    if args.llama_bench is not None:
        res["llama_cpp"] = llama_bench(args.llama_bench, args.gguf, args.tokens)
        print(f"llama.cpp: {res['llama_cpp']}", flush=True)
        save()
    md = table(res)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
