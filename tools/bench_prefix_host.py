"""Host time from add_request to the first token of a prompt whose prefix is cached, over a stub
executor (tools/bench_engine_host.py's StubExecutor: no device work, so every µs is host time).

    python tools/bench_prefix_host.py --out /tmp/after.json                      # this tree
    PYTHONPATH=/work/main python tools/bench_prefix_host.py --out /tmp/before.json   # another tree
    python tools/bench_prefix_host.py --profile cached                           # cProfile of one case

Cases (--prefix-len P, --suffix-len S new tokens; every prompt starts with a token no other
prompt used, so only the prefix meant to be shared is found cached):
  new          S tokens, nothing cached (the same new tokens, no prefix)
  cached       P shared tokens (cached by a warm-up request) + S new: P tokens found cached
  cold         P + S tokens, cache on, nothing cached (each prompt's pages then enter the cache)
  cold_nocache P + S tokens, cache off
Per case: first_us, wall µs from add_request to the first delta with a token, the engine stepped
on the caller's thread (as Reader.run in bench_engine_host.calls), greedy, --max-tokens per
request (the rest drained after the first token, outside the timing); the cases alternate in
every round; median over --rounds. cached_tokens: the first delta's num_cached_tokens. These
are CPU host figures of the engine alone (no ModelRuntime: its prefill checks and graph staging
are not in them), not a GPU TTFT.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))   # the repository (graphrt) without an install

CASES = ("new", "cached", "cold", "cold_nocache")


def _engine(tok, ids, *, cache: bool, context: int, max_batch: int):
    from bench_engine_host import StubExecutor
    from graphrt.engine.engine import Engine
    ex = StubExecutor(max_batch=max_batch, k_steps=4, method=None, spec_k=4, rounds=4, context=context,
                      page_size=16, text_ids=ids, vocab=len(tok))
    return Engine(ex, tok, eos_token_ids=(), max_model_len=context, overlap=True, seed=0,
                  enable_prefix_caching=cache)


class Prompts:
    """Token-id prompts [len] of ints in [3, vocab - 1): a fresh head token per prompt (ids counted
    down from vocab - 1: no two prompts share a page key), a shared prefix, suffixes."""

    def __init__(self, vocab: int, prefix_len: int, suffix_len: int):
        self.vocab, self.n, self.s, self.next_head = vocab, prefix_len, suffix_len, vocab - 1
        self.prefix = self._body(1, prefix_len)

    def _body(self, seed: int, n: int) -> list[int]:
        return [(7919 * seed + 13 * j + j * j) % (self.vocab - 64) + 3 for j in range(n)]

    def head(self) -> list[int]:
        self.next_head -= 1
        if self.next_head < self.vocab - 60:
            self.next_head = self.vocab - 1            # heads recycle: only after many prompts
        return [self.next_head]

    def case(self, name: str, i: int) -> list[int]:
        suffix = self._body(1000 + i, self.s)
        if name == "new":
            return self.head() + suffix[1:]
        if name == "cached":
            return self.prefix + suffix
        return self.head() + self._body(5000 + i, self.n - 1) + suffix


def first_us(eng, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """(µs from add_request to the first delta with a token, its num_cached_tokens); drains the rest."""
    from graphrt import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    stream = eng.add_request(prompt, params)
    it = iter(stream)
    for d in it:
        if d.token_ids:
            us, cached = (time.perf_counter() - t0) * 1e6, d.num_cached_tokens
            break
    for _ in it:
        pass
    return us, cached


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix-len", type=int, default=4096)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=8, help="the stub's slots (the pool: max_batch full contexts)")
    p.add_argument("--cases", default=",".join(CASES), help="a subset of " + ",".join(CASES))
    p.add_argument("--profile", choices=CASES, default=None, help="cProfile --rounds requests of this case")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    cases = a.cases.split(",")
    if a.prefix_len < 16 or a.suffix_len < 1 or a.rounds < 1 or not set(cases) <= set(CASES):
        p.error(f"--prefix-len >= 16, --suffix-len >= 1, --rounds >= 1, --cases among {CASES}")
    torch.set_num_threads(1)
    import graphrt
    from bench_engine_host import _tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tok, ids = _tokenizer(Path(tmp))
    context = a.prefix_len + a.suffix_len + a.max_tokens + 64
    on = _engine(tok, ids, cache=True, context=context, max_batch=a.max_batch)
    off = _engine(tok, ids, cache=False, context=context, max_batch=a.max_batch)
    prompts = Prompts(len(tok), a.prefix_len, a.suffix_len)
    first_us(on, prompts.prefix + [5], a.max_tokens)           # the shared prefix into the cache
    eng_of = {"new": on, "cached": on, "cold": on, "cold_nocache": off}
    if a.profile:
        for i in range(a.warmup):
            first_us(eng_of[a.profile], prompts.case(a.profile, i), a.max_tokens)
        prof = cProfile.Profile()
        for i in range(a.rounds):
            prompt = prompts.case(a.profile, a.warmup + i)
            prof.enable()
            first_us(eng_of[a.profile], prompt, a.max_tokens)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    times = {c: [] for c in cases}
    cached = {c: set() for c in cases}
    for r in range(a.warmup + a.rounds):
        for c in cases:
            us, n = first_us(eng_of[c], prompts.case(c, r), a.max_tokens)
            if r >= a.warmup:
                times[c].append(us)
                cached[c].add(n)
    print(f"engine from {Path(graphrt.__file__).parent}; prefix {a.prefix_len} + suffix {a.suffix_len} tokens")
    rows = []
    for c in cases:
        ts = sorted(times[c])
        row = {"case": c, "first_us": statistics.median(ts), "p10_us": ts[len(ts) // 10],
               "p90_us": ts[(9 * len(ts)) // 10], "cached_tokens": sorted(cached[c])}
        rows.append(row)
        print(f"{c:13} first_us {row['first_us']:9.1f}  (p10 {row['p10_us']:.1f}, p90 {row['p90_us']:.1f})"
              f"  cached {row['cached_tokens']}")
    if a.out:
        Path(a.out).write_text(json.dumps({
            "what": "host µs from add_request to the first token over a stub executor (CPU; "
                    "tools/bench_prefix_host.py), not a GPU TTFT",
            "engine": str(Path(graphrt.__file__).parent), "argv": sys.argv[1:], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
