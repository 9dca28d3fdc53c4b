"""Prefix caching and chunked prefill through the engine (graphrt.LLM, no HTTP): three workloads.

    python tools/bench_prefix.py --make llama-3.2-1b --device cuda --out-dir docs/results   # H200
    python tools/bench_prefix.py --make tiny --device cpu --prefix-len 24 --suffix-len 4 \
        --streams 2 --long-len 32 --decode-tokens 12 --turns 2 --repeats 2 --max-model-len 128 --answer-tokens 8 \
        --out-dir /tmp/b                                                               # CPU smoke
    python tools/bench_prefix.py --model TARGET --speculative '{"method": "eagle3", "model": "HEAD",
        "num_tokens": 4}' --workloads prefix,chat     # the same rows under speculation (+ acceptance)

Every workload call starts its prompts with a token no other call used (no call reuses another's
cached pages). 1. shared prefix: after a short warm-up request, a --prefix-len prompt prefix +
   --suffix-len distinct tokens, one request at a time: TTFT of the first request (cold), then of --repeats more with other suffixes
   (repeated), with the prefix cache on and off; repeated / cold is the reuse.
2. arrival: --streams requests decoding (ignore_eos, --decode-tokens each) for --steady-tokens
   tokens each (the steady state: TPOT p50 and the p50 gap between deltas, a K-step block's
   worth of tokens each), then a --long-len prompt arrives; per running stream, the gaps between
   its deltas divided by the tokens they carry (TPOT) from the arrival until the long request's
   first token: p50 / p99 and the largest gap, each also over the steady state's p50 (TPOT's,
   and the steady gap's for the largest gap); the join gap (median over the streams of the gap of
   the delta nearest the long prompt's first token: the block it joins in) and the largest other
   gap. --arrival-repeats N runs each row N times in the process. Rows: paced (max_prefill_stall = --stall, or each
   of --stalls, capped at --chunk), then unpaced with max_num_batched_tokens = --chunk and without a limit (None);
   with --mixed C first a row where decode blocks carry the prompt's chunks of C tokens
   (EngineConfig.mixed_prefill_tokens: every piece rides a block, whatever the pacer's budget).
3. multi-turn chat: --turns turns, each prompt = the previous prompt + its answer + a new user
   message (token ids, so the previous turn's pages are reusable): TTFT per turn, cache on / off.

One LLM (prefix cache on, chunk budget --chunk) and a second engine over its runtime without
the cache. Times are host wall clock (time.perf_counter) at the delta's arrival on a reader thread; the
engine runs on its own thread (engine.start()). Writes NAME.json and NAME.md (tables) under
--out-dir.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import k_or_auto  # noqa: E402


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


class Reader(threading.Thread):
    """Reads one stream on its own thread: (arrival time, tokens) per delta."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.t0, self.deltas, self.out, self.tokens = stream, time.perf_counter(), [], None, []

    def run(self):
        for d in self.stream:
            self.deltas.append((time.perf_counter(), len(d.token_ids)))
            self.tokens += d.token_ids
            self.out = d

    @property
    def ttft_ms(self) -> float:
        return (next(t for t, n in self.deltas if n) - self.t0) * 1e3


_CALLS = itertools.count()


def _head(a) -> list[int]:
    """A first token no earlier workload used: every page of the prompt after it hashes anew (the
    prefix cache keys a page by the chain of tokens before it), so no call reuses another's."""
    return [a.vocab - 1 - next(_CALLS)]


def _request(eng, prompt, max_tokens):
    from graphrt import SamplingParams
    r = Reader(eng.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                            ignore_eos=True)))
    r.start()
    return r


def shared_prefix(eng, a) -> dict:
    """eng: a started Engine."""
    _request(eng, _head(a) + [5] * (a.prefix_len + a.suffix_len), 2).join()   # warm-up: every kernel
    #                                   of a long chunked prompt once; cold is then a steady engine's
    base = _head(a) + list(range(100, 99 + a.prefix_len))
    ttft, cached = [], []
    for i in range(a.repeats + 1):
        suffix = [(7 * i + j) % 90 + 5 for j in range(a.suffix_len)]
        r = _request(eng, base + suffix, 2)
        r.join()
        ttft.append(r.ttft_ms)
        cached.append(r.out.num_cached_tokens)
    rep = statistics.median(ttft[1:])
    return {"cold_ttft_ms": ttft[0], "repeated_ttft_ms": rep, "repeated_over_cold": rep / ttft[0],
            "cached_tokens": cached}


