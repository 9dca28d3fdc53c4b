"""Speculative decoding, parts (2) and (3): the trained family through `LLM`, and the 8B projection.

Part 2 (measured): the target and draft trained together by tools/train_tiny.py (DIR/target,
DIR/draft, one tokenizer) and an EAGLE-3 head for the target (tools/train_eagle3.py --out
DIR/eagle3). Per method (none / ngram / draft / eagle3, each one `LLM(DIR/target,
speculative=...)`) x workload x batch size: tokens/s per stream (generated tokens of a stream
over the wall time of its generate call, greedy, ignore_eos, after a warm-up call), and from
`Engine.stats()` deltas: proposals, accepted, rounds -> acceptance rate and tokens per round; plus
how many outputs equal method none's (greedy: they should, up to bf16 near-ties on a GPU). On
CUDA also the family's own step costs (part 1's measurement on the two checkpoints) and, per spec
row, the speed-up the round arithmetic predicts from its measured tokens per round ("x arith"),
and "x runner": the device time of the decode and speculative blocks the engine ran (CUDA events
around each launch, Engine.time_blocks: every block at its real context and batch, i.e. the
runner's own time for exactly those blocks) over the wall time of the generate calls, prefills
included: the engine adds nothing when it is >= 0.95; "busy": the device time of every block,
prefills too, over the same wall (1 - busy is the host's share). "x graphs" is the older reading:
the decode blocks' launch-to-launch wall (Engine.stats' spec_block_wall_s, intervals with a
prefill dropped) against the graphs' capture-time costs, which are timed on empty slots (attention
at a near-zero context) and so understate a block wherever attention matters; the JSON keeps the
same understatement over the whole wall as "engine_over_capture_costs".
Workloads, from the held-out files of the corpus split (never trained on):
  heldout   the first P tokens of a held-out file; the model continues it
  repeat    a held-out file (about P tokens of whole lines), then its first lines again: the
            continuation copies the file (prompt lookup's best case, e.g. code edits)
Part 3 (PROJECTION, labelled so in every output): an 8B target from the measured 8B-shape step costs
of part 1 (bench_spec.py's JSON: decode step, verify of q tokens, the 1B-shape step as the draft)
and part 2's measured acceptance (fitted to the i.i.d. model from tokens per round at the k used):
speed-up = E(a, k) x t_step / (t_verify(k + 1) + k x t_draft) at the measured k and at the best k,
and the policy's choice (speculative/policy.py: never below 1.0). It assumes the acceptance of this
small family carries over to an 8B target and a 1B draft; nothing of it is measured on an 8B model.

    python tools/bench_spec.py --trained DIR --out bench_spec_trained.json --png bench_spec_trained.png
    python tools/bench_spec.py --trained DIR --smoke --device cpu --out /tmp/s.json   # CPU, micro family
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchlib import pyplot

METHODS = ("none", "ngram", "draft")               # the default set; eagle3 also needs DIR/eagle3
ALL_METHODS = METHODS + ("eagle3", "draft-eager")   # draft-eager: the draft prefilled at every admission
#   (the engine's behaviour before a draft's prefill could wait for its first speculative block): an A/B row
COUNTS = ("spec_proposed", "spec_accepted", "spec_rounds")
PART1 = Path(__file__).resolve().parent.parent / "docs" / "results" / "bench_spec_h200.json"


@dataclass(frozen=True)
class Plan:
    """What one run measures: prompts per workload, prompt tokens, generated tokens, batch sizes,
    proposals a round."""
    prompts: int = 8
    prompt_tokens: int = 256
    gen_tokens: int = 128
    batches: tuple = (1, 4)
    k: int = 4
    max_model_len: int = 1024


SMOKE = Plan(prompts=1, prompt_tokens=48, gen_tokens=4, batches=(1,), k=2, max_model_len=256)


# ---- workloads ----------------------------------------------------------------------------------
def workloads(tokenizer, plan: Plan, files: list[tuple[str, str]], bos: int = 0) -> dict:
    """{"heldout": [ids], "repeat": [ids]} from held-out (path, text) files, `plan.prompts` each.
    heldout: [bos] + the file's first prompt_tokens tokens. repeat: [bos] + whole lines of the file
    up to about prompt_tokens tokens + the first quarter of those lines again."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    held, rep = [], []
    for _, text in files:
        ids = enc(text)
        if len(ids) < plan.prompt_tokens + plan.gen_tokens:
            continue                                   # too short to continue or to copy from
        lines, body, n = text.splitlines(keepends=True), [], 0
        for line in lines:
            n += len(enc(line))
            if n > plan.prompt_tokens and body:
                break
            body.append(line)
        head = body[: max(1, len(body) // 4)]
        if len(body) < 2:
            continue
        held.append([bos] + ids[: plan.prompt_tokens])
        rep.append([bos] + enc("".join(body) + "\n" + "".join(head)))
        if len(held) == plan.prompts:
            break
    if len(held) < plan.prompts:
        raise ValueError(f"prompts: only {len(held)} held-out files have {plan.prompt_tokens} + "
                         f"{plan.gen_tokens} tokens; asked for {plan.prompts}")
    return {"heldout": held, "repeat": rep}


# ---- measurement --------------------------------------------------------------------------------
def spec_config(method: str, plan: Plan, family: Path):
    if method == "none":
        return None
    out = {"method": "draft" if method == "draft-eager" else method, "num_tokens": plan.k}
    if method in ("draft", "draft-eager"):
        out["model"] = str(family / "draft")
    if method == "eagle3":                              # tools/train_eagle3.py --out DIR/eagle3
        out["model"] = str(family / "eagle3")
    return out


def derive(before: dict, after: dict) -> dict:
    """Engine.stats() deltas -> proposed, accepted, rounds, acceptance rate, tokens per round
    (accepted + one token a round, over rounds); None where the engine reports no such key."""
    d = {key: (after[key] - before.get(key, 0)) if key in after else None for key in COUNTS}
    p, a, r = d["spec_proposed"], d["spec_accepted"], d["spec_rounds"]
    by_k = {k: n - before.get("spec_blocks_by_k", {}).get(k, 0)
            for k, n in after.get("spec_blocks_by_k", {}).items()}
    plain = after.get("spec_plain_blocks", 0) - before.get("spec_plain_blocks", 0)
    wall = after.get("spec_block_wall_s", 0.0) - before.get("spec_block_wall_s", 0.0)
    graph = after.get("spec_block_graph_s", 0.0) - before.get("spec_block_graph_s", 0.0)
    dev = {kind: s - before.get("block_device_s", {}).get(kind, 0.0)
           for kind, s in after.get("block_device_s", {}).items()}
    return {"proposed": p, "accepted": a, "rounds": r, "block_device_s": dev,
            "decode_over_graphs": graph / wall if wall > 0 else None,
            "acceptance": (a / p if p else 0.0) if p is not None and a is not None else None,
            "tokens_per_round": ((a + r) / r if r else None) if a is not None and r is not None else None,
            "blocks_by_k": {k: n for k, n in by_k.items() if n}, "plain_blocks": plain}


def runner_share(st: dict, wall_s: float) -> tuple[float | None, float | None]:
    """From the engine's own block timing (Engine.time_blocks: CUDA events around every launch,
    so each block at its real context and batch) -> (x runner, busy): the device time of the
    decode and speculative blocks over the wall time of the generate calls (prefills included):
    the runner's own rate for exactly the blocks the engine ran, over what the user got; and the
    device time of every block, prefills included, over the same wall (1 - busy: the host's
    share). (None, None) without timing."""
    dev = st.get("block_device_s") or {}
    if not dev or wall_s <= 0:
        return None, None
    return (dev.get("decode", 0.0) + dev.get("spec", 0.0)) / wall_s, sum(dev.values()) / wall_s


def engine_over_runner(st: dict, wall_s: float, costs, bucket: int, rounds: int, steps: int):
    """The engine adds nothing, at capture-time costs (empty slots, so attention at a near-zero
    context; an underestimate wherever attention matters, as on this family): device time of the blocks it ran (each speculative block R rounds
    at its k, each plain block K decode steps, at the executor's measured per-graph costs) over
    the wall time of the generate calls (prefill included): the runner's own round rate x tokens
    per round, for the mix of k the policy chose; >= 0.95 is the target. None without costs."""
    if costs is None or wall_s <= 0 or bucket not in costs.decode_us:
        return None
    us = sum(n * rounds * costs.round_us(bucket, k) for k, n in st["blocks_by_k"].items())
    us += st["plain_blocks"] * steps * costs.step_us(bucket)
    return us / 1e6 / wall_s


def measure(llm, prompts: list, bs: int, gen: int, sampling) -> tuple[float, list, dict]:
    """Generate every prompt in groups of bs: (tokens/s per stream, outputs token ids, stats delta
    with the wall seconds "wall_s")."""
    stats = llm.engine.stats
    before, tokens, wall, outs = stats(), 0, 0.0, []
    for i in range(0, len(prompts) - len(prompts) % bs, bs):
        t0 = time.perf_counter()
        res = llm.generate(prompts[i: i + bs], sampling, use_tqdm=False)
        wall += time.perf_counter() - t0
        tokens += sum(len(r.token_ids) for r in res)
        outs += [list(r.token_ids) for r in res]
    return tokens / (wall * bs), outs, derive(before, stats()) | {"wall_s": wall}


def run_method(method: str, family: Path, plan: Plan, loads: dict, device: str, log) -> list[dict]:
    import torch
    from graphrt import LLM, SamplingParams
    from graphrt.attention.buckets import pick_bucket
    spec = spec_config(method, plan, family)
    sampling = SamplingParams(max_tokens=plan.gen_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    try:
        llm = LLM(str(family / "target"), device=device, max_model_len=plan.max_model_len,
                  max_batch=max(plan.batches), **({} if spec is None else {"speculative": spec}))
    except (TypeError, ValueError) as e:                 # an LLM without speculation: reported
        log(f"{method}: LLM refused: {e!r}")
        return [{"method": method, "error": repr(e)[:300]}]
    build_s = time.perf_counter() - t0
    rows = []
    try:
        llm.generate(loads["heldout"][: max(plan.batches)], SamplingParams(max_tokens=4, ignore_eos=True),
                     use_tqdm=False)                      # warm-up: kernels compiled, graphs replayed
        eng, ex = llm.engine, llm.engine.runtime
        if method == "draft-eager":                       # A/B: the draft's prompt prefill never waits
            eng._draft_choice = lambda slots, fork: {}
        eng.time_blocks = device != "cpu"                 # each block's device time (CUDA events)
        costs = None
        if spec is not None:                              # the policy's measured costs (CUDA graphs)
            costs = eng.policy.graph_costs if getattr(eng, "policy", None) is not None else ex.measure_costs()
        for name, prompts in loads.items():
            for bs in plan.batches:
                tok_s, outs, st = measure(llm, prompts, bs, plan.gen_tokens, sampling)
                capture = engine_over_runner(st, st["wall_s"], costs, pick_bucket(list(ex.caps.config.buckets), bs),
                                             ex.caps.spec_rounds, ex.caps.steps_per_graph)
                ratio, busy = runner_share(st, st["wall_s"])
                rows.append({"method": method, "workload": name, "batch": bs, "k": plan.k if spec else 0,
                             "tok_s_per_stream": tok_s, "build_s": build_s, "outputs": outs,
                             "engine_over_runner": ratio, "device_busy": busy,
                             "engine_over_capture_costs": capture, **st})
                log(f"{method:<6}{name:<9}bs {bs}: {tok_s:9.1f} tok/s/stream  acceptance "
                    f"{_fmt(st['acceptance'])}  tokens/round {_fmt(st['tokens_per_round'])}  "
                    f"blocks by k {st['blocks_by_k']} + {st['plain_blocks']} plain  x runner {_fmt(ratio)}  "
                    f"busy {_fmt(busy)}  x capture costs {_fmt(capture)}  x graphs {_fmt(st['decode_over_graphs'])}")
    finally:
        llm.shutdown()
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def _fmt(x, spec="6.3f"):
    return "   n/a" if x is None else format(x, spec)


def compare(rows: list[dict]) -> None:
    """Speed-up vs method none and outputs identical to none's, per (workload, batch); drops the
    token lists."""
    base = {(r["workload"], r["batch"]): r for r in rows if r.get("method") == "none" and "error" not in r}
    for r in rows:
        b = base.get((r.get("workload"), r.get("batch")))
        if b is not None and "error" not in r:
            r["speedup_vs_none"] = r["tok_s_per_stream"] / b["tok_s_per_stream"]
            r["identical_to_none"] = sum(x == y for x, y in zip(r["outputs"], b["outputs"]))
            r["requests"] = len(r["outputs"])
    for r in rows:
        r.pop("outputs", None)


# ---- the trained family's own step costs: the arithmetic check (CUDA) ----------------------------
def trained_costs(family: Path, plan: Plan) -> list[dict]:
    """Part 1's device µs (bench_spec.bench_model: decode step, verify of k + 1) of the trained
    target and draft checkpoints, at the plan's batch sizes and about its mean context."""
    import torch
    from bench_spec import bench_model
    from graphrt.checkpoint.loader import load_checkpoint
    from graphrt.checkpoint.decoder import build_model
    rows, ctx = [], plan.prompt_tokens + plan.gen_tokens // 2
    for name in ("target", "draft"):
        model = build_model(load_checkpoint(str(family / name), device="cuda", dtype=torch.bfloat16))
        rows += bench_model(f"trained-{name}", list(plan.batches), [1, plan.k + 1], ctx, False, torch,
                            model=model)
        del model
        torch.cuda.empty_cache()
    return rows


def arithmetic(rows: list[dict], costs: list[dict]) -> None:
    """Adds to each spec row the speed-up the round arithmetic predicts from its measured tokens
    per round and the family's measured step costs (tokens_per_round x t_step / (t_verify(k + 1)
    + k x t_draft)), and measured / predicted."""
    from graphrt.speculative.policy import StepCosts
    table = {"ngram": StepCosts.from_bench(costs, "trained-target"),
             "draft": StepCosts.from_bench(costs, "trained-target", draft="trained-draft")}
    for r in rows:
        c, tpr, k = table.get(r.get("method")), r.get("tokens_per_round"), r.get("k", 0)
        if c is None or tpr is None or k < 1 or r["batch"] not in c.decode_us:
            continue
        r["arithmetic_speedup"] = tpr * c.step_us(r["batch"]) / c.round_us(r["batch"], k)
        if "speedup_vs_none" in r:
            r["measured_over_arithmetic"] = r["speedup_vs_none"] / r["arithmetic_speedup"]


# ---- part 3: projection -------------------------------------------------------------------------
def projection(rows: list[dict], part1: list[dict], *, target="llama-3.1-8b", draft="llama-3.2-1b") -> list[dict]:
    """PROJECTION for an 8B target from part-1 costs and part-2 acceptance (see module docstring)."""
    from graphrt.speculative.policy import (StepCosts, batch_rate, best_k, expected_tokens,
                                            fit_acceptance)
    costs = {"ngram": StepCosts.from_bench(part1, target),
             "draft": StepCosts.from_bench(part1, target, draft=draft)}
    out = []
    for r in rows:
        m, tpr, k = r.get("method"), r.get("tokens_per_round"), r.get("k", 0)
        if m not in costs or tpr is None or k < 1:
            continue
        c, bs = costs[m], r["batch"]
        if bs not in c.decode_us:
            continue
        a = fit_acceptance(tpr, k)
        ks = c.ks(bs)
        plain = batch_rate([a] * bs, c, bs, 0)
        fixed = (expected_tokens(a, k) * bs / c.round_us(bs, k) / plain) if k in ks else None
        top = max(ks, key=lambda kk: batch_rate([a] * bs, c, bs, kk))
        pol_k, pol_rate = best_k([a] * bs, c, bs, ks, margin=0.02)
        out.append({"projection": True, "method": m, "workload": r["workload"], "batch": bs,
                    "acceptance_fit": a, "k_measured": k, "speedup_at_k_measured": fixed,
                    "k_best": top, "speedup_at_k_best": batch_rate([a] * bs, c, bs, top) / plain,
                    "policy_k": pol_k, "policy_speedup": pol_rate / plain,
                    "t_step_us": c.step_us(bs), "t_draft_us": c.draft_us.get(bs, 0.0)})
    return out


# ---- output -------------------------------------------------------------------------------------
def table(result: dict) -> str:
    lines = ["part 2 (measured): trained family through LLM, greedy, tokens/s per stream",
             f"{'method':<8}{'workload':<10}{'bs':>3}{'tok/s':>10}{'x none':>8}{'accept':>8}"
             f"{'tok/rnd':>8}{'same':>7}{'x arith':>9}{'x runner':>9}{'busy':>7}{'x graphs':>9}"]
    for r in result["measured"]:
        if "error" in r:
            lines.append(f"{r['method']:<8}error: {r['error'][:80]}")
            continue
        same = f"{r['identical_to_none']}/{r['requests']}" if "identical_to_none" in r else ""
        lines.append(f"{r['method']:<8}{r['workload']:<10}{r['batch']:>3}{r['tok_s_per_stream']:>10.1f}"
                     f"{_fmt(r.get('speedup_vs_none'), '8.2f')}{_fmt(r.get('acceptance'), '8.3f')}"
                     f"{_fmt(r.get('tokens_per_round'), '8.2f')}{same:>7}"
                     f"{_fmt(r.get('arithmetic_speedup'), '9.2f')}{_fmt(r.get('engine_over_runner'), '9.3f')}"
                     f"{_fmt(r.get('device_busy'), '7.3f')}{_fmt(r.get('decode_over_graphs'), '9.3f')}")
    if result["projection_8b"]:
        lines += ["", "part 3: PROJECTION (arithmetic, not measured): 8B target from part-1 8B-shape costs "
                  "and the acceptance above", f"{'method':<8}{'workload':<10}{'bs':>3}{'a fit':>7}"
                  f"{'x @k':>7}{'k*':>4}{'x @k*':>7}{'policy':>8}"]
        for p in result["projection_8b"]:
            lines.append(f"{p['method']:<8}{p['workload']:<10}{p['batch']:>3}{p['acceptance_fit']:>7.3f}"
                         f"{_fmt(p['speedup_at_k_measured'], '7.2f')}{p['k_best']:>4}"
                         f"{p['speedup_at_k_best']:>7.2f}{p['policy_speedup']:>8.2f}")
    return "\n".join(lines)


def plot(result: dict, png: str) -> str:
    plt = pyplot()
    if plt is None:
        return "matplotlib missing: no PNG"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = [r for r in result["measured"] if "error" not in r]
    cells = sorted({(r["workload"], r["batch"]) for r in rows})
    methods = [m for m in ALL_METHODS if any(r["method"] == m for r in rows)]
    w = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        by = {(r["workload"], r["batch"]): r["tok_s_per_stream"] for r in rows if r["method"] == m}
        a1.bar([j + w * (i - (len(methods) - 1) / 2) for j in range(len(cells))], [by.get(c, 0) for c in cells],
               w, label=m)
    a1.set_xticks(range(len(cells)), [f"{w}\nbs {b}" for w, b in cells])
    a1.set(ylabel="tokens/s per stream", title="measured: trained family through LLM")
    a1.legend()
    proj = result["projection_8b"]
    labels = [f"{p['method']}\n{p['workload']} bs{p['batch']}" for p in proj]
    a2.bar(range(len(proj)), [p["policy_speedup"] for p in proj], color="gray")
    a2.axhline(1.0, color="k", lw=0.8)
    a2.set_xticks(range(len(proj)), labels, fontsize=7)
    a2.set(ylabel="speed-up vs plain decode", title="PROJECTION: 8B target (policy's k)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return f"wrote {png}"


def main(args) -> int:
    """args: trained (DIR), smoke, device, out, png, costs (part-1 JSON), methods."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_tiny import read_split
    from transformers import AutoTokenizer
    family = Path(args.trained)
    plan = SMOKE if args.smoke else Plan()
    if getattr(args, "prompts", None):
        if args.prompts < 1:
            print(f"bench_spec: --prompts {args.prompts}: must be >= 1", file=sys.stderr)
            return 2
        plan = dataclasses.replace(plan, prompts=args.prompts)
    if getattr(args, "num_tokens", None) is not None:
        if not 1 <= args.num_tokens <= 16:
            print(f"bench_spec: --num-tokens {args.num_tokens}: must be in [1, 16]", file=sys.stderr)
            return 2
        plan = dataclasses.replace(plan, k=args.num_tokens)
    methods = [m for m in args.methods.split(",") if m]
    if not methods or any(m not in ALL_METHODS for m in methods):
        print(f"bench_spec: --methods {args.methods!r}: choose from {ALL_METHODS}", file=sys.stderr)
        return 2
    missing = [m for m in ("target", "draft") if not (family / m / "config.json").is_file()]
    if "eagle3" in methods and not (family / "eagle3" / "config.json").is_file():
        missing.append("eagle3 (run tools/train_eagle3.py --out DIR/eagle3)")
    if missing:
        print(f"bench_spec: --trained {family}: no {missing} checkpoint (run tools/train_tiny.py)", file=sys.stderr)
        return 2
    log = lambda s: print(s, flush=True)  # noqa: E731
    tok = AutoTokenizer.from_pretrained(str(family / "target"))
    loads = workloads(tok, plan, read_split(True))
    result = {"plan": plan.__dict__ | {"batches": list(plan.batches)}, "device": args.device,
              "family": str(family), "measured": [], "projection_8b": []}
    for m in methods:
        result["measured"] += run_method(m, family, plan, loads, args.device, log)
    compare(result["measured"])
    if args.device == "cuda":
        try:
            result["trained_step_costs"] = trained_costs(family, plan)
            arithmetic(result["measured"], result["trained_step_costs"])
        except Exception as e:  # noqa: BLE001 - reported: the measured rows stand without it
            result["trained_step_costs_error"] = repr(e)[:300]
            log(f"trained step costs: {e!r}")
    costs = Path(args.costs or PART1)
    if costs.is_file():
        result["projection_8b"] = projection(result["measured"], json.loads(costs.read_text())["models"])
        result["projection_costs"] = str(costs)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("\n" + table(result))
    if args.png:
        print(plot(result, args.png))
    return 1 if any("error" in r for r in result["measured"]) else 0
