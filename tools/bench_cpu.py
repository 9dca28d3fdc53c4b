"""graphrt on a CPU against HF transformers on the same cores, side by side in one process.

    python tools/bench_cpu.py [--model DIR] [--threads 2] [--tokens 32] [--prompt-len 16]
                              [--repeats 5] [--kernels torch|triton] [--out OUT.json]

Without --model a random float32 checkpoint of SmolLM2-135M's geometry (30 layers, 9 query / 3
KV heads of 64, hidden 576, vocab 49152, tied embeddings; tools/make_checkpoint.py's
`smollm2-135m` shape) is written to a temporary directory. Both engines load it in float32 and
decode greedily from the same prompt; each repeat runs HF, then graphrt (alternating, so load
from other processes on a shared machine falls on both), and the medians are reported:

  ms / token   decode time per generated token after the first: (t(N tokens) - t(1 token)) /
               (N - 1), each t a whole generate call (prompt and first token included in both,
               so they cancel)
  first (ms)   a generate call of 1 token (prefill + first token)
  ratio        graphrt / HF per token (the target on a CPU: <= 1.5)

HF: `model.generate(ids, max_new_tokens=N, do_sample=False)` with its dynamic KV cache. graphrt:
`LLM(dir, device="cpu", max_model_len=..., max_batch=1)` and `llm.generate(ids, max_tokens=N,
temperature=0, ignore_eos=True)`. Prints a table and writes JSON (--out).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a HF checkpoint directory (default: a random SmolLM2-135M shape)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads for both (default 2)")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per call (>= 2)")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens")
    p.add_argument("--repeats", type=int, default=5, help="alternating repeats (medians)")
    p.add_argument("--kernels", default=None, choices=["torch", "triton"], help="graphrt's kernel set (default: torch)")
    p.add_argument("--out", default=None, help="write the results here (JSON)")
    a = p.parse_args(argv)
    for name in ("threads", "tokens", "prompt_len", "repeats"):
        v = getattr(a, name)
        if v < (2 if name == "tokens" else 1):
            p.error(f"--{name.replace('_', '-')}: must be >= {2 if name == 'tokens' else 1}, got {v}")
    torch.set_num_threads(a.threads)
    tmp = None
    model_dir = a.model
    if model_dir is None:
        from make_checkpoint import write_checkpoint
        tmp = tempfile.TemporaryDirectory(prefix="graphrt-bench-cpu-")
        model_dir = str(write_checkpoint(Path(tmp.name) / "smollm2-135m", "smollm2-135m", dtype="float32",
                                         tokenizer_vocab=4096))

    from graphrt import LLM, SamplingParams
    t0 = time.perf_counter()                       # graphrt first: it picks Triton's mode before
    llm = LLM(model_dir, device="cpu", max_model_len=a.prompt_len + a.tokens + 16, max_batch=1,
              kernels=a.kernels)                   # transformers imports Triton
    start_s = time.perf_counter() - t0
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, min(hf.config.vocab_size, 4000), (a.prompt_len,), generator=g).tolist()
    ids = torch.tensor([prompt])

    def hf_gen(n):
        with torch.inference_mode():
            return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()

    def rt_gen(n):
        return llm.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0].token_ids

    same = hf_gen(a.tokens) == list(rt_gen(a.tokens))                 # warm-up, and the tokens agree?
    rows = {"hf": {"first": [], "full": []}, "graphrt": {"first": [], "full": []}}
    for _ in range(a.repeats):
        for name, fn in (("hf", hf_gen), ("graphrt", rt_gen)):
            rows[name]["first"].append(_timed(lambda: fn(1)))
            rows[name]["full"].append(_timed(lambda: fn(a.tokens)))
    out = {"model": a.model or "random smollm2-135m shape (float32)", "threads": a.threads, "tokens": a.tokens,
           "prompt_len": a.prompt_len, "repeats": a.repeats, "kernels": llm.runtime.caps.kernels,
           "graphrt_start_s": round(start_s, 2), "greedy_tokens_equal": same, "torch": torch.__version__}
    for name, r in rows.items():
        per_tok = [(f - s) / (a.tokens - 1) for f, s in zip(r["full"], r["first"])]
        out[name] = {"ms_per_token": round(1e3 * statistics.median(per_tok), 2),
                     "first_ms": round(1e3 * statistics.median(r["first"]), 1),
                     "call_ms": round(1e3 * statistics.median(r["full"]), 1)}
    out["ratio"] = round(out["graphrt"]["ms_per_token"] / out["hf"]["ms_per_token"], 3)
    print(f"| engine | ms / token | first (ms) | {a.tokens}-token call (ms) |")
    print("|---|---|---|---|")
    for name in ("hf", "graphrt"):
        o = out[name]
        print(f"| {name} | {o['ms_per_token']} | {o['first_ms']} | {o['call_ms']} |")
    print(f"graphrt / HF per token: {out['ratio']}x ({a.threads} threads, kernels {out['kernels']}, "
          f"greedy tokens equal: {same}, graphrt start {out['graphrt_start_s']} s)")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))
    llm.shutdown()
    if tmp is not None:
        tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
