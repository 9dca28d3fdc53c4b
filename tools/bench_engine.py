"""Engine overhead benchmark: time per output token through graphrt.LLM vs the graph step time.

    python tools/make_checkpoint.py /tmp/ck8b --shape llama-3.1-8b
    python tools/bench_engine.py /tmp/ck8b --concurrency 1,8 --tokens 128 --out bench_engine.json

Reports, per concurrency c (c requests of --prompt-len random tokens, greedy, ignore_eos):
  step_ms      graph step time at batch c: K-step replays back to back, device time / K
  tpot_ms      engine time per output token: per request, (last delta's arrival - first delta's)
               / tokens after the first delta, seen by a reader thread per stream (engine on its
               thread); median over requests
  ratio        tpot_ms / step_ms (targets: <= 1.03 at c=1, <= 1.05 at c=8)
  ttft_ms      time to first token (includes the eager prefill of all c prompts)
  sampled_tpot_ms  (--sampled) tpot with temperature / top-p / top-k: the sampled graphs
and the checkpoint load: GB, seconds, GB/s (tensor copy into the fused layout on the device).
--device cpu runs the same path eagerly (a smoke test; numbers mean nothing).

The engine's host cost alone (no GPU, no model): tools/bench_engine_host.py.
""" 
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def step_ms(llm, c: int, prompt_len: int, torch, reps: int) -> float:
    rt = getattr(llm.runtime, "runtime", llm.runtime)   # the executor's ModelRuntime (public decode)
    cfg = rt.config
    dev = rt.device
    pages = -(-(prompt_len + reps * rt.k + 1) // cfg.page_size)
    table = torch.arange(c * pages, dtype=torch.int32).view(c, pages)
    lens = torch.full((c,), prompt_len + 1, dtype=torch.int32)
    tokens = torch.zeros(c, dtype=torch.int64, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    steps = [lens + i * rt.k for i in range(reps)]
    if dev.type == "cuda":                              # pinned: copies that do not wait
        table, steps = table.pin_memory(), [x.pin_memory() for x in steps]
    rt.decode(tokens, table, lens)                      # warm
    sync()
    t0 = time.perf_counter()
    for x in steps:
        rt.decode(tokens, table, x)
    sync()
    return (time.perf_counter() - t0) / (reps * rt.k) * 1e3


def engine_tpot(llm, c: int, prompt_len: int, n_tokens: int, torch, seed: int, *, sampled=False):
    from graphrt import SamplingParams
    gen = torch.Generator().manual_seed(seed)
    vocab = llm.checkpoint.spec.vocab_size
    prompts = [torch.randint(2, vocab, (prompt_len,), generator=gen).tolist() for _ in range(c)]
    params = SamplingParams(max_tokens=n_tokens, ignore_eos=True, seed=seed,
                            **(dict(temperature=0.8, top_p=0.9, top_k=50) if sampled else dict(temperature=0.0)))
    times = [[] for _ in range(c)]
    t_start = time.perf_counter()
    streams = [llm.engine.add_request(p, params) for p in prompts]

    def read(i):                                        # (arrival time, tokens) per delta
        for d in streams[i]:
            if d.token_ids:
                times[i].append((time.perf_counter(), len(d.token_ids)))
    threads = [threading.Thread(target=read, args=(i,)) for i in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # tokens arrive K at a time: time between the first and last delta over the tokens after the first
    tpot = [(ts[-1][0] - ts[0][0]) / max(1, sum(n for _, n in ts[1:])) * 1e3 for ts in times]
    ttft = [(ts[0][0] - t_start) * 1e3 for ts in times]
    return statistics.median(tpot), statistics.median(ttft)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="checkpoint directory (tools/make_checkpoint.py)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--sampled", action="store_true", help="also time sampled requests (sort + kernel)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.dir is None:
        p.error("dir: a checkpoint directory is needed")
    import torch
    from graphrt import LLM
    concs = [int(x) for x in a.concurrency.split(",")]
    t0 = time.perf_counter()
    llm = LLM(a.dir, device=a.device, max_batch=max(concs), steps_per_graph=a.k,
              max_model_len=a.max_model_len)
    init_s = time.perf_counter() - t0
    ck = llm.checkpoint
    result = {"dir": str(a.dir), "device": a.device, "k": a.k, "init_s": init_s,
              "load": {"gb": ck.nbytes / 1e9, "s": ck.load_s, "gb_s": ck.nbytes / 1e9 / ck.load_s},
              "runs": []}
    print(f"load {ck.nbytes / 1e9:.2f} GB in {ck.load_s:.2f} s ({ck.nbytes / 1e9 / ck.load_s:.2f} GB/s); "
          f"init (load + capture) {init_s:.1f} s")
    llm.engine.start()
    try:
        for c in concs:
            engine_tpot(llm, c, a.prompt_len, min(a.tokens, 8), torch, seed=1)   # warm
            tpot, ttft = engine_tpot(llm, c, a.prompt_len, a.tokens, torch, seed=2)
            step = step_ms(llm, c, a.prompt_len, torch, a.reps)
            run = {"concurrency": c, "step_ms": step, "tpot_ms": tpot, "ratio": tpot / step, "ttft_ms": ttft}
            if a.sampled:                 # same, with temperature 0.8 / top-p 0.9 / top-k 50
                run["sampled_tpot_ms"] = engine_tpot(llm, c, a.prompt_len, a.tokens, torch, seed=3,
                                                     sampled=True)[0]
            result["runs"].append(run)
            print(f"c={c:3d}  step {step:8.3f} ms  tpot {tpot:8.3f} ms  ratio {tpot / step:6.3f}  "
                  f"ttft {ttft:8.1f} ms" + (f"  sampled tpot {run['sampled_tpot_ms']:8.3f} ms"
                                           if a.sampled else ""))
    finally:
        llm.engine.shutdown()
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
