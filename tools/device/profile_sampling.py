"""Where the processed decode step's extra device time goes: torch.profiler over eager steps.

Builds the LLM of tools/bench_sampling.py (an 8B-shaped 4-layer checkpoint written to a temp dir
by tools/make_checkpoint.py, or the directory given), then per batch size b:
  1. the graphed step_us of the plain greedy graph and of the processed graph (no sort), as
     bench_sampling reports them (device µs per decode step, replays on empty slots);
  2. torch.profiler (CPU + CUDA activities) over `--steps` eager (not graphed) calls of the
     processed decode step, of the plain greedy step, and of the processing alone on random
     [b, V] logits (process, draw, log-probabilities, count: the processed step's extra work),
     fused, filtered (with the sampler's sort) and as the unfused torch reference; each printed
     as the top `--rows` kernels by device time.

    python tools/device/profile_sampling.py --batches 1,16 --out $OUT/profile_sampling.json
    python tools/device/profile_sampling.py --device cpu --steps 2 --batches 1,2   # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))


def processing_cases(rt, b: int, logits) -> list:
    """The processed step's extra work over slots [0, b) on given logits [b, V] (model dtype):
    (name, fn) for the fused step without top-k / top-p (what the bench's processed graph runs),
    the filtered step (process, sort + draw, log-probabilities, count) and the float32 torch
    reference of the unfused rule (model/processing.py `_process`, torch log_softmax / topk)."""
    import torch
    from graphrt.kernels.sample import sample_tokens
    from graphrt.model.processing import _process
    st, out, lp = rt.slots, rt.out_tokens[0, :b], rt.logprobs
    live = st.seq_lens[:b] > 0
    t, seed, step, k, p = st.temperature[:b], st.seed[:b], st.step[:b], st.top_k[:b], st.top_p[:b]
    proc = st.proc

    def fused():
        proc.draw(logits, b, seed, step, t, live, out, lp.rows(0, b), source=rt.logprobs_mode)

    def filtered():
        x = proc.process(logits, b, step, t)
        sample_tokens(x, t, k, p, seed, step, out, filtered=True)
        lp.record(0, b, logits, out)
        proc.count(b, out, live)

    def reference():
        raw = logits.float()
        x = _process(raw, proc.counts[:b], proc.prompt[:b], proc.params[:, :b], proc.rule_ids[:b],
                     proc.rule_vals[:b], proc.rule_until[:b], step, t)
        sample_tokens(x, t, k, p, seed, step, out, filtered=False)
        ls = torch.log_softmax(raw, dim=-1)
        tok = ls.gather(1, out[:, None])
        lp.rank[0, :b].copy_((ls > tok).sum(dim=1, dtype=torch.int32) + 1)
        vals, ids = torch.topk(ls, lp.width, dim=-1)
        lp.top_vals[0, :b].copy_(vals)
        lp.top_ids[0, :b].copy_(ids)
        proc.count(b, out, live)
    return [("processing only, fused (no top-k/top-p)", fused), ("processing only, filtered (sort)", filtered),
            ("processing only, unfused torch reference", reference)]


def profile(fn, steps: int, cuda: bool, rows: int, torch) -> tuple[str, float]:
    """(key_averages table of the top `rows` entries, device µs per call summed over kernels)."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()                                                   # warm (lazy init, Triton JIT)
    if cuda:
        torch.cuda.synchronize()
    with tprofile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    avg = prof.key_averages()
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    table = avg.table(sort_by=sort, row_limit=rows)
    dev = 0.0
    if cuda:
        try:
            dev = sum(e.self_device_time_total for e in avg
                      if e.device_type == torch.autograd.DeviceType.CUDA) / steps
        except AttributeError:                             # an older profiler: the table only
            dev = float("nan")
    return table, dev


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="checkpoint directory (default: an 8B-shaped 4-layer one in a temp dir)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--steps", type=int, default=10, help="eager calls profiled per table")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--reps", type=int, default=None, help="graph replays per step_us burst (30; CPU: 1)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch
    from graphrt import LLM
    from bench_sampling import step_us
    from make_checkpoint import write_checkpoint
    t0 = time.perf_counter()
    cuda = a.device.startswith("cuda")
    a.reps = a.reps or (30 if cuda else 1)
    tmp = tempfile.TemporaryDirectory()
    path = a.dir
    if path is None:
        shape = dict(shape="llama-3.1-8b", num_layers=4, dtype="bfloat16") if cuda else \
            dict(shape="tiny", dtype="float32")
        path = write_checkpoint(Path(tmp.name) / "ck", arch="llama", seed=1, **shape)
    batches = [int(x) for x in a.batches.split(",")]
    llm = LLM(str(path), device=a.device, max_batch=max(batches), steps_per_graph=a.k,
              max_model_len=256 if not cuda else 1024, **({} if cuda else {"backend": "reference"}))
    rt = llm.runtime.runtime
    from graphrt.model.runtime import PROCESSED
    print(f"checkpoint {path}  vocab {llm.checkpoint.spec.vocab_size}  k {rt.k}  logprobs width "
          f"{rt.logprobs.width}  mode {rt.logprobs_mode}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    result = {"dir": str(path), "device": a.device, "k": rt.k, "width": rt.logprobs.width, "runs": []}
    gen = torch.Generator(device="cpu").manual_seed(0)
    with rt.lock:                                          # the engine never started: slots empty
        for b in batches:
            run = {"batch": b, "step_plain_us": step_us(llm, b, False, torch, a.reps),
                   "step_processed_us": step_us(llm, b, True, torch, a.reps)}
            run["step_extra_us"] = run["step_processed_us"] - run["step_plain_us"]
            logits = torch.randn((b, llm.checkpoint.spec.vocab_size), generator=gen).to(
                rt.device, dtype=torch.bfloat16 if cuda else torch.float32)        # [b, V] model dtype
            cases = [("processed step (eager)", lambda: rt._steps(b, PROCESSED)),
                     ("plain greedy step (eager)", lambda: rt._steps(b)),
                     ] + processing_cases(rt, b, logits)
            for name, fn in cases:
                table, dev = profile(fn, a.steps, cuda, a.rows, torch)
                run[f"{name} device_us"] = dev / (rt.k if "step" in name else 1)
                print(f"\n=== bs {b}: {name}: {a.steps} calls"
                      + (f", kernel time {dev:.1f} us per call" if cuda else "") + " ===")
                print(table, flush=True)
            result["runs"].append(run)
            print(f"bs {b}: graphed step plain {run['step_plain_us']:.1f} us, processed "
                  f"{run['step_processed_us']:.1f} us, extra {run['step_extra_us']:.1f} us"
                  + ("" if cuda else " (CPU: eager wall us, meaningless)"), flush=True)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
