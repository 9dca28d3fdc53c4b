"""Where the device waits in the engine loop: graph step time vs engine time per token, the
device's idle gaps (torch.profiler kernel timeline) and every host synchronisation (with the
graphrt frames that made it), on a short-step model where any gap shows.

Per configuration (speculation none / ngram, bs 1 and 4): step_us (the graph step, K-step
replays back to back, tools/bench_engine.step_ms), engine_us (wall per token per stream through
LLM.generate), busy (the union of kernel intervals over the generate window / the window), the
gaps between kernels over 20 us (count, sum, largest) with the host runtime call that ended each
(what the device waited for), and the synchronising calls sync-debug mode reports, by stack.

"blocks" (block_gaps.py; a generate of --block-tokens): per decode block in the steady state, its
device time (first kernel to last), its kernels' sum, the capture-time cost it should take
(rounds x graph_round_us[k] or K x graph_step_us), the device's idle time before the next block and
the device work launched outside the blocks in between, from a profiled run ("profiler": each
block's launch inside a profiler range, its kernels matched by correlation id) and from an
unprofiled one ("events": CUDA events around each launch); medians per k and the share of the
decode window each explains. Which one is large says where the engine loses to the graphs: the
blocks' excess over the capture-time cost (the device runs a round slower in the engine), or the
idle gaps (the host is late), or the outside work. The table closes the output.

    python tools/device/engine_gaps.py --out $OUT/engine_gaps.json      # H200: Llama-3.2-1B shape, 4 layers
    python tools/device/engine_gaps.py --device cpu --layers 1 --tokens 8   # CPU smoke (numbers mean nothing)
    python tools/device/engine_gaps.py --model DIR/target --tokens 128 --out $OUT/engine_gaps.json \
        --configs "none:1,ngram:1,draft=DIR/draft:1,eagle3=DIR/eagle3:1"   # the trained family (train_tiny.py)
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))

from block_gaps import (PREFILL, block_label, blocks_from_events, blocks_from_trace, summarize,  # noqa: E402
                        table, with_expected)


def _frames() -> str:
    st = [f for f in traceback.extract_stack() if "/graphrt/" in f.filename]
    return " <- ".join(f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}:{f.name}"
                       for f in st[::-1][:5]) or "(outside graphrt)"


def sync_sites(run) -> dict[str, int]:
    """Every synchronising CUDA call sync-debug mode reports while `run()` runs, by graphrt stack."""
    import torch
    seen: collections.Counter = collections.Counter()
    with warnings.catch_warnings():                  # restores showwarning and the filters
        warnings.simplefilter("always")
        warnings.showwarning = lambda msg, *a, **k: seen.update([f"{str(msg)[:60]} @ {_frames()}"])
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return dict(seen.most_common(12))


def timeline(run, trace_path: Path) -> dict:
    """Kernel busy fraction and idle gaps over `run()`, from a torch.profiler chrome trace."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    prof.export_chrome_trace(str(trace_path))
    ev = json.loads(trace_path.read_text())
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    kern = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in ev
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    rt = sorted((e["ts"], e.get("dur", 0), e["name"]) for e in ev
                if e.get("ph") == "X" and e.get("cat") == "cuda_runtime")
    if not kern:
        return {"kernels": 0}
    busy, gaps, end = 0.0, [], kern[0][0]
    for a, b in kern:
        if a > end:
            gaps.append((a - end, end, a))
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    window = end - kern[0][0]
    big = [g for g in gaps if g[0] > 20]
    lo, hi = kern[0][0] + 0.25 * window, kern[0][0] + 0.75 * window     # the steady middle half
    mid = [g for g in big if lo <= g[1] <= hi]
    cpu = sorted((e["ts"], e["name"]) for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    why: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    for g, a, b in mid:                   # what the host did while the device waited
        why.update(r[2] for r in rt if a <= r[0] <= b)
        ops.update(name for ts, name in cpu if a <= ts <= b)
    syncs: collections.Counter = collections.Counter()
    for ts, dur, name in rt:
        if "Synchronize" in name or name == "cudaMemcpy":
            syncs[name] += dur
    return {"kernels": len(kern), "window_us": window, "busy": busy / window if window else 0.0,
            "gaps_over_20us": len(big), "gap_sum_us": sum(g[0] for g in big),
            "largest_gap_us": max((g[0] for g in big), default=0.0),
            "mid_gaps": len(mid), "mid_gap_sum_us": sum(g[0] for g in mid),
            "mid_gap_us": sorted(round(g[0]) for g in mid)[-12:],
            "mid_runtime_calls": dict(why.most_common(10)), "mid_cpu_ops": dict(ops.most_common(14)),
            "sync_call_us": dict(syncs.most_common(8))}


def prefill_host(run, rows: int = 25) -> dict:
    """Where a prefill's host time goes: `run()` (a generate of one token) under torch.profiler
    (no trace file: the profiler's own averages); the aten ops and CUDA runtime calls by total
    host time (us, inclusive) and count, the wall time of the run, and "host_sites": the
    outermost ops' host time by the graphrt function that called them (us, count)."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for stacks in (True, False):        # the stack pass can fail in torch's own event parsing
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stacks) as prof:
            run()
        wall = (time.perf_counter() - t0) * 1e6
        try:
            avg = sorted(prof.key_averages(), key=lambda e: e.cpu_time_total, reverse=True)
            out.update({"wall_us": wall, "host_ops": {e.key[:80]: [round(e.cpu_time_total), e.count]
                                                      for e in avg[:rows]}})
            if stacks:
                out["host_sites"] = host_sites(prof.events(), rows)
            return out
        except Exception as e:  # noqa: BLE001 - reported; the pass without stacks follows
            out["host_sites_error"] = repr(e)[:200]
    return out


def host_sites(events, rows: int = 25) -> dict:
    """The outermost torch ops and CUDA runtime calls (no such op above them) summed by the
    nearest graphrt Python function above them ("graphrt/package/file.py(def line): function",
    from the profiler's Python events of with_stack=True): {site: [us, count]}, largest first."""
    def is_op(e):
        return e.name.startswith(("aten::", "cuda", "cu"))
    acc: collections.Counter = collections.Counter()
    n: collections.Counter = collections.Counter()
    for e in events:
        if not is_op(e):
            continue
        p, site, outer = e.cpu_parent, None, True
        while p is not None:
            if is_op(p):
                outer = False
                break
            if site is None and "graphrt/" in p.name:
                site = "graphrt/" + p.name.split("graphrt/")[-1]
            p = p.cpu_parent
        if outer:
            key = site or "(outside graphrt)"
            acc[key] += e.cpu_time_total
            n[key] += 1
    return {k: [round(v), n[k]] for k, v in acc.most_common(rows)}


def phases(eng, run) -> dict:
    """Host time per engine phase over `run()` (perf_counter around the loop's methods and, inside
    _decode, the scheduler's grow, the batch's flush and the executor's launches; the block
    read-back's wait on the device counted apart), per decode block."""
    acc: collections.Counter = collections.Counter()
    saved = []

    def wrap(obj, name, label):
        f = getattr(obj, name)
        saved.append((obj, name))

        def g(*a, **k):
            if label == "_finish" and a[0].event is not None:
                t = time.perf_counter()
                a[0].event.synchronize()
                acc["finish_wait"] += time.perf_counter() - t
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[label] += time.perf_counter() - t
                acc[label + "_n"] += 1
        setattr(obj, name, g)
    for name in ("_drain_inbox", "_prefill_guarded", "_decode", "_finish", "_step"):
        wrap(eng, name, name)
    wrap(eng.scheduler, "grow", "grow")
    wrap(eng.batch, "flush", "flush")
    wrap(eng.runtime, "run", "run")              # the executor's block launches (graphrt/worker)
    runners = {id(g): g for g in (getattr(getattr(eng.runtime, "runtime", None), "graphs", None),
                                  getattr(getattr(eng.runtime, "spec", None), "graphs", None)) if g is not None}
    for g in runners.values():                # replays vs eager runs (a key never captured)
        f = g.run
        saved.append((g, "run"))

        def counted(*a, f=f, **k):
            out = f(*a, **k)
            acc["replayed" if out else "eager"] += 1
            return out
        g.run = counted
    try:
        run()
    finally:
        for obj, name in saved:
            delattr(obj, name)
    n = max(acc["_decode_n"], 1)
    keys = ("_step", "_drain_inbox", "_prefill_guarded", "_decode", "grow", "flush", "run",
            "_finish", "finish_wait")
    return {"blocks": acc["_decode_n"], "graph_replays": acc["replayed"], "eager_runs": acc["eager"], **{f"{k}_us_per_block": round(acc[k] / n * 1e6, 1) for k in keys}}


@contextlib.contextmanager
def marked_blocks(eng, mark):
    """Within: each decode block's launch (the executor's run(Block)) runs inside
    `mark(block_label(...))` and each prefill (Engine._prefill_guarded) inside `mark(PREFILL)`;
    mark: a context manager factory (torch.profiler.record_function, or CUDA events)."""
    from graphrt.attention.buckets import pick_bucket
    ex, caps, saved = eng.runtime, eng.caps, []
    buckets = tuple(caps.config.buckets)

    def wrap(obj, name, label):
        f = getattr(obj, name)
        saved.append((obj, name))

        def g(*a, **kw):
            with mark(label(*a, **kw)):
                return f(*a, **kw)
        setattr(obj, name, g)
    wrap(ex, "run", lambda b: block_label(b.k, b.n, pick_bucket(buckets, b.n),
                                          caps.spec_rounds if b.k else caps.steps_per_graph))
    wrap(eng, "_prefill_guarded", lambda work: PREFILL)
    try:
        yield
    finally:
        for obj, name in saved:
            delattr(obj, name)


def block_trace(eng, run, trace_path: Path) -> tuple[list[dict], int]:
    """block_gaps.blocks_from_trace over `run()` under torch.profiler, each block's launch in a range."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, \
            marked_blocks(eng, record_function):
        run()
    prof.export_chrome_trace(str(trace_path))
    ev = json.loads(trace_path.read_text())
    return blocks_from_trace(ev["traceEvents"] if isinstance(ev, dict) else ev)


def block_events(eng, run) -> tuple[list[dict], float]:
    """(block_gaps.blocks_from_events, host wall µs) over `run()` without a profiler: a CUDA event
    recorded before and after each block's launch."""
    import torch
    marks = []

    @contextlib.contextmanager
    def mark(label):
        if label == PREFILL:
            marks.append((label, None, None))
            yield
            return
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        yield
        b.record()
        marks.append((label, a, b))
    t0 = time.perf_counter()
    with marked_blocks(eng, mark):
        run()
    wall = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    ref = next((a for _, a, _ in marks if a is not None), None)
    us = lambda e: ref.elapsed_time(e) * 1e3                  # noqa: E731
    return blocks_from_events([(lab, None, None) if a is None else (lab, us(a), us(b))
                               for lab, a, b in marks]), wall


def graph_costs(llm) -> dict | None:
    """The capture-time graph costs a block is compared with: {"graph_step_us": {bucket: us},
    "graph_round_us": {bucket: {k: us}}}, the policy's (n-gram, draft) or measured as the policy
    measures them (Executor.measure_costs: EAGLE-3 has no policy; the plain step per bucket without
    speculation); None on CPU. Replays on the slots as they stand: call it before any request, on
    empty slots, as the policy does."""
    ex = llm.engine.runtime
    pol = getattr(llm.engine, "policy", None)
    costs = pol.graph_costs if pol is not None else ex.measure_costs() if ex.spec is not None else None
    if costs is not None:
        return {"graph_step_us": dict(costs.decode_us),
                "graph_round_us": {b: {q - 1: costs.round_us(b, q - 1) for q in v}
                                   for b, v in costs.verify_us.items()}}
    rt = ex.runtime
    if not rt.uses_graphs:
        return None
    from graphrt.kernels.timing import events_us
    with rt.lock:
        return {"graph_step_us": {b: events_us(lambda b=b: rt.decode_slots(b, sampled=False), 10, warmup=1) / rt.k
                                  for b in rt.config.buckets}, "graph_round_us": {}}


def configure(path: Path, device: str, spec: str, bs: int, tokens: int, out_dir: Path, block_tokens: int) -> dict:
    import torch

    from bench_engine import step_ms
    from graphrt import SamplingParams
    from profile_engine import decode_llm
    llm, prompts = decode_llm(path, device, spec, bs)
    try:
        costs = graph_costs(llm) if device == "cuda" and block_tokens else None   # on empty slots
        p = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)   # warm-up
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, p, use_tqdm=False)
            walls.append((time.perf_counter() - t0) / max(len(outs[0].token_ids), 1) * 1e6)
        row = {"spec": spec, "bs": bs, "engine_us_per_token": sorted(walls)[1]}
        if device == "cuda":
            row["step_us"] = step_ms(llm, bs, 128, torch, 16) * 1e3
            row["engine_x_step"] = row["engine_us_per_token"] / row["step_us"]
        one = lambda: llm.generate(prompts, p, use_tqdm=False)   # noqa: E731
        if device == "cuda":
            row["syncs"] = sync_sites(one)
        row["phases"] = phases(llm.engine, one)
        if device == "cuda":                 # one prefill's host time (a 1-token generate)
            first = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
            calls = iter(range(1, 100))      # new prompts each call: never a prefix-cache hit

            def fresh(c):
                return [[(11 * i + 5 * j + 131 * c) % 300 + 10 for j in range(128)] for i in range(bs)]
            row["prefill_host"] = prefill_host(lambda: llm.generate(fresh(next(calls)), first, use_tqdm=False))
        tag = spec.split("=")[0]                 # draft=DIR, eagle3=DIR: a file name without the path
        row["timeline"] = timeline(one, out_dir / f"trace_{tag}_bs{bs}.json")
        st = llm.engine.stats()
        row["spec_blocks"], row["plain_blocks"] = st.get("spec_blocks"), st.get("spec_plain_blocks")
        row["blocks_by_k"] = st.get("spec_blocks_by_k")
        pol = getattr(llm.engine, "policy", None)
        if pol is not None:                  # what the policy chose from: graph and realized costs
            g = pol.graph_costs
            row["policy"] = {"graph_step_us": dict(g.decode_us),
                             "graph_round_us": {b: {k: g.round_us(b, k) for k in pol.ks if k + 1 in g.verify_us[b]}
                                                for b in g.decode_us},
                             "wall_us": {f"{b}:{k}": us for (b, k), us in pol._wall.items()},
                             "acceptance": {s: pol.acceptance(s) for s in list(pol._slots)}}
        if block_tokens:                     # per decode block: device time vs capture-time cost, gaps
            pb = SamplingParams(max_tokens=block_tokens, temperature=0, ignore_eos=True)
            long = lambda: llm.generate(prompts, pb, use_tqdm=False)   # noqa: E731
            ev, wall = block_events(llm.engine, long) if device == "cuda" else ([], None)
            prof, unmatched = block_trace(llm.engine, long, out_dir / f"trace_blocks_{tag}_bs{bs}.json")
            with_expected(prof, costs)
            with_expected(ev, costs)
            row["blocks"] = {"profiler": {**summarize(prof), "unmatched_device_events": unmatched},
                             "events": summarize(ev, wall_us=wall), "costs": costs}
            (out_dir / f"blocks_{tag}_bs{bs}.json").write_text(json.dumps({"profiler": prof, "events": ev}))
        return row
    finally:
        llm.shutdown()


