"""Held-out quality of a trained checkpoint: graphrt vs HF transformers float32.

    python tools/eval_ppl.py CHECKPOINT [--device cuda|cpu] [--max-files 64] [--window 512]
        [--decode-tokens 128] [--prompts 64] [--prompt-tokens 32] [--gen-tokens 64]
        [--agree-with TARGET_DIR] [--quantization fp8|int4] [--json OUT]

Held-out text: the files `train_tiny.is_heldout` keeps out of training (the same fixed split),
each as `<bos>` + its first `--window - 1` tokens (files under 16 tokens skipped), in path order.

1. Perplexity, prefill: graphrt's eager prefill path (the model's fused GEMMs and Triton kernels,
   FlashInfer batch prefill on CUDA; the float32 reference on CPU), chunked over ragged files,
   logits at every position; against HF transformers in float32 on the same tokens.
2. Perplexity, decode: teacher-forced through graphrt's captured decode graphs (one step per
   replay, so that the next input is the true token, not the argmax; `keep_logits`), for the first
   `--decode-tokens` tokens of each file long enough; HF float32 over the same positions.
3. Greedy agreement: `graphrt.LLM` (CUDA graphs of K steps, overlap on; CPU: eager float32)
   continues `--prompts` held-out prompts (`--prompt-tokens` from the middle of a file) for
   `--gen-tokens` tokens (ignore_eos); HF float32 scores each continuation teacher-forced. A
   sequence is identical when HF's argmax agrees at every step; its identical prefix is the
   tokens before the first disagreement; at that divergence the report gives HF's logit margin
   (top - graphrt's token) in absolute terms and in bf16 ulps of the top logit. HF's own
   bfloat16 greedy continuations are scored the same way: what bf16 arithmetic itself reaches.
   With fewer files than prompts, each file gives several evenly spaced prompts.
4. --agree-with TARGET: HF float32 top-1 agreement of this checkpoint (the draft) with TARGET at
   every held-out position, and both perplexities (their ratio).

--quantization fp8 / int4: graphrt quantizes the float checkpoint's linear layers while loading
(FP8 per channel; int4 round-to-nearest group 128, docs/int4.md); the HF float32 reference keeps
the original weights, so the ratios report the format's loss.

--reference FLOAT_DIR: HF float32 (and bf16) from FLOAT_DIR instead of CHECKPOINT, for a checkpoint
transformers cannot load by itself (an int4 GPTQ checkpoint written by tools/quantize_int4.py):
graphrt runs CHECKPOINT, HF the float weights it was made from.

Prints a table; --json writes every number. Runs on a GPU or on a CPU (tiny
settings; Triton through the interpreter).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_tiny  # noqa: E402  (the corpus split and special ids)

MIN_FILE_TOKENS = 16


def heldout_sequences(tok, *, max_files: int, window: int) -> list[list[int]]:
    """`<bos>` + the first window - 1 tokens of each held-out file (>= MIN_FILE_TOKENS)."""
    texts = [t for _, t in train_tiny.read_split(True)]
    out = []
    for ids in train_tiny.encode_files(tok, texts):
        if len(ids) >= MIN_FILE_TOKENS:
            out.append(ids[:window])
        if len(out) == max_files:
            break
    return out


def nll_rows(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [T, V] (any float dtype), targets [T] int64 -> [T] float64 negative log-likelihoods."""
    return -torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])[:, 0].double().cpu()


# ---- HF float32 ---------------------------------------------------------------------------------
def hf_model(path, device):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()


@torch.no_grad()
def hf_logits(hf, ids: list[int], device) -> torch.Tensor:
    """[T, V] float32 logits at every position of `ids`."""
    return hf(input_ids=torch.tensor([ids], device=device)).logits[0].float()


