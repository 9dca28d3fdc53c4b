"""Kernel launches per decode step and per speculative round, counted on CPU: the graph nodes a
captured step or round holds on a GPU (one per kernel launched while it is captured).

A random tiny checkpoint (tools/make_checkpoint.py's "tiny" shape, float32) is served through
`graphrt.LLM` on CPU under TRITON_INTERPRET=1 three times, each on one greedy request of --tokens
tokens: without speculation (steps_per_graph 1), with n-gram speculation, with the checkpoint as
its own draft model and with an EAGLE-3 head of random weights (k = --k, one round a block, every
block speculative; --methods picks rows). Inside what a GPU captures into a graph (ModelRuntime._steps, the
decode step; SpeculativeRunner._block, the rounds), which on CPU runs eagerly each time, every
aten op that launches device work (views, reshapes, allocations and host reads are left out) and
every Triton kernel launch is counted; over the decode steps or the rounds run, that is the
launches per step and per round, by op. The model runs the GPU's Triton kernel set (interpreted);
the attention of a decode step is the split-KV reference backend's (torch ops), not FlashInfer's: compare the rows' other ops, and rounds (whose attention
is the same multi-query Triton kernel on either device). Compare two trees
by running this tool in each (a count, not a speed: what each launch costs is the GPU's to say).

    TRITON_INTERPRET=1 python tools/count_launches.py [--tokens 24] [--k 4] [--json OUT]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# aten ops that launch nothing on a device (metadata, views, allocation, host reads)
NO_LAUNCH = {"view", "_unsafe_view", "reshape", "slice", "select", "expand", "as_strided", "t", "transpose",
             "unsqueeze", "squeeze", "permute", "detach", "alias", "lift_fresh", "empty", "empty_strided",
             "empty_like", "new_empty", "new_empty_strided", "_local_scalar_dense", "item", "unbind", "split",
             "split_with_sizes", "chunk", "narrow", "view_as", "expand_as", "contiguous", "is_same_size",
             "_reshape_alias", "unfold", "diagonal", "set_", "resize_", "_to_copy_host", "dim", "size",
             "stride", "sym_size", "sym_stride", "sym_numel", "numel", "is_nonzero", "equal"}


class Counter:
    """Counts aten ops that launch device work (TorchDispatchMode) and Triton launches (the
    interpreter's run), by name, while `on` is True."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.on = False

    @contextlib.contextmanager
    def installed(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        import triton.runtime.interpreter as interp
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if outer.on:
                    name = func._schema.name.split("::")[-1]
                    if name.rstrip("_") not in NO_LAUNCH and name not in NO_LAUNCH:
                        if not (name in ("copy_", "_to_copy") and _host_copy(args, kwargs)):
                            outer.counts["aten::" + name] += 1
                return func(*args, **(kwargs or {}))

        run = interp.InterpretedFunction.run

        def counted(fn, *a, **kw):
            was = outer.on
            if was:
                outer.counts["triton::" + getattr(fn, "__name__", getattr(getattr(fn, "fn", None), "__name__", "?"))] += 1
            outer.on = False                  # the interpreter's own copies of the arguments: not launches
            try:
                return run(fn, *a, **kw)
            finally:
                outer.on = was
        interp.InterpretedFunction.run = counted
        try:
            with Mode():
                yield self
        finally:
            interp.InterpretedFunction.run = run
        del torch


def _host_copy(args, kwargs) -> bool:
    """A copy whose source is a host tensor the engine stages (pinned on a GPU: a DMA, not a kernel):
    counted as a launch anyway on CPU, where every tensor is a host tensor; left as is (False)."""
    return False


def tiny_head(target: Path, out: Path) -> Path:
    """An EAGLE-3 head with random weights for the tiny checkpoint `target` (bench_eagle3_step's
    writer at the target's geometry, its whole vocabulary as the draft vocabulary)."""
    from bench_eagle3_step import write_random_head
    t = json.loads((target / "config.json").read_text())
    shape = dict(hidden=t["hidden_size"], intermediate=2 * t["hidden_size"], heads=t["num_attention_heads"],
                 kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], vocab=t["vocab_size"],
                 draft_vocab=t["vocab_size"], layers=t["num_hidden_layers"])
    path = write_random_head(out, shape=shape, device="cpu")
    cfg = json.loads((path / "config.json").read_text())   # a 2-layer target: states 0, 1, 2 (the
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]      # default ids need more layers)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def measure(ckpt: str, *, spec: dict | None, tokens: int, steps: int) -> dict:
    import torch
    from graphrt import LLM, SamplingParams
    # the GPU's kernel set (Triton, interpreted) and the split-KV reference attention, not the CPU's
    # torch kernel set: the count stands for the graph a GPU captures
    kw = dict(device="cpu", max_batch=2, max_model_len=128, steps_per_graph=steps, kernels="triton",
              backend="torch-splitkv")
    if spec is not None:
        kw |= dict(speculative=spec, spec_rounds=1)
    llm = LLM(ckpt, **kw)
    eng = llm.engine
    if spec is not None:
        eng.policy = None                                    # every block speculates
    prompt = [5, 9, 14, 5, 9, 14, 5, 9, 14, 5, 9]
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    llm.generate([prompt], params, use_tqdm=False)          # warm: every kernel compiled, paths taken
    counter = Counter()
    rt = eng.runtime
    mrt = rt.runtime                                          # the ModelRuntime: its _steps is a decode graph
    spec_runner = rt.spec

    def inside(obj, name):                                    # count only inside what a graph captures
        real = getattr(obj, name)

        def wrapped(*a, **k):
            counter.on = True
            try:
                return real(*a, **k)
            finally:
                counter.on = False
        setattr(obj, name, wrapped)
    inside(mrt, "_steps")
    if spec_runner is not None:
        inside(spec_runner, "_block")
    before = eng.stats()
    with counter.installed():
        llm.generate([prompt], params, use_tqdm=False)
    after = eng.stats()
    prefill = collections.Counter()
    decode = counter.counts - prefill
    if spec is None:
        units, label = tokens - 1, "step"                  # the first token is the prefill's
    else:                                                  # one round a block, every block speculative
        units, label = after["spec_blocks"] - before["spec_blocks"], "round"
    total = sum(decode.values())
    llm.shutdown()
    del torch
    return {"per": label, "units": units, "launches_per_unit": total / max(units, 1),
            "by_op_per_unit": {k: round(v / max(units, 1), 2) for k, v in decode.most_common()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json", default=None)
    ap.add_argument("--methods", default="decode,ngram,draft,eagle3", help="rows to measure (comma-separated)")
    a = ap.parse_args(argv)
    methods = a.methods.split(",")
    unknown = sorted(set(methods) - {"decode", "ngram", "draft", "eagle3"})
    if unknown:
        print(f"count_launches: --methods: unknown {unknown}; choose from decode, ngram, draft, eagle3",
              file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("count_launches: run with TRITON_INTERPRET=1 (CPU)", file=sys.stderr)
        return 2
    from make_checkpoint import write_checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(write_checkpoint(Path(tmp) / "target", shape="tiny", dtype="float32", seed=3))
        head = str(tiny_head(Path(ckpt), Path(tmp) / "eagle3")) if "eagle3" in methods else None
        specs = {"decode": None, "ngram": {"method": "ngram", "num_tokens": a.k},
                 "draft": {"method": "draft", "model": ckpt, "num_tokens": a.k},      # the target drafts itself
                 "eagle3": {"method": "eagle3", "model": head, "num_tokens": a.k}}
        rows = {m: measure(ckpt, spec=specs[m], tokens=a.tokens, steps=1) for m in methods}
    for name, r in rows.items():
        top = ", ".join(f"{k} {v}" for k, v in list(r["by_op_per_unit"].items())[:12])
        print(f"{name}: {r['launches_per_unit']:.1f} launches per {r['per']} ({r['units']} {r['per']}s); {top}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
