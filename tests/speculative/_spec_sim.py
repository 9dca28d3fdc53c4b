"""CPU simulation of the speculation policy in the engine loop (draft method, measured H200 costs).

Drives the real SpecPolicy (speculative/policy.py) and the real BlockClock (engine/speculation.py,
on a simulated clock) through a model of Engine._step under overlap (depth 1: block N is launched,
then block N - 1 is read): per-token Bernoulli acceptance a, R rounds a spec block, K steps a
plain block, the draft's catch-up (a host read that drains the stream, then an eager prefill) at
a plain -> spec switch, the draft's prefill of each admitted prompt, the forced k = ks[0] block
when a K-step block would run a row past max_tokens. Reports tokens/s of the draft method over
the same workload without speculation (prefills included, as LLM.generate measures it).

    python tests/speculative/_spec_sim.py                 # table; --json PATH for the rows
    python tests/speculative/_spec_sim.py --costs docs/results/spec_trained_h100.json --seeds 8

The costs (µs) come from tools/device/engine_gaps.py on the H200 (/work/engine_gaps.json, draft
row) and the bench's plain rows; `Costs` names each one and where it was read. A projection of
the engine, not a measurement: confirm on the GPU.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphrt.engine import speculation                       # noqa: E402
from graphrt.speculative.policy import SpecPolicy, StepCosts  # noqa: E402


@dataclass(frozen=True)
class Costs:
    """Device and host µs. graph_*: the policy's measured graph costs (engine_gaps policy entry);
    *_factor: realized steady GPU cost per graph cost in the engine (plain: the 'none' row's 554 µs
    a token less its prefill share, over its 458 µs graph; spec: the steady '1:2' wall 872 over
    740); host_*: per-block host work (engine_gaps phases); prefill_us: the target's prefill of
    an admitted batch ('none' row: 254 µs/block x 32 blocks); draft_prefill_us: the draft's
    extra prefill (573.5 x 22 - 254.1 x 32); catchup_us: the draft's catch-up after plain blocks
    (eager prefill of <= 64 tokens after a stream drain: an estimate, not measured)."""
    graph_step: dict = field(default_factory=lambda: {1: 458.0, 4: 450.8})
    graph_round: dict = field(default_factory=lambda: {1: {1: 616.6, 2: 740.5, 4: 987.4},
                                                       4: {1: 613.2, 2: 747.8, 4: 997.2}})
    plain_factor: float = 1.07
    spec_factor: float = 1.18
    host_pre: float = 100.0          # flush, grow, choose (before the clock's stamp)
    host_launch_plain: float = 30.0
    host_launch_spec: float = 450.0
    host_finish_plain: float = 30.0
    host_finish_spec: float = 170.0
    prefill_us: float = 8131.0
    draft_prefill_us: float = 4486.0
    catchup_us: float = 2000.0


class SimClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t * 1e-6                                  # seconds, as time.perf_counter


@dataclass
class _Block:
    kind: str
    k: int
    done: float
    rows: list                  # (row, counted, emitted, proposed, accepted, rounds)
    forced: bool = False


def _clock(policy, now, overlap=True):
    try:
        return speculation.BlockClock(None, now=now, depth=1 if overlap else 0)
    except TypeError:                                          # the clock before `now=`
        speculation.time = type("T", (), {"perf_counter": staticmethod(now)})
        return speculation.BlockClock(None)


def trained_costs(path: str | Path, **kw) -> Costs:
    """Costs with the graph costs of a GPU run of tools/bench_spec.py --trained (its
    `trained_step_costs` rows: the target's decode and verify, the draft's decode step), the
    realized factors and host costs of `Costs`. A round at k is verify(k + 1) + k draft steps;
    a verify length the run did not measure is interpolated linearly in q between its neighbours."""
    rows = json.loads(Path(path).read_text())["trained_step_costs"]
    target = {r["batch"]: r for r in rows if r["model"] == "trained-target"}
    draft = {r["batch"]: r["decode_us"] for r in rows if r["model"] == "trained-draft"}
    step, rounds = {}, {}
    for b, r in sorted(target.items()):
        v = {int(q): us for q, us in r["verify_us"].items()}
        v.setdefault(1, r["decode_us"])
        qs = sorted(v)

        def verify(q):
            lo = max(x for x in qs if x <= q)
            hi = min((x for x in qs if x >= q), default=lo)
            return v[lo] if hi == lo else v[lo] + (v[hi] - v[lo]) * (q - lo) / (hi - lo)
        step[b] = r["decode_us"]
        rounds[b] = {k: verify(k + 1) + k * draft[b] for k in (1, 2, 4)}
    return Costs(graph_step=step, graph_round=rounds, **kw)


def run(method: str, a: float, bs: int, *, waves: int, tokens: int, costs: Costs, seed: int,
        R: int = 4, K: int = 4, ks=(1, 2, 4), policy_kw=None, lazy_prefill: bool = True) -> dict:
    """One workload: `waves` batches of bs requests admitted together, `tokens` each.
    lazy_prefill (the engine's rule, engine/blocks.py `_draft_choice`): the draft's prefill of a
    batch the policy starts on plain decode is skipped; the batch's first catch-up then prefills
    the draft over the whole context (draft_prefill_us on top of catchup_us)."""
    rng = random.Random(seed)
    now = SimClock()
    step_costs = StepCosts(decode_us=dict(costs.graph_step),
                           verify_us={b: {k + 1: us for k, us in r.items()} for b, r in costs.graph_round.items()})
    spec = method == "draft"
    pol = SpecPolicy(step_costs, ks=ks, max_slots=bs, **(policy_kw or {})) if spec else None
    clock = _clock(pol, now) if spec else None
    new = spec and hasattr(pol, "start_k")      # the engine after the fix: lazy draft prefill, forced blocks
    #                                             without catch-up and unobserved
    gpu = 0.0
    stats = {"spec_blocks": 0, "plain_blocks": 0, "forced": 0, "catchups": 0, "draft_prefills": 0, "by_k": {}}
    total_tokens = 0
    b = bs
    for _ in range(waves):
        now.t = max(now.t, gpu)                               # the prefill's host read drains the stream
        if clock is not None:
            clock.interrupted()
        now.t += costs.prefill_us
        stale = [False] * bs
        if spec:
            start = getattr(pol, "start_k", None)
            for s in range(bs):
                pol.admit(s)
            skip = new and lazy_prefill and start(b) == 0
            unprefilled = skip
            if skip:
                stale = [True] * bs
                if hasattr(pol, "owe"):                       # what the engine tells it: the skipped prefill
                    for s in range(bs):
                        pol.owe(s, costs.draft_prefill_us / bs)
            else:
                now.t += costs.draft_prefill_us
                stats["draft_prefills"] += 1
        gpu = now.t
        launched, emitted = [1] * bs, [1] * bs                # the prefill drew each first token
        done = [False] * bs
        pending: deque = deque()
        while not all(done) or pending:
            rows = [s for s in range(bs) if not done[s]]
            if rows:
                now.t += costs.host_pre
                k, forced = 0, False
                if spec:
                    k = pol.choose(rows, bucket=b).k
                    if new and all(launched[s] >= tokens for s in rows):
                        rows = []                             # every row at its limit: read first
                    elif not k and any(launched[s] + (1 if new else K) > tokens for s in rows):
                        k, forced = ks[0], True
                    if rows:
                        clock.launched(pol, b, k, R if k else K)
                if not rows:
                    pass
                elif k:
                    if any(stale[s] for s in rows) and not (forced and new):
                        now.t = max(now.t, gpu)               # sync_draft's host read, then eager prefill
                        now.t += costs.catchup_us
                        if unprefilled:                       # the skipped prefill, now over the context
                            now.t += costs.draft_prefill_us
                            unprefilled = False
                        gpu = now.t
                        stats["catchups"] += 1
                        stale = [False] * bs
                    now.t += costs.host_launch_spec
                    gpu = max(gpu, now.t) + R * costs.graph_round[b][k] * costs.spec_factor
                    out = []
                    for s in rows:
                        counted = min(R * (k + 1), tokens - launched[s])
                        em = acc = rnd = 0
                        p = 0.0 if stale[s] else a
                        for _ in range(R):
                            if em >= counted:
                                break
                            n = 0
                            while n < k and rng.random() < p:
                                n += 1
                            got = min(n + 1, counted - em)
                            em += got
                            acc += got - 1
                            rnd += 1
                        launched[s] += counted
                        out.append((s, counted, em, R * k if rnd else 0, acc, rnd))
                    pending.append(_Block("spec", k, gpu, out, forced))
                    stats["spec_blocks"] += 1
                    stats["by_k"][k] = stats["by_k"].get(k, 0) + 1
                    stats["forced"] += forced
                else:
                    now.t += costs.host_launch_plain
                    gpu = max(gpu, now.t) + K * costs.graph_step[b] * costs.plain_factor
                    for s in rows:
                        launched[s] += K
                        stale[s] = True
                    pending.append(_Block("plain", 0, gpu, [(s, K, K, 0, 0, 0) for s in rows]))
                    stats["plain_blocks"] += 1
            if not rows and clock is not None:
                clock.interrupted()
            while len(pending) > (1 if rows else 0):          # overlap: read block N - 1
                blk = pending.popleft()
                now.t = max(now.t, blk.done)
                now.t += costs.host_finish_spec if blk.kind == "spec" else costs.host_finish_plain
                for s, counted, em, prop, acc, rnd in blk.rows:
                    if done[s]:
                        continue
                    if blk.kind == "spec":
                        launched[s] -= counted - em
                    got = min(em, tokens - emitted[s])
                    emitted[s] += got
                    total_tokens += got
                    if spec:
                        if blk.kind == "spec" and not (blk.forced and new):
                            pol.observe(s, proposed=prop, accepted=acc, rounds=rnd, k=blk.k)
                        else:
                            pol.observe_plain([s])
                    if emitted[s] >= tokens:
                        done[s] = True
                        if spec:
                            pol.release(s)
        now.t = max(now.t, gpu)
    total_tokens += waves * bs                                # the first tokens
    stats["time_us"] = now.t
    stats["tok_s"] = total_tokens / now.t * 1e6
    if spec:
        stats["walls"] = {f"{bb}:{kk}": round(us) for (bb, kk), us in pol._wall.items()}
    return stats


def table(acceptances, batches, *, seeds: int, waves: int, tokens: int, costs: Costs,
          policy_kw=None) -> list[dict]:
    """One row per (bs, a): the draft method's tokens/s over plain decode's (x_plain), mean of seeds;
    policy_kw: SpecPolicy keywords."""
    rows = []
    for bs in batches:
        base = sum(run("none", 0.0, bs, waves=waves, tokens=tokens, costs=costs, seed=s)["tok_s"]
                   for s in range(seeds)) / seeds
        for a in acceptances:
            rs = [run("draft", a, bs, waves=waves, tokens=tokens, costs=costs, seed=s, policy_kw=policy_kw)
                  for s in range(seeds)]
            tok = sum(r["tok_s"] for r in rs) / seeds
            by_k: dict = {}
            for r in rs:
                for k, n in r["by_k"].items():
                    by_k[k] = by_k.get(k, 0) + n / seeds
            rows.append({"bs": bs, "a": a, "x_plain": tok / base, "tok_s": tok, "plain_tok_s": base,
                         "spec_blocks": sum(r["spec_blocks"] for r in rs) / seeds,
                         "plain_blocks": sum(r["plain_blocks"] for r in rs) / seeds,
                         "forced": sum(r["forced"] for r in rs) / seeds,
                         "catchups": sum(r["catchups"] for r in rs) / seeds,
                         "draft_prefills": sum(r["draft_prefills"] for r in rs) / seeds,
                         "by_k": {k: round(v, 1) for k, v in sorted(by_k.items())},
                         "walls_seed0": rs[0].get("walls")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--waves", type=int, default=6, help="batches of bs requests admitted together")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--catchup-us", type=float, default=Costs.catchup_us)
    ap.add_argument("--costs", metavar="JSON", help="graph costs from a GPU run of tools/bench_spec.py --trained "
                    "(e.g. docs/results/spec_trained_h100.json); default: the engine_gaps H200 table")
    ap.add_argument("--policy", default="{}", metavar="JSON",
                    help='SpecPolicy keywords, e.g. \'{"prior_trusted": false, "probe_budget": 0.03}\' '
                         "(engine.speculation.default_policy's for a draft model)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    try:
        policy_kw = json.loads(a.policy)
    except json.JSONDecodeError as e:
        ap.error(f"--policy: not JSON ({e})")
    if not isinstance(policy_kw, dict):
        ap.error(f"--policy: expected a JSON object, got {a.policy!r}")
    costs = trained_costs(a.costs, catchup_us=a.catchup_us) if a.costs else Costs(catchup_us=a.catchup_us)
    accs = [round(0.1 * i, 1) for i in range(1, 10)]
    rows = table(accs, (1, 4), seeds=a.seeds, waves=a.waves, tokens=a.tokens, costs=costs, policy_kw=policy_kw)
    print(f"{'bs':>3} {'a':>4} {'x plain':>8} {'spec':>6} {'plain':>6} {'forced':>6} {'catchup':>7} "
          f"{'dprefill':>8}  by_k")
    for r in rows:
        print(f"{r['bs']:>3} {r['a']:>4} {r['x_plain']:>8.3f} {r['spec_blocks']:>6.1f} {r['plain_blocks']:>6.1f} "
              f"{r['forced']:>6.1f} {r['catchups']:>7.1f} {r['draft_prefills']:>8.1f}  {r['by_k']} {r['walls_seed0']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"costs": costs.__dict__, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