# ---- graphrt ------------------------------------------------------------------------------------
def graphrt_runtime(path, device, *, rows: int, context: int, quantization: str | None = None):
    """(model, ModelRuntime with 1-step graphs keeping logits, rows x context pages); bf16 on CUDA;
    quantization: load_checkpoint's (None, "fp8", "int4")."""
    from graphrt.config import RuntimeConfig
    from graphrt.checkpoint.loader import load_checkpoint
    from graphrt.checkpoint.decoder import build_model
    from graphrt.model.runtime import ModelRuntime
    cuda = device.type == "cuda"
    ck = load_checkpoint(path, device=device, dtype=torch.bfloat16 if cuda else torch.float32,
                         quantization=quantization)
    s, page = ck.spec, 16
    rc = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                       page_size=page, max_context_len=context, buckets=[rows],
                       dtype="bfloat16" if cuda else "float32",
                       backend="flashinfer" if cuda else "torch-splitkv",
                       kv_pool_pages=rows * -(-context // page))
    model = build_model(ck, max_positions=context)
    return model, ModelRuntime(model, rc, device, steps_per_graph=1, keep_logits=True)


def block_table(rows: int, context: int, page: int = 16) -> torch.Tensor:
    """[rows, pages] int32: row i owns pages i * w .. (i + 1) * w - 1."""
    w = -(-context // page)
    return torch.arange(rows * w, dtype=torch.int32).view(rows, w)


@torch.no_grad()
def graphrt_prefill_nll(model, mrt, seqs: list[list[int]], *, chunk_tokens: int) -> list[torch.Tensor]:
    """Per sequence [T - 1] NLL of tokens 1.. from graphrt's chunked prefill path (every
    position's logits; the same kernels as `LlamaDecoder.prefill`, which keeps only the last)."""
    from graphrt.model.prefill import PrefillAttention, plan_chunks
    dev, rows = mrt.device, mrt.config.max_batch
    attn = PrefillAttention(mrt.config, dev)
    table = block_table(rows, mrt.config.max_context_len).to(dev)
    out: list[torch.Tensor] = []
    for b in range(0, len(seqs), rows):
        group = [torch.tensor(s, dtype=torch.int64, device=dev) for s in seqs[b: b + rows]]
        pieces = [[] for _ in group]
        error = torch.zeros(1, dtype=torch.int32, device=dev)
        for chunk in plan_chunks([len(g) for g in group], max_tokens=chunk_tokens):
            meta = attn.plan(chunk, table)
            tokens = torch.cat([group[i][s: s + n] for i, s, n in zip(chunk.seqs, chunk.starts, chunk.lens)])
            h = model._forward_tokens(tokens, meta.positions, meta.rows, mrt.kv_caches, table, error,
                                      lambda i, q: attn.run(q, mrt.kv_caches[i]).view(q.shape[0], -1))
            logits = model._logits(h)                                   # [T, V] model dtype
            at = 0
            for i, s, n in zip(chunk.seqs, chunk.starts, chunk.lens):
                m = min(n, len(group[i]) - 1 - s)                       # the last token has no target
                if m > 0:
                    pieces[i].append(nll_rows(logits[at: at + m], group[i][s + 1: s + 1 + m]))
                at += n
        if int(error.item()):
            raise RuntimeError(f"prefill: K/V append flagged device_error {int(error.item())}")
        out += [torch.cat(p) for p in pieces]
    return out


@torch.no_grad()
def graphrt_decode_nll(mrt, seqs: list[list[int]], n_tokens: int) -> torch.Tensor:
    """[S, n_tokens - 1] NLL of tokens 2..n_tokens, each predicted by one teacher-forced replay
    of the captured decode graph (token t in, logits for t + 1 out); sequences need n_tokens + 1."""
    rows, dev = mrt.config.max_batch, mrt.device
    out = []
    for b in range(0, len(seqs), rows):
        x = torch.tensor([s[: n_tokens + 1] for s in seqs[b: b + rows]], dtype=torch.int64)   # [n, N+1]
        n = x.shape[0]
        table = block_table(rows, mrt.config.max_context_len)[:n]
        mrt.prefill([x[i, :1] for i in range(n)], table)               # token 0 into the caches
        nll = []
        for t in range(1, n_tokens):
            mrt.decode(x[:, t].to(dev), table, torch.full((n,), t + 1, dtype=torch.int32))
            nll.append(nll_rows(mrt.last_logits(n), x[:, t + 1].to(dev)))
        out.append(torch.stack(nll, 1))
    return torch.cat(out)


# ---- greedy agreement ---------------------------------------------------------------------------
def bf16_ulp(x: float) -> float:
    """Spacing of bfloat16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def prompt_windows(seqs: list[list[int]], *, prompts: int, prompt_tokens: int) -> list[list[int]]:
    """`prompts` held-out prompts of `prompt_tokens` tokens: the middle of each file when there are
    enough files, else several evenly spaced windows per file (round-robin over the files)."""
    cands = [s for s in seqs if len(s) >= prompt_tokens + 1]
    if not cands or not prompts:
        return []
    per = -(-prompts // len(cands))
    windows = [[s[a: a + prompt_tokens] for a in sorted({(len(s) - prompt_tokens) * (i + 1) // (per + 1)
                                                         for i in range(per)})] for s in cands]
    out = []
    for i in range(per):
        out += [w[i] for w in windows if i < len(w)]
    return out[:prompts]


@torch.no_grad()
def hf_greedy(hf, ps: list[list[int]], gen_tokens: int, device) -> list[list[int]]:
    """HF's own greedy continuations (incremental decode with its KV cache, eos ignored); the
    prompts have one length, so they run as one batch without padding."""
    import inspect
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # transformers 5.2x
    ids = torch.tensor(ps, device=device)
    out = hf(input_ids=ids, use_cache=True)
    toks = [out.logits[:, -1].argmax(-1)]
    for _ in range(gen_tokens - 1):
        past = getattr(out, "cache", None) or out.past_key_values
        out = hf(input_ids=toks[-1][:, None], use_cache=True, **{key: past})
        toks.append(out.logits[:, -1].argmax(-1))
    return torch.stack(toks, 1).tolist()


@torch.no_grad()
def score_against_fp32(hf, ps: list[list[int]], outs: list[list[int]], device) -> dict:
    """Each continuation teacher-forced through HF float32: identical sequences (HF's argmax agrees
    at every step), the mean identical prefix (tokens before the first disagreement: the prefix
    shared with HF float32's own greedy output) and, at each divergence, HF's margin."""
    identical, prefix, divergences = 0, [], []
    for k, (p, got) in enumerate(zip(ps, outs)):
        logits = hf_logits(hf, p + got, device)[len(p) - 1: len(p) - 1 + len(got)]   # [G, V]
        want = logits.argmax(-1).tolist()
        j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is None:
            identical += 1
            prefix.append(len(got))
            continue
        prefix.append(j)
        top = float(logits[j, want[j]])
        margin = top - float(logits[j, got[j]])
        divergences.append({"prompt": k, "step": j, "hf_token": want[j], "graphrt_token": got[j],
                            "top_logit": top, "margin": margin, "margin_bf16_ulps": margin / bf16_ulp(top)})
    return {"identical": identical, "mean_prefix": sum(prefix) / max(len(prefix), 1), "divergences": divergences,
            "max_margin_bf16_ulps": max((d["margin_bf16_ulps"] for d in divergences), default=0.0)}


@torch.no_grad()
def greedy_agreement(path, hf, seqs, device, *, prompts: int, prompt_tokens: int, gen_tokens: int,
                     quantization: str | None = None, reference=None) -> dict:
    """graphrt's greedy continuations and HF bfloat16's own, each scored against HF float32
    (score_against_fp32): a bf16 engine is judged against what bf16 arithmetic itself reaches."""
    from graphrt import LLM, SamplingParams
    ps = prompt_windows(seqs, prompts=prompts, prompt_tokens=prompt_tokens)
    if not ps:
        return {"prompts": 0, "skipped": f"no held-out file has {prompt_tokens + 1} tokens"}
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    llm = LLM(str(path), device=str(device), max_batch=16 if cuda else 4,
              max_model_len=prompt_tokens + gen_tokens + 8, quantization=quantization)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = llm.generate(ps, SamplingParams(max_tokens=gen_tokens, temperature=0.0, ignore_eos=True))
    gen_s = time.perf_counter() - t0
    llm.engine.shutdown()
    llm.shutdown()
    del llm
    got = [list(o.token_ids) for o in outs]
    res = {"prompts": len(ps), "files": min(len(ps), sum(len(s) >= prompt_tokens + 1 for s in seqs)),
           "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens}
    res |= score_against_fp32(hf, ps, got, device)
    from transformers import AutoModelForCausalLM
    hf16 = AutoModelForCausalLM.from_pretrained(str(reference or path), dtype=torch.bfloat16).to(device).eval()
    ref16 = hf_greedy(hf16, ps, gen_tokens, device)
    del hf16
    res["hf_bf16"] = score_against_fp32(hf, ps, ref16, device)
    res["graphrt_vs_hf_bf16_identical"] = sum(a == b for a, b in zip(got, ref16))
    res |= {"llm_load_s": round(load_s, 2), "generate_s": round(gen_s, 2)}
    return res


def ppl(nll: torch.Tensor) -> float:
    return math.exp(float(nll.mean()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--max-files", type=int, default=None, help="held-out files (default 64 CUDA, 4 CPU)")
    p.add_argument("--window", type=int, default=None, help="tokens per file (default 512 CUDA, 48 CPU)")
    p.add_argument("--decode-tokens", type=int, default=None, help="teacher-forced decode steps + 1 "
                   "(default 128 CUDA, 8 CPU; 0: skip)")
    p.add_argument("--prompts", type=int, default=None, help="greedy prompts (default 64 CUDA, 2 CPU; 0: skip)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=None, help="greedy tokens (default 64 CUDA, 8 CPU)")
    p.add_argument("--rows", type=int, default=None, help="graphrt batch rows (default 16 CUDA, 4 CPU)")
    p.add_argument("--chunk-tokens", type=int, default=4096, help="prefill chunk size")
    p.add_argument("--agree-with", default=None, help="a target checkpoint: top-1 agreement + ppl ratio")
    p.add_argument("--quantization", default=None, choices=["fp8", "int4"],
                   help="graphrt quantizes the float checkpoint while loading (HF stays float32)")
    p.add_argument("--reference", default=None, help="HF float weights from this directory (default: CHECKPOINT)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    d = lambda v, g, c: v if v is not None else (g if cuda else c)  # noqa: E731
    a.max_files, a.window = d(a.max_files, 64, 4), d(a.window, 512, 48)
    a.decode_tokens, a.prompts = d(a.decode_tokens, 128, 8), d(a.prompts, 64, 2)
    a.gen_tokens, a.rows = d(a.gen_tokens, 64, 8), d(a.rows, 16, 4)
    for name in ("max_files", "window", "rows", "chunk_tokens", "prompt_tokens", "gen_tokens"):
        if getattr(a, name) < 1:
            print(f"eval_ppl: --{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}", file=sys.stderr)
            return 2
    if a.decode_tokens < 0 or a.prompts < 0 or a.window < MIN_FILE_TOKENS:
        print(f"eval_ppl: --decode-tokens/--prompts must be >= 0 and --window >= {MIN_FILE_TOKENS}", file=sys.stderr)
        return 2
    if a.prompts and a.window <= a.prompt_tokens:
        print(f"eval_ppl: --window {a.window} must exceed --prompt-tokens {a.prompt_tokens} (prompts are "
              f"cut from the held-out windows)", file=sys.stderr)
        return 2
    if cuda and not torch.cuda.is_available():
        print("eval_ppl: --device cuda but CUDA is not available; use --device cpu", file=sys.stderr)
        return 2
    ckpt = Path(a.checkpoint)
    for c in [ckpt] + [Path(x) for x in (a.agree_with, a.reference) if x]:
        if not (c / "config.json").is_file():
            print(f"eval_ppl: {c}: not a checkpoint directory (no config.json)", file=sys.stderr)
            return 2
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported (graphrt's kernels)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False    # the HF reference is true float32; restored on return
    try:
        return _evaluate(a, ckpt, cuda)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _evaluate(a, ckpt: Path, cuda: bool) -> int:
    from transformers import AutoTokenizer
    device = torch.device(a.device)
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    seqs = heldout_sequences(tok, max_files=a.max_files, window=a.window)
    res = {"checkpoint": str(ckpt), "device": a.device, "graphrt_dtype": "bfloat16" if cuda else "float32",
           "files": len(seqs), "window": a.window, "tokens_scored": sum(len(s) - 1 for s in seqs)}
    t0 = time.perf_counter()
    hf = hf_model(a.reference or ckpt, device)
    res["reference"] = a.reference
    res["params"] = sum(p.numel() for p in hf.parameters())
    res["arch"] = hf.config.model_type
    hf_nll = [nll_rows(hf_logits(hf, s, device)[:-1], torch.tensor(s[1:], device=device)) for s in seqs]
    res["hf_fp32_ppl"] = ppl(torch.cat(hf_nll))
    res["hf_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    res["quantization"] = a.quantization
    model, mrt = graphrt_runtime(ckpt, device, rows=a.rows, context=max(a.window, a.decode_tokens + 1),
                                 quantization=a.quantization)
    gr_nll = graphrt_prefill_nll(model, mrt, seqs, chunk_tokens=a.chunk_tokens)
    res["graphrt_prefill_ppl"] = ppl(torch.cat(gr_nll))
    res["prefill_ratio"] = res["graphrt_prefill_ppl"] / res["hf_fp32_ppl"]
    res["prefill_s"] = round(time.perf_counter() - t0, 2)
    long = [i for i, s in enumerate(seqs) if len(s) > a.decode_tokens]
    if a.decode_tokens >= 2 and long:
        t0 = time.perf_counter()
        mrt.capture()
        dec = graphrt_decode_nll(mrt, [seqs[i] for i in long], a.decode_tokens)       # [S, N - 1]
        ref = torch.stack([hf_nll[i][1: a.decode_tokens] for i in long])          # same targets
        res["decode"] = {"files": len(long), "tokens": a.decode_tokens, "graphs": mrt.uses_graphs,
                         "graphrt_decode_ppl": ppl(dec), "hf_fp32_ppl": ppl(ref),
                         "graphrt_prefill_ppl": ppl(torch.stack([gr_nll[i][1: a.decode_tokens] for i in long])),
                         "s": round(time.perf_counter() - t0, 2)}
        res["decode"]["ratio"] = res["decode"]["graphrt_decode_ppl"] / res["decode"]["hf_fp32_ppl"]
    del mrt, model
    if a.prompts:
        res["greedy"] = greedy_agreement(ckpt, hf, seqs, device, prompts=a.prompts,
                                         prompt_tokens=a.prompt_tokens, gen_tokens=a.gen_tokens,
                                         quantization=a.quantization, reference=a.reference)
    if a.agree_with:
        other = hf_model(a.agree_with, device)
        same = total = 0
        o_nll = []
        for s in seqs:
            mine, theirs = hf_logits(hf, s, device), hf_logits(other, s, device)
            same += int((mine.argmax(-1) == theirs.argmax(-1)).sum())
            total += len(s)
            o_nll.append(nll_rows(theirs[:-1], torch.tensor(s[1:], device=device)))
        res["agree_with"] = {"target": a.agree_with, "top1_agreement": same / total, "positions": total,
                             "target_hf_fp32_ppl": ppl(torch.cat(o_nll)),
                             "ppl_ratio_self_over_target": res["hf_fp32_ppl"] / ppl(torch.cat(o_nll))}
    report(res)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
        print(f"wrote {a.json}")
    return 0


def report(r: dict) -> None:
    print(f"{r['checkpoint']} ({r['arch']}, {r['params'] / 1e6:.2f} M params): {r['files']} held-out files, "
          f"{r['tokens_scored']} tokens, window {r['window']}"
          + (f", graphrt weights quantization={r['quantization']}" if r.get("quantization") else ""))
    print(f"  perplexity  HF float32 {r['hf_fp32_ppl']:.4f} | graphrt {r['graphrt_dtype']} prefill "
          f"{r['graphrt_prefill_ppl']:.4f} | ratio {r['prefill_ratio']:.5f}")
    if "decode" in r:
        x = r["decode"]
        print(f"  decode (first {x['tokens']} tokens of {x['files']} files, graphs={x['graphs']}): HF float32 "
              f"{x['hf_fp32_ppl']:.4f} | graphrt decode {x['graphrt_decode_ppl']:.4f} | ratio {x['ratio']:.5f}")
    if "greedy" in r and r["greedy"]["prompts"]:
        g = r["greedy"]
        h = g["hf_bf16"]
        print(f"  greedy ({g['prompts']} prompts from {g['files']} files, {g['gen_tokens']} tokens) vs HF float32: "
              f"graphrt {g['identical']} identical, mean identical prefix {g['mean_prefix']:.1f}, max "
              f"divergence margin {g['max_margin_bf16_ulps']:.2f} bf16 ulps | HF bfloat16 {h['identical']} "
              f"identical, prefix {h['mean_prefix']:.1f}, max margin {h['max_margin_bf16_ulps']:.2f} ulps | "
              f"graphrt = HF bfloat16: {g['graphrt_vs_hf_bf16_identical']}")
        for dv in g["divergences"]:
            print(f"    prompt {dv['prompt']} step {dv['step']}: HF {dv['hf_token']} graphrt {dv['graphrt_token']} "
                  f"margin {dv['margin']:.4g} ({dv['margin_bf16_ulps']:.2f} ulps of {dv['top_logit']:.3f})")
    if "agree_with" in r:
        x = r["agree_with"]
        print(f"  vs {x['target']}: top-1 agreement {x['top1_agreement']:.4f} over {x['positions']} positions; "
              f"ppl {r['hf_fp32_ppl']:.3f} vs {x['target_hf_fp32_ppl']:.3f} (ratio {x['ppl_ratio_self_over_target']:.3f})")


if __name__ == "__main__":
    sys.exit(main())