def arrival(eng, a) -> dict:
    mixed0 = eng.stats().get("prefill_mixed_chunks") or 0
    running = [_request(eng, [5 + s, 6, 7, 8], a.decode_tokens) for s in range(a.streams)]
    while any(sum(n for _, n in r.deltas) < 2 for r in running):     # every stream decoding
        time.sleep(0.001)
    t_steady = time.perf_counter()
    while any(sum(n for _, n in r.deltas) < a.steady_tokens for r in running):
        time.sleep(0.001)
    t_arr = time.perf_counter()
    late = _request(eng, _head(a) + [(11 * j) % 90 + 5 for j in range(a.long_len - 1)], 2)
    late.join()
    t_first = late.t0 + late.ttft_ms / 1e3
    for r in running:
        r.join()
    tpot, gaps, s_tpot, s_gaps, timeline, join, other = [], [], [], [], [], [], []
    for i, r in enumerate(running):
        prev, window = None, []
        for t, n in r.deltas:
            if prev is not None and n and t_arr <= t <= t_first + 0.05:
                gaps.append((t - prev) * 1e3)
                tpot.append((t - prev) * 1e3 / n)
                window.append((abs(t - t_first), (t - prev) * 1e3))
                if i == 0:                             # one stream's deltas: where the slow ones fall
                    timeline.append([round((t - t_arr) * 1e3, 3), round((t - prev) * 1e3, 3), n])
            elif prev is not None and n and t_steady <= prev and t < t_arr:
                s_gaps.append((t - prev) * 1e3)
                s_tpot.append((t - prev) * 1e3 / n)
            prev = t if n else prev
        if window:                                     # the block the long prompt joins in: its
            at = min(range(len(window)), key=lambda k: window[k][0])   # delta nearest that first token
            join.append(window[at][1])
            other += [g for k, (_, g) in enumerate(window) if k != at]
    eng_stats = eng.stats()
    steady, steady_gap = _pct(s_tpot, 0.5), _pct(s_gaps, 0.5)
    return {"long_ttft_ms": late.ttft_ms, "tpot_p50_ms": _pct(tpot, 0.5), "tpot_p99_ms": _pct(tpot, 0.99),
            "largest_gap_ms": max(gaps) if gaps else float("nan"), "samples": len(tpot),
            "p99_over_p50": _pct(tpot, 0.99) / _pct(tpot, 0.5) if tpot else float("nan"),
            "steady_tpot_p50_ms": steady, "steady_gap_p50_ms": steady_gap, "steady_samples": len(s_tpot),
            "p99_over_steady_p50": _pct(tpot, 0.99) / steady if tpot and s_tpot else float("nan"),
            "gap_over_steady_gap": max(gaps) / steady_gap if gaps and s_gaps else float("nan"),
            "gap_over_steady_p50": max(gaps) / steady if gaps and s_tpot else float("nan"),
            "join_gap_ms": statistics.median(join) if join else float("nan"),
            "largest_other_gap_ms": max(other) if other else float("nan"),
            "prefill_budget_tokens": eng_stats.get("prefill_budget_tokens"),
            "mixed_chunks": (eng_stats.get("prefill_mixed_chunks") or 0) - mixed0,
            "preemptions": eng.scheduler.num_preemptions, "pages_free": eng_stats["pages_free"],
            "timeline_ms": timeline}


def chat(eng, a) -> dict:
    prompt, ttft, cached = _head(a) + [2, 3], [], []
    for turn in range(a.turns):
        prompt = prompt + [(13 * turn + j) % 90 + 5 for j in range(a.suffix_len)]   # the user's message
        r = _request(eng, prompt, a.answer_tokens)
        r.join()
        ttft.append(r.ttft_ms)
        cached.append(r.out.num_cached_tokens)
        prompt = prompt + r.tokens
    return {"ttft_ms": ttft, "cached_tokens": cached, "final_prompt_len": len(prompt)}


