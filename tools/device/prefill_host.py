"""Host time inside the prefill path, by sub-phase (perf_counter wrappers, no profiler: CUPTI
slows graph launches ~25x and hides the waits). Workloads as host_block.py: the first 4k prompt
after a warm-up with the prefix cache on (the cold outlier), a second one, then a paced 4k arrival
while 8 streams decode. argv: checkpoint, output JSON. With a third argument "sync", each wrapped
call ends with torch.cuda.synchronize() (its time then includes its GPU work). Garbage collections inside
a window are timed too (gc.genN)."""
import functools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_prefix import _head, _request  # noqa: E402

import graphrt.model.prefill_graphs as pg  # noqa: E402
import graphrt.model.runtime as mr  # noqa: E402
from graphrt import LLM  # noqa: E402

REC = {"on": False, "t": defaultdict(list)}
SYNC = len(sys.argv) > 3 and sys.argv[3] == "sync"
_GC = {}


def _gc_timer(phase, info):
    """gc.callbacks: each collection's generation and milliseconds, into the window's phases."""
    if phase == "start":
        _GC["t"] = time.perf_counter()
    elif REC["on"] and "t" in _GC:
        REC["t"][f"gc.gen{info['generation']}"].append((time.perf_counter() - _GC["t"]) * 1e3)


def wrap(obj, name, label):
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def timed(*a, **k):
        if not REC["on"]:
            return fn(*a, **k)
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            if SYNC:
                torch.cuda.synchronize()
            REC["t"][label].append((time.perf_counter() - t0) * 1e3)
    setattr(obj, name, timed)


def window(name, fn, out):
    REC["t"].clear()
    REC["on"] = True
    t0 = time.perf_counter()
    res = fn()
    wall = (time.perf_counter() - t0) * 1e3
    REC["on"] = False
    rows = {k: {"n": len(v), "total_ms": round(sum(v), 2), "max_ms": round(max(v), 2),
                "mean_ms": round(sum(v) / len(v), 3)} for k, v in REC["t"].items()}
    out[name] = {"wall_ms": round(wall, 1), "result": res, "phases": rows}
    print(f"== {name}: wall {wall:.1f} ms; {res}")
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1]["total_ms"]):
        print(f"  {k:34s} n={v['n']:4d} total {v['total_ms']:9.2f} mean {v['mean_ms']:8.3f} max {v['max_ms']:8.2f}")


def main():
    ck, dst = sys.argv[1], Path(sys.argv[2])
    small = not torch.cuda.is_available()             # a CPU smoke run of the script itself
    llm = LLM(ck, max_batch=16, max_model_len=256 if small else 8192)
    eng = llm.engine
    ex = eng.runtime
    mrt = ex.runtime

    class A:
        prefix_len, suffix_len, long_len, streams, decode_tokens = 4096, 32, 4096, 8, 400
    a = A()
    if small:
        a.prefix_len, a.suffix_len, a.long_len, a.streams, a.decode_tokens = 48, 8, 64, 2, 24
    a.vocab = llm.checkpoint.spec.vocab_size
    for obj, names in ((eng, ["_prefill", "_decode", "_finish", "_to_host"]),
                       (eng.scheduler, ["admit", "prefill_work", "prefilled", "grow", "_match"]),
                       (eng.scheduler.kv, ["check_writable", "match", "allocate"]),
                       (eng.batch, ["flush"]),
                       (ex, ["prefill", "run"]),
                       (mrt, ["prefill"]),
                       (mrt.model, ["check_prompts", "prefill"]),
                       (mrt.graphs, ["run"]),
                       (mr, ["check_prefill", "to_device"]),
                       (pg, ["copy_into", "plan_pieces"])):
        for n in names:
            if hasattr(obj, n):
                wrap(obj, n, f"{type(obj).__name__ if not isinstance(obj, type(sys)) else obj.__name__}.{n}")
    if mrt.prefill_graphs is not None:
        wrap(mrt.prefill_graphs, "prefill", "PrefillGraphs.prefill")
    if eng.scheduler.kv.cache is not None:
        for n in ("extend", "match", "insert"):
            wrap(eng.scheduler.kv.cache, n, f"PrefixCache.{n}")
    import gc
    gc.callbacks.append(_gc_timer)
    print("gc frozen objects:", gc.get_freeze_count(), "tracked:", len(gc.get_objects()))
    eng.start()
    for _ in range(2):
        _request(eng, _head(a) + [5] * (a.prefix_len + a.suffix_len), 2).join()
    out = {"sync": SYNC}

    def cold():
        r = _request(eng, _head(a) + list(range(100, 99 + a.prefix_len)) + [7] * a.suffix_len, 2)
        r.join()
        return {"ttft_ms": round(r.ttft_ms, 1), "cached": r.out.num_cached_tokens}
    window("cold_first", cold, out)
    window("cold_second", cold, out)

    def arrival():
        running = [_request(eng, [5 + s, 6, 7, 8], a.decode_tokens) for s in range(a.streams)]
        while any(sum(n for _, n in r.deltas) < (8 if small else 48) for r in running):
            time.sleep(0.001)
        REC["t"].clear()
        late = _request(eng, _head(a) + [(11 * j) % 90 + 5 for j in range(a.long_len - 1)], 2)
        late.join()
        res = {"long_ttft_ms": round(late.ttft_ms, 1), "budget": eng.stats().get("prefill_budget_tokens")}
        REC["on"] = False
        for r in running:
            r.join()
        return res
    arrival()
    window("arrival", arrival, out)
    eng.shutdown()
    llm.shutdown()
    dst.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
