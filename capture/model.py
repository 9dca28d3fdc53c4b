"""graphrt-capture --model CKPT --out DIR: the graph cache `graphrt serve --graph-cache DIR` starts from.

The engine is built exactly as `graphrt serve` builds it (its flag parser, resolve_configs and
load, with the engine flags given here forwarded), with Triton's cache and FlashInfer's JIT
workspace pointed at DIR (graphrt/cache/load.py compilers_at). Building it captures the decode
and prefill graphs (on CUDA), which compiles their kernels; then `warm_requests` runs what a
server runs besides: greedy and sampled decoding (with and without top-k / top-p), logits
processing (penalties, logit bias, min_tokens, min_p) with log-probabilities, prompt
log-probabilities (eager prefill), a prefix-cache hit, a long prompt in prefill chunks, n = 2, and
each request alone as well as all at once. Every kernel compiled meanwhile lands in DIR; then the
manifest records each file's sha256, what the cache was built for (graphrt/serve/cache_pin.py
built_for: the checkpoint's config.json, the engine settings, and the versions and GPU) and the
decode plans the capture measured (split-K, K: graphrt/model/plans.py), which a warm start takes.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

# capture flag -> graphrt serve flag: the engine settings that decide which kernels and graphs exist
SERVE_FLAGS = {"engine_config": "--config", "max_model_len": "--max-model-len", "max_num_seqs": "--max-num-seqs",
               "dtype": "--dtype", "kv_cache_dtype": "--kv-cache-dtype", "quantization": "--quantization",
               "speculative_method": "--speculative-method", "draft_model": "--draft-model",
               "num_speculative_tokens": "--num-speculative-tokens", "mixed_prefill_tokens": "--mixed-prefill-tokens",
               "steps_per_graph": "--steps-per-graph", "revision": "--revision"}


def serve_args(args, device: str):
    """graphrt serve's parsed arguments for the model and engine flags given to graphrt-capture."""
    from graphrt.serve.cli import build_parser
    argv = ["--model", args.model, "--stats-interval", "0"]
    if device != "auto":
        argv += ["--device", device.split(":")[0]]
    for name, flag in SERVE_FLAGS.items():
        value = getattr(args, name, None)
        if value is not None:
            argv += [flag, str(value)]
    return build_parser("graphrt-capture --model").parse_args(argv)


def warm_requests(*, vocab: int, max_model_len: int, steps: int, prefill_tokens: int):
    """[(prompt token ids, SamplingParams)]: one request per path a server runs outside the
    captured graphs or through a graph family of its own. Prompts are token ids in [3, vocab)
    (no tokenizer needed); ignore_eos keeps every request to its max_tokens."""
    from graphrt.engine.params import SamplingParams

    def ids(n: int, seed: int) -> list[int]:
        return [3 + (seed * 7919 + i * 104729) % (vocab - 3) for i in range(n)]

    new = steps + 1                                     # two blocks: a block boundary inside
    short = min(9, max_model_len - new - 1)
    long = max(short, min(max_model_len - new - 1, prefill_tokens + 5))
    base = dict(max_tokens=new, ignore_eos=True)
    return [
        (ids(short, 1), SamplingParams(temperature=0.0, **base)),                              # greedy
        (ids(short, 2), SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1, **base)),  # filtered
        (ids(short, 3), SamplingParams(temperature=0.7, seed=2, **base)),                      # sampled
        (ids(short, 4), SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3,
                                       repetition_penalty=1.1, logit_bias={5: 1.0}, min_tokens=2,
                                       logprobs=5, **base)),                                   # processed
        (ids(short, 5), SamplingParams(temperature=0.9, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                                       logprobs=2, seed=3, **base)),                           # + filtered
        (ids(min(17, long), 6), SamplingParams(temperature=0.0, prompt_logprobs=3, **base)),   # eager prefill
        (ids(min(16, long), 7), SamplingParams(temperature=0.0, prompt_logprobs=1, **base)),
        (ids(short, 1), SamplingParams(temperature=0.0, **base)),                              # prefix hit
        (ids(long, 8), SamplingParams(temperature=0.0, **base)),                               # prefill chunks
        (ids(short, 9), SamplingParams(temperature=0.8, n=2, seed=4, **base)),                 # n = 2
    ]


def warm(llm) -> tuple[int, int, float]:
    """Run warm_requests alone, then all at once -> (requests, tokens, seconds)."""
    reqs = warm_requests(vocab=llm.checkpoint.spec.vocab_size, max_model_len=llm.engine.max_model_len,
                         steps=llm.config.steps_per_graph, prefill_tokens=llm.config.prefill_graph_tokens)
    t0, tokens = time.perf_counter(), 0
    for prompt, params in reqs:
        tokens += sum(len(o.token_ids) for o in llm.generate([prompt], params, use_tqdm=False)[0].outputs)
    outs = llm.generate([p for p, _ in reqs], [s for _, s in reqs], use_tqdm=False)
    tokens += sum(len(o.token_ids) for out in outs for o in out.outputs)
    return 2 * len(reqs), tokens, time.perf_counter() - t0


def capture_model(args, device: str, out: Path) -> int:
    """Build the server's engine into `out` (new or empty), warm it, write the manifest; exit status."""
    from graphrt.cache.load import CacheMismatchError, compilers_at, write_cache_manifest
    from graphrt.serve.cache_pin import built_for
    from graphrt.serve.cli import load, resolve_configs
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="graphrt-capture: %(message)s")
    sargs = serve_args(args, device)
    try:
        engine_cfg, _ = resolve_configs(sargs)          # the flags and --engine-config, validated
        with compilers_at(out):                         # every kernel compiled below lands in out
            llm, _ = load(sargs)
            try:
                n, tokens, warm_s = warm(llm)
            finally:
                llm.shutdown()
    except (ValueError, ImportError, CacheMismatchError) as e:   # bad flag, config, checkpoint: one line
        lines = [line.strip().removeprefix("- ") for line in str(e).splitlines() if line.strip()]
        print(f"graphrt-capture: {'; '.join(lines)}", file=sys.stderr)
        return 2
    print(f"graphrt-capture: warm requests: {n} requests, {tokens} tokens in {warm_s:.2f} s")
    rc, startup = llm.runtime.caps.config, llm.startup
    rows = [{"bucket": b, "backend": rc.backend, "backend_name": rc.backend} for b in rc.buckets]
    record = built_for(llm.checkpoint.path, engine_cfg, llm.runtime.caps.device.type,
                       quantization=sargs.quantization, tensor_parallel=1)
    plans = llm.runtime.runtime.measured_plans()      # split-K, K: a warm start measures neither
    write_cache_manifest(out, rc, rows, mode="CUDA graphs" if startup.num_graphs else "eager",
                         built_for=record, plans=plans)
    return 0


def serve_hint(args, out: Path) -> str:
    """The serve command line that starts from this cache (the same engine flags)."""
    flags = " ".join(f"{SERVE_FLAGS[k]} {getattr(args, k)}" for k in SERVE_FLAGS if getattr(args, k, None) is not None)
    return (f"serve it: graphrt serve {args.model} --graph-cache {out} --expect-digest <the manifest sha256 "
            f"above>" + (f" {flags}" if flags else ""))


__all__ = ["capture_model", "serve_args", "serve_hint", "warm_requests", "warm", "SERVE_FLAGS"]