def _speculative(text: str) -> dict:
    """--speculative's JSON object (argparse turns the ValueError into exit 2 naming the flag)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _with_spec(eng, fn, *args) -> dict:
    """fn(eng, *args)'s row, plus the engine's speculative counts over it (with speculation)."""
    before = eng.stats()
    row = fn(eng, *args)
    after = eng.stats()
    if "spec_proposed" in after:
        proposed = after["spec_proposed"] - before["spec_proposed"]
        accepted = after["spec_accepted"] - before["spec_accepted"]
        rounds = after["spec_rounds"] - before["spec_rounds"]
        row["spec"] = {"proposed": proposed, "accepted": accepted, "rounds": rounds,
                       "acceptance": accepted / proposed if proposed else float("nan"),
                       "tokens_per_round": (accepted + rounds) / rounds if rounds else float("nan")}
    return row


def _arrivals(res, key, eng, a) -> None:
    """The arrival row `key`, --arrival-repeats times (key, key_run2, ...)."""
    for i in range(a.arrival_repeats):
        res["arrival"][key if i == 0 else f"{key}_run{i + 1}"] = _with_spec(eng, arrival, a)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a checkpoint directory")
    p.add_argument("--make", help="write a random checkpoint of this shape (tools/make_checkpoint.py)")
    p.add_argument("--device", default=None)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--steps-per-graph", type=k_or_auto, default="auto", help="K: an int >= 1 or auto (the default)")
    p.add_argument("--prefix-len", type=int, default=4096)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--long-len", type=int, default=4096)
    p.add_argument("--decode-tokens", type=int, default=512)
    p.add_argument("--chunk", type=int, default=None, help="max_num_batched_tokens (default: EngineConfig's)")
    p.add_argument("--stall", type=float, default=None, help="max_prefill_stall (default: EngineConfig's)")
    p.add_argument("--stalls", type=lambda v: [float(x) for x in v.split(",")], default=None,
                   help="arrival: comma list of max_prefill_stall values, a paced row each (default: --stall)")
    p.add_argument("--steady-tokens", type=int, default=48,
                   help="arrival: tokens each stream decodes before the long prompt (the steady state)")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--answer-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--prefill-modes", default="graphed",
                   help="comma list of graphed (prefill graphs, the default on CUDA) / eager (the same "
                        "runtime with them set aside): each mode's rows side by side")
    p.add_argument("--mixed", type=int, default=0, metavar="C",
                   help="mixed_prefill_tokens: an arrival row `mixed_C` where decode blocks carry the long "
                        "prompt's chunks (the other rows run with it off; 0: no such row)")
    p.add_argument("--arrival-repeats", type=int, default=1, metavar="N",
                   help="arrival: each row N times in this process (the second and later keyed ROW_runI): "
                        "a graph's first replay in the process against its later ones")
    p.add_argument("--workloads", default="prefix,arrival,chat",
                   help="comma-separated subset of prefix, arrival, chat")
    p.add_argument("--out-dir", default="docs/results")
    p.add_argument("--name", default=None)
    p.add_argument("--speculative", type=_speculative, default=None, metavar="JSON",
                   help='speculative decoding, as LLM(speculative=...): e.g. \'{"method": "eagle3", "model": DIR, '
                        '"num_tokens": 4}\' (each workload row then records acceptance)')
    a = p.parse_args(argv)
    if (a.model is None) == (a.make is None):
        p.error("give one of --model DIR or --make SHAPE")
    if a.arrival_repeats < 1:
        p.error(f"--arrival-repeats: must be >= 1, got {a.arrival_repeats}")
    import torch

    import logging

    from graphrt import LLM
    from graphrt.engine.config import EngineConfig
    from graphrt.engine.engine import Engine
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")   # the start-up line
    path = a.model
    if a.make:
        from make_checkpoint import write_checkpoint
        path = write_checkpoint(Path(tempfile.mkdtemp()) / a.make, a.make, dtype="bfloat16"
                                if (a.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
                                else "float32")
    chunk = a.chunk if a.chunk is not None else EngineConfig().max_num_batched_tokens
    stall = a.stall if a.stall is not None else EngineConfig().max_prefill_stall
    llm = LLM(path, device=a.device, max_batch=a.max_batch, steps_per_graph=a.steps_per_graph,
              max_model_len=a.max_model_len, max_num_batched_tokens=chunk,
              max_prefill_stall=stall, mixed_prefill_tokens=a.mixed,              # prefix cache on
              **({"speculative": a.speculative} if a.speculative else {}))
    stall = llm.config.max_prefill_stall                  # as the engine runs it ("auto" resolved for K)
    work = set(a.workloads.split(","))
    if not work <= {"prefix", "arrival", "chat"}:
        p.error(f"--workloads: {a.workloads!r} is not a subset of prefix,arrival,chat")
    a.vocab = llm.checkpoint.spec.vocab_size            # _head's ids count down from its top
    res = {"model": str(a.make or a.model), "args": vars(a), "startup_s": round(llm.startup.total_s, 2),
           "shared_prefix": {}, "arrival": {}, "chat": {}}
    cached = llm.engine
    plain = Engine(llm.runtime, llm.tokenizer, eos_token_ids=tuple(cached.scheduler.eos),   # same runtime
                   max_model_len=cached.max_model_len, enable_prefix_caching=False, max_num_batched_tokens=chunk)
    mrt = llm.runtime.runtime                             # the executor's ModelRuntime
    graphs = mrt.prefill_graphs
    for mode in a.prefill_modes.split(","):
        if mode not in ("graphed", "eager"):
            p.error(f"--prefill-modes: {mode!r} is neither graphed nor eager")
        mrt.prefill_graphs = graphs if mode == "graphed" else None       # eager: the same runtime's
        tag = "" if mode == "graphed" else "eager "
        for key, eng in (("on", cached), ("off", plain)):
            eng.start()
            if "prefix" in work:
                res["shared_prefix"][tag + key] = _with_spec(eng, shared_prefix, a)
            if "chat" in work:
                res["chat"][tag + key] = _with_spec(eng, chat, a)
            if key == "on" and "arrival" in work:
                if a.mixed:                                # chunks ride the decode blocks
                    _arrivals(res, f"{tag}mixed_{a.mixed}_cap_{chunk}", eng, a)
                mixed, eng.mixed_tokens = eng.mixed_tokens, 0   # the rows below: chunks between blocks
                pacer, sched = eng.scheduler.pacer, eng.scheduler
                for st in (a.stalls or [stall]) if pacer is not None else ():
                    pacer.max_stall = st                   # the measured costs carry over: the model's
                    _arrivals(res, f"{tag}paced_{st:g}_cap_{chunk}", eng, a)
                if pacer is not None:
                    pacer.max_stall = stall
                sched.pacer = None                         # unpaced: max_num_batched_tokens alone
                for limit in (chunk, None):
                    sched.max_num_batched_tokens = limit
                    _arrivals(res, f"{tag}chunk_{limit}", eng, a)
                sched.max_num_batched_tokens, sched.pacer = chunk, pacer
                eng.mixed_tokens = mixed
            eng.shutdown()                                 # a stopped engine starts again
    mrt.prefill_graphs = graphs
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = a.name or f"bench_prefix_{a.make or Path(a.model).name}"
    (out / f"{name}.json").write_text(json.dumps(res, indent=2))
    md = _table(res)
    (out / f"{name}.md").write_text(md)
    print(md)
    return 0


def _table(res) -> str:
    lines = ["| shared prefix | cold TTFT ms | repeated TTFT ms | repeated / cold | cached tokens |",
             "|---|---|---|---|---|"]
    for k, v in res["shared_prefix"].items():
        lines.append(f"| cache {k} | {v['cold_ttft_ms']:.1f} | {v['repeated_ttft_ms']:.1f} | "
                     f"{v['repeated_over_cold']:.2f} | {v['cached_tokens']} |")
    lines += ["", "| arrival | long TTFT ms | steady TPOT p50 ms | TPOT p50 ms | TPOT p99 ms | p99 / steady p50 | "
              "largest gap ms | gap / steady gap | gap / steady p50 | samples | join gap ms | largest other gap ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, v in res["arrival"].items():
        lines.append(f"| {k} | {v['long_ttft_ms']:.1f} | {v['steady_tpot_p50_ms']:.2f} | {v['tpot_p50_ms']:.2f} | "
                     f"{v['tpot_p99_ms']:.2f} | {v['p99_over_steady_p50']:.2f} | {v['largest_gap_ms']:.2f} | "
                     f"{v['gap_over_steady_gap']:.2f} | {v['gap_over_steady_p50']:.2f} | {v['samples']} | "
                     f"{v['join_gap_ms']:.2f} | {v['largest_other_gap_ms']:.2f} |")
    lines += ["", "| chat | TTFT ms per turn | cached tokens per turn |", "|---|---|---|"]
    for k, v in res["chat"].items():
        lines.append(f"| cache {k} | {', '.join(f'{t:.1f}' for t in v['ttft_ms'])} | {v['cached_tokens']} |")
    spec = [(w, k, v["spec"]) for w in ("shared_prefix", "arrival", "chat") for k, v in res[w].items() if "spec" in v]
    if spec:
        lines += ["", "| speculation | row | acceptance | tokens / round | rounds |", "|---|---|---|---|---|"]
        lines += [f"| {w} | {k} | {v['acceptance']:.3f} | {v['tokens_per_round']:.2f} | {v['rounds']} |"
                  for w, k, v in spec]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
