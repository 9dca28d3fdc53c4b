"""Where the host waits: torch.profiler over (a) the first 4k prompt with the prefix cache on (the
cold outlier, 197-281 ms against 23-27 ms with the cache off) and (b) one paced 4k arrival while
8 streams decode (the prefill call blocking the host ~5 ms per chunk).

argv: checkpoint, output directory. Writes {cold,arrival}_{cpu,cuda}.txt (key_averages tables:
host ops by self CPU time, which names cudaStreamSynchronize / cudaMemcpyAsync / cudaHostAlloc /
cudaEventSynchronize; device kernels by CUDA time) and a chrome trace per workload.
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_prefix import _head, _request  # noqa: E402

from graphrt import LLM  # noqa: E402


class A:
    prefix_len, suffix_len, long_len, streams, decode_tokens = 4096, 32, 4096, 8, 400


def profiled(name, out, fn):
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        res = fn()
        wall = (time.perf_counter() - t0) * 1e3
    ka = prof.key_averages()
    (out / f"{name}_cpu.txt").write_text(ka.table(sort_by="self_cpu_time_total", row_limit=40))
    (out / f"{name}_cuda.txt").write_text(ka.table(sort_by="self_cuda_time_total", row_limit=30))
    prof.export_chrome_trace(str(out / f"{name}_trace.json"))
    print(f"== {name}: {wall:.1f} ms wall; {res}")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=18))
    return res


def main():
    ck, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    llm = LLM(ck, max_batch=16, max_model_len=8192)
    a = A()
    a.vocab = llm.checkpoint.spec.vocab_size
    eng = llm.engine
    eng.start()
    for _ in range(2):                                  # warm-up: the same lengths, fresh heads
        _request(eng, _head(a) + [5] * (a.prefix_len + a.suffix_len), 2).join()
    times = []
    for i in range(3):                                  # cold 4k prompts, cache on, unprofiled
        r = _request(eng, _head(a) + list(range(100, 99 + a.prefix_len)) + [7] * a.suffix_len, 2)
        r.join()
        times.append(round(r.ttft_ms, 1))
    print("cold cache-on TTFT ms, unprofiled:", times, "stats:", {k: v for k, v in eng.stats().items()
                                                                  if "prefix" in k or "page" in k})

    def cold():
        r = _request(eng, _head(a) + list(range(100, 99 + a.prefix_len)) + [7] * a.suffix_len, 2)
        r.join()
        return {"ttft_ms": round(r.ttft_ms, 1), "cached": r.out.num_cached_tokens}
    profiled("cold", out, cold)

    def arrival():
        running = [_request(eng, [5 + s, 6, 7, 8], a.decode_tokens) for s in range(a.streams)]
        while any(sum(n for _, n in r.deltas) < 48 for r in running):
            time.sleep(0.001)
        late = _request(eng, _head(a) + [(11 * j) % 90 + 5 for j in range(a.long_len - 1)], 2)
        late.join()
        for r in running:
            r.join()
        return {"long_ttft_ms": round(late.ttft_ms, 1), "budget": eng.stats().get("prefill_budget_tokens")}
    arrival()                                           # warm: the pacer's costs measured
    profiled("arrival", out, arrival)
    eng.shutdown()
    llm.shutdown()


if __name__ == "__main__":
    main()
