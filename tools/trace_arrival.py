"""Where a long prompt's arrival stalls the running streams: a host timeline of the engine's steps.

Runs bench_prefix's arrival workload (--streams short requests decoding, then one --long-len
prompt in chunks of --chunk tokens) on a random checkpoint through graphrt.LLM, twice for warm-up,
then once with the engine's phases timed on the host (perf_counter around the scheduler's admit /
prefill_work / grow, the engine's _prefill / _decode / _finish, the executor's prefill and
run (graphrt/worker's launches), the input batch's flush). With --sync a second traced run calls
torch.cuda.synchronize() after every phase, so each phase's time includes its GPU work (this
perturbs the overlap: read it for the split, not the totals).

Prints per engine step within the arrival window: each phase's milliseconds and the streams'
delta times; writes JSON (--out). --workload reuse traces instead a repeated --long-len prefix +
32 new tokens with nothing else running (bench_prefix's shared-prefix row): the steps from its
arrival to its first token ("long TTFT" is then that request's).

    python tools/trace_arrival.py --make llama-3.2-1b --chunk 512 --out /tmp/trace.json --sync
    python tools/trace_arrival.py --make llama-3.2-1b --workload reuse --streams 0 --out /tmp/reuse.json --sync
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = [("scheduler", "admit"), ("scheduler", "prefill_work"), ("scheduler", "grow"),
          ("engine", "_prefill"), ("engine", "_decode"), ("engine", "_finish"), ("engine", "_step"),
          ("runtime", "prefill"), ("runtime", "run"),
          ("batch", "flush")]


class Timeline:
    """(phase, t0, t1) host seconds, recorded while `on`; sync: torch.cuda.synchronize() at each end."""

    def __init__(self, sync: bool):
        self.events, self.on, self.sync = [], False, sync

    def wrap(self, obj, name: str, label: str) -> None:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def timed(*args, **kw):
            if not self.on:
                return fn(*args, **kw)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                if self.sync and torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.events.append((label, t0, time.perf_counter()))
        setattr(obj, name, timed)


def owners(eng) -> dict:
    return {"scheduler": eng.scheduler, "engine": eng, "runtime": eng.runtime, "batch": eng.batch}


def steps_table(events, deltas, t_arr) -> list[dict]:
    """Per engine step (an `engine._step` event): ms of each phase inside it, deltas that landed in it."""
    rows = []
    for label, s0, s1 in sorted((e for e in events if e[0] == "engine._step"), key=lambda e: e[1]):
        row = {"t_ms": round((s0 - t_arr) * 1e3, 2), "step_ms": round((s1 - s0) * 1e3, 2)}
        for lab, t0, t1 in events:
            if lab != "engine._step" and s0 <= t0 and t1 <= s1:
                row[lab] = round(row.get(lab, 0.0) + (t1 - t0) * 1e3, 3)
        row["deltas"] = sum(1 for t in deltas if s0 <= t <= s1 + 1e-4)
        rows.append(row)
    return rows


def traced_arrival(eng, a, tl: Timeline) -> dict:
    from bench_prefix import _head, _request
    running = [_request(eng, [5 + s, 6, 7, 8], a.decode_tokens) for s in range(a.streams)]
    while any(sum(n for _, n in r.deltas) < 2 for r in running):
        time.sleep(0.001)
    tl.events.clear()
    tl.on = True
    t_arr = time.perf_counter()
    late = _request(eng, _head(a) + [(11 * j) % 90 + 5 for j in range(a.long_len - 1)], 2)
    late.join()
    t_first = late.t0 + late.ttft_ms / 1e3
    time.sleep(0.05)
    tl.on = False
    for r in running:
        r.join()
    deltas = sorted(t for r in running for t, n in r.deltas if n and t_arr <= t <= t_first + 0.05)
    gaps = []
    for r in running:
        ts = [t for t, n in r.deltas if n]
        gaps += [((t1 - t0) * 1e3, (t1 - t_arr) * 1e3) for t0, t1 in zip(ts, ts[1:]) if t_arr <= t1 <= t_first + 0.05]
    gaps.sort(reverse=True)
    return {"long_ttft_ms": late.ttft_ms, "first_token_at_ms": (t_first - t_arr) * 1e3,
            "largest_gaps_ms_at": gaps[:6], "steps": steps_table(tl.events, deltas, t_arr)}


def traced_reuse(eng, a, tl: Timeline) -> dict:
    """The shared-prefix workload traced: a --long-len prefix + 32 tokens (cold: its pages cached),
    then the same prefix + 32 other tokens with the timeline on (nothing else running): where
    the repeated request's time to first token goes, step by step."""
    from bench_prefix import _head, _request
    base = _head(a) + list(range(100, 99 + a.long_len))
    _request(eng, base + [(7 * j) % 90 + 5 for j in range(32)], 2).join()
    tl.events.clear()
    tl.on = True
    t_arr = time.perf_counter()
    r = _request(eng, base + [(11 * j) % 90 + 5 for j in range(32)], 2)
    r.join()
    t_first = r.t0 + r.ttft_ms / 1e3
    time.sleep(0.02)
    tl.on = False
    return {"long_ttft_ms": r.ttft_ms, "first_token_at_ms": (t_first - t_arr) * 1e3,
            "cached_tokens": r.out.num_cached_tokens, "largest_gaps_ms_at": [],
            "steps": steps_table(tl.events, [t_first], t_arr)}