def main() -> None:
    from profile_engine import model_args, short_step_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(ap, 192)
    ap.add_argument("--configs", default="none:1,none:4,ngram:1",
                    help="spec:bs pairs; spec none, ngram, draft=DIR (a draft checkpoint) or eagle3=DIR (a head)")
    ap.add_argument("--block-tokens", type=int, default=None,
                    help="tokens of the per-block run (default 4 x --tokens, within max_model_len; 0: skip it)")
    ap.add_argument("--out", help="write the rows here (JSON); traces and per-block lists beside it")
    a = ap.parse_args()
    if a.block_tokens is None:               # decode_llm: 128-token prompts, max_model_len 1024 (CPU 256)
        a.block_tokens = min(4 * a.tokens, (1024 if a.device == "cuda" else 256) - 160)
    if a.block_tokens < 0:
        ap.error(f"--block-tokens: must be >= 0, got {a.block_tokens}")
    with tempfile.TemporaryDirectory() as tmp:
        path = short_step_model(a, tmp)
        out_dir = Path(a.out).parent if a.out else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        rows = []
        for c in a.configs.split(","):
            spec, bs = c.rsplit(":", 1)
            row = configure(path, a.device, spec, int(bs), a.tokens, out_dir, a.block_tokens)
            print(json.dumps(row, indent=1), flush=True)
            rows.append(row)
            if a.out:                        # after each config: a timeout keeps the rows so far
                Path(a.out).write_text(json.dumps(rows, indent=1))
        if a.block_tokens:
            print(table(rows), flush=True)


if __name__ == "__main__":
    main()
