"""Where the engine's host time goes around the graphs: cProfile over LLM.generate on a GPU.

A short-step model (the Llama-3.2-1B shape cut to --layers layers, random bf16 weights, written by
tools/make_checkpoint.py) makes the host loop the bottleneck, which is what this looks at:
per configuration (speculation none / ngram, bs 1 and 4) the wall time per generated token, the
device time per token the executor measures for the same graphs, and the top host functions by
own time (tottime) and by cumulative time, restricted to graphrt's modules. Then a repeated
prompt under the prefix cache: its TTFT and the host functions of that prefill, and the same
TTFT with the engine on its own thread at the default and a short GIL switch interval.

    python tools/device/profile_engine.py --out $OUT/profile_engine.txt
    python tools/device/profile_engine.py --device cpu --layers 1 --tokens 8   # CPU smoke (numbers mean nothing)
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))


def _top(prof: cProfile.Profile, key: str, rows: int) -> str:
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats(key).print_stats("graphrt", rows)
    return "\n".join(line for line in s.getvalue().splitlines() if line.strip())


def model_args(ap: argparse.ArgumentParser, tokens: int) -> None:
    """The model options both engine profilers take (--model, --device, --layers, --tokens)."""
    ap.add_argument("--model", help="a checkpoint directory (default: write one)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=tokens)


def short_step_model(a, tmp: str) -> Path:
    """--model, or a Llama-3.2-1B-shape checkpoint (tiny on CPU) of --layers layers written in tmp."""
    if a.model:
        return Path(a.model)
    from make_checkpoint import write_checkpoint
    shape = "llama-3.2-1b" if a.device == "cuda" else "tiny"
    return write_checkpoint(Path(tmp) / "ck", shape, num_layers=a.layers)


def decode_llm(path: Path, device: str, spec: str, bs: int):
    """(LLM, bs prompts of 128 ids) for a decode profile; spec: none, ngram, draft=DIR or eagle3=DIR."""
    from graphrt import LLM
    method, _, model = spec.partition("=")        # none, ngram, draft=DIR or eagle3=DIR
    kw = {} if method == "none" else {"speculative": {"method": method, "num_tokens": 4,
                                                      **({"model": model} if model else {})}}
    llm = LLM(str(path), device=device, max_batch=max(4, bs),
              max_model_len=1024 if device == "cuda" else 256, **kw)
    return llm, [[(7 * i + 3 * j) % 300 + 10 for j in range(64)] * 2 for i in range(bs)]


def profile_decode(path: Path, device: str, spec: str, bs: int, tokens: int, rows: int, log) -> None:
    from graphrt import SamplingParams
    llm, prompts = decode_llm(path, device, spec, bs)
    try:
        p = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)   # warm-up
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        outs = llm.generate(prompts, p, use_tqdm=False)
        prof.disable()
        wall = time.perf_counter() - t0
        n = sum(len(o.token_ids) for o in outs)
        st = llm.engine.stats()
        log(f"\n=== decode spec={spec} bs={bs}: {n} tokens in {wall * 1e3:.1f} ms wall = "
            f"{wall * 1e6 / (n / bs):.0f} us per token per stream; blocks spec {st.get('spec_blocks')} "
            f"plain {st.get('spec_plain_blocks')} ===")
        ex = llm.runtime
        if hasattr(ex, "measure_costs") and spec != "none":
            c = ex.measure_costs()
            if c is not None:
                log(f"graph costs: decode_us {dict(c.decode_us)} round_us {dict(c.verify_us)}")
        log(_top(prof, "tottime", rows))
        log(_top(prof, "cumulative", rows))
    finally:
        llm.shutdown()


def profile_prefix(path: Path, device: str, rows: int, log, prefix_len: int = 4096) -> None:
    from graphrt import LLM, SamplingParams
    llm = LLM(str(path), device=device, max_batch=4, max_model_len=prefix_len + 64, enable_prefix_caching=True)
    try:
        prefix = [(11 * j) % 300 + 10 for j in range(prefix_len)]
        one = SamplingParams(max_tokens=1, ignore_eos=True)
        llm.generate([prefix + [5, 6, 7]], one, use_tqdm=False)                  # cold: fills the cache
        for i in range(2):                                                       # warm the cached path
            llm.generate([prefix + [8 + i, 9]], one, use_tqdm=False)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        out = llm.generate([prefix + [40, 41, 42]], one, use_tqdm=False)[0]
        prof.disable()
        log(f"\n=== repeated {prefix_len}-token prefix, 1 token: {(time.perf_counter() - t0) * 1e3:.1f} ms, cached "
            f"{getattr(out, 'num_cached_tokens', None)} ===")
        log(_top(prof, "tottime", rows))
        log(_top(prof, "cumulative", rows))
        eng = llm.engine                                 # the same TTFT with the engine on its thread
        eng.start()
        for interval in (sys.getswitchinterval(), 1e-4):
            old, ttft = sys.getswitchinterval(), []
            sys.setswitchinterval(interval)
            try:
                for i in range(5):
                    t0 = time.perf_counter()
                    next(iter(eng.add_request(prefix + [50 + i, 51], one)))
                    ttft.append((time.perf_counter() - t0) * 1e3)
            finally:
                sys.setswitchinterval(old)
            log(f"threaded engine, switch interval {interval * 1e3:.2f} ms: repeated TTFT ms "
                f"{', '.join(f'{x:.1f}' for x in ttft)}")
    finally:
        llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(ap, 128)
    ap.add_argument("--rows", type=int, default=22)
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args()
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)
    with tempfile.TemporaryDirectory() as tmp:
        path = short_step_model(a, tmp)
        for spec in ("none", "ngram"):
            for bs in (1, 4):
                profile_decode(path, a.device, spec, bs, a.tokens, a.rows, log)
        profile_prefix(path, a.device, a.rows, log, prefix_len=4096 if a.device == "cuda" else 128)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