def show(name: str, res: dict) -> str:
    cols = [lab for _, lab in ((o, f"{o}.{n}") for o, n in PHASES) if lab != "engine._step"]
    cols = [c for c in cols if any(c in r for r in res["steps"])]
    short = [c.split(".")[1] for c in cols]
    lines = [f"## {name}: long TTFT {res['long_ttft_ms']:.1f} ms; largest gaps (ms, ending at ms): "
             + ", ".join(f"{g:.1f}@{t:.0f}" for g, t in res["largest_gaps_ms_at"]), "",
             "| t ms | step ms | " + " | ".join(short) + " | deltas |", "|" + "---|" * (len(cols) + 3)]
    for r in res["steps"]:
        lines.append(f"| {r['t_ms']:.1f} | {r['step_ms']:.2f} | " + " | ".join(
            f"{r[c]:.2f}" if c in r else "" for c in cols) + f" | {r['deltas']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--make", default="llama-3.2-1b")
    p.add_argument("--device", default=None)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--steps-per-graph", type=int, default=4)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--long-len", type=int, default=4096)
    p.add_argument("--decode-tokens", type=int, default=400)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--sync", action="store_true", help="also a run with a synchronize after every phase")
    p.add_argument("--workload", default="arrival", choices=["arrival", "reuse"],
                   help="arrival: --streams decoding, then a --long-len prompt; reuse: a repeated "
                        "--long-len prefix + 32 new tokens alone (its TTFT's steps)")
    p.add_argument("--out", default="trace_arrival.json")
    a = p.parse_args(argv)
    from graphrt import LLM
    path = a.model
    if path is None:
        from make_checkpoint import write_checkpoint
        cuda = (a.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
        path = write_checkpoint(Path(tempfile.mkdtemp()) / a.make, a.make,
                                dtype="bfloat16" if cuda else "float32")
    llm = LLM(path, device=a.device, max_batch=a.max_batch, steps_per_graph=a.steps_per_graph,
              max_model_len=a.max_model_len, max_num_batched_tokens=a.chunk)
    a.vocab = llm.checkpoint.spec.vocab_size
    eng = llm.engine
    out = {"args": vars(a)}
    for sync in ([False, True] if a.sync else [False]):
        tl = Timeline(sync)
        for o, n in PHASES:
            tl.wrap(owners(eng)[o], n, f"{o}.{n}")
        eng.start()
        traced = traced_arrival if a.workload == "arrival" else traced_reuse
        for _ in range(2):
            traced(eng, a, tl)                           # warm-up: every path of the workload once
        name = "synced" if sync else "overlapped"
        out[name] = traced(eng, a, tl)
        eng.shutdown()
        print(show(name, out[name]), "\n", flush=True)
        for o, n in PHASES:                               # unwrap: the instance attribute goes
            delattr(owners(eng)[o], n)
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
