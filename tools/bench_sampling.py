"""What logits processing and log-probabilities cost a decode stream: greedy TPOT with and
without a neighbour that asks for logprobs + penalties, and that neighbour's own TPOT.

    python tools/make_checkpoint.py /tmp/ck8b --shape llama-3.1-8b
    python tools/bench_sampling.py /tmp/ck8b --batches 1,16 --tokens 128 --out bench_sampling.json
    python tools/bench_sampling.py --micro --device cpu --tokens 6      # CPU smoke test (numbers mean nothing)

Per batch size b:
  step_plain_us / step_processed_us   device µs per decode step of the greedy graph and of the
               processed graph (no sort) at bucket b, replays of the captured graphs on empty
               slots (the GEMMs and the processing passes have fixed shapes); CPU: eager wall µs
  step_processed_filtered_us  the same for the processed graph with the sampler's sort (rows
               with top-k / top-p; JSON only)
  tpot_plain_ms       engine TPOT of b greedy requests (median over requests)
  tpot_greedy_mixed_ms  the greedy requests' TPOT when one of the b asks for logprobs=5 and
               presence / frequency / repetition penalties (b - 1 greedy neighbours; none at b = 1)
  tpot_processed_ms   that request's TPOT
  greedy_ratio = tpot_greedy_mixed / tpot_plain (target <= 1.01), processed_ratio = tpot_processed
  / tpot_plain (target <= 1.05). A block runs one graph for all its rows, so a greedy stream next to
  a processed one pays the processed graph's extra passes (step_processed_us - step_plain_us).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROCESSED = dict(logprobs=5, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1)


def step_us(llm, b: int, processed: bool, torch, reps: int, filtered: bool = False) -> float:
    rt = llm.runtime.runtime
    call = (lambda: rt.decode_slots(b, sampled=True, processed=True, filtered=filtered)) if processed else \
        (lambda: rt.decode_slots(b, sampled=False))
    if rt.device.type == "cuda":
        from benchlib import device_us
        call()
        return device_us(call, torch, reps=reps, repeats=3) / rt.k
    call()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps / rt.k * 1e6


def tpots(llm, params_list, prompt_len: int, torch, seed: int) -> list[float]:
    """Engine TPOT (ms) of each request, all submitted together (the engine on its thread)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = llm.checkpoint.spec.vocab_size
    streams = [llm.engine.add_request(torch.randint(2, vocab, (prompt_len,), generator=gen).tolist(), p)
               for p in params_list]
    times = [[] for _ in streams]

    def read(i):
        for d in streams[i]:
            if d.token_ids:
                times[i].append((time.perf_counter(), len(d.token_ids)))
    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(ts[-1][0] - ts[0][0]) / max(1, sum(n for _, n in ts[1:])) * 1e3 for ts in times]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="checkpoint directory (or --micro)")
    p.add_argument("--micro", action="store_true", help="a tiny random checkpoint written to a temp dir")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.dir is None and not a.micro:
        p.error("dir: a checkpoint directory is needed (or --micro)")
    import torch
    from graphrt import LLM, SamplingParams
    tmp = tempfile.TemporaryDirectory()
    path = a.dir
    if a.micro:
        from make_checkpoint import write_checkpoint
        path = write_checkpoint(Path(tmp.name) / "ck", arch="llama", dtype="float32", seed=1)
        a.prompt_len, a.max_model_len = min(a.prompt_len, 8), min(a.max_model_len, 64)
        a.reps = min(a.reps, 3)
    batches = [int(x) for x in a.batches.split(",")]
    llm = LLM(path, device=a.device, max_batch=max(batches), steps_per_graph=a.k,
              max_model_len=a.max_model_len, **({"backend": "reference"} if a.device == "cpu" else {}))
    greedy = SamplingParams(max_tokens=a.tokens, temperature=0.0, ignore_eos=True)
    proc = SamplingParams(max_tokens=a.tokens, temperature=0.0, ignore_eos=True, **PROCESSED)
    result = {"dir": str(path), "device": a.device, "k": llm.runtime.caps.steps_per_graph, "tokens": a.tokens,
              "processed": PROCESSED, "runs": []}
    llm.engine.start()
    try:
        tpots(llm, [SamplingParams(max_tokens=min(a.tokens, 8), temperature=0.0, ignore_eos=True, **PROCESSED)],
              a.prompt_len, torch, seed=0)                                 # warm
        for b in batches:
            plain = tpots(llm, [greedy] * b, a.prompt_len, torch, seed=1)
            mixed = tpots(llm, [greedy] * (b - 1) + [proc], a.prompt_len, torch, seed=1)
            run = {"batch": b, "tpot_plain_ms": statistics.median(plain),
                   "tpot_greedy_mixed_ms": statistics.median(mixed[:-1]) if b > 1 else None,
                   "tpot_processed_ms": mixed[-1]}
            run["greedy_ratio"] = run["tpot_greedy_mixed_ms"] / run["tpot_plain_ms"] if b > 1 else None
            run["processed_ratio"] = run["tpot_processed_ms"] / run["tpot_plain_ms"]
            result["runs"].append(run)
    finally:
        llm.engine.shutdown()
    with llm.runtime.runtime.lock:                            # the engine is stopped: the slots are empty
        for run in result["runs"]:
            b = run["batch"]
            run["step_plain_us"] = step_us(llm, b, False, torch, a.reps)
            run["step_processed_us"] = step_us(llm, b, True, torch, a.reps)
            run["step_processed_filtered_us"] = step_us(llm, b, True, torch, a.reps, filtered=True)
    print(f"{'batch':>5} {'step plain us':>14} {'step proc us':>13} {'tpot plain':>11} {'greedy mixed':>13} "
          f"{'processed':>10} {'greedy x':>9} {'proc x':>7}")
    fmt = lambda v, w, d: f"{'-':>{w}}" if v is None else f"{v:{w}.{d}f}"
    for r in result["runs"]:
        print(f"{r['batch']:5d} {r['step_plain_us']:14.1f} {r['step_processed_us']:13.1f} {r['tpot_plain_ms']:11.3f} "
              f"{fmt(r['tpot_greedy_mixed_ms'], 13, 3)} {r['tpot_processed_ms']:10.3f} "
              f"{fmt(r['greedy_ratio'], 9, 3)} {r['processed_ratio']:7.3f}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    tmp.cleanup()


if __name__ == "__main__":
    main()
