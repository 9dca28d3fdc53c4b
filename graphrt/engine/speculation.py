"""Speculative decoding for the engine: the runner beside a ModelRuntime (and its draft model).

    runner = build_runner(mrt, SpeculativeConfig(method="ngram", num_tokens=4), rounds=4,
                          dtype="bfloat16", target=checkpoint)
    executor = LocalExecutor(mrt, runner)

Method "ngram" needs nothing more than the runtime's token history; method "eagle3" loads the
head with engine/eagle_load.py (its prefill and rounds: speculative/eagle3/phase.py). Method "draft" loads the
draft checkpoint like the target (graphrt/checkpoint/loader.py, same dtype and device), checks that it shares
the target's vocabulary, and gives it its own paged KV caches with the target's page ids (the
same pool size, its own geometry), so the scheduler's pages serve both models.

The engine's per-block bookkeeping lives here too: a block's tokens per request, the cumulative
proposal / acceptance counts behind Engine.stats() and /metrics, and what the policy
(speculative/policy.py: plain decode or speculation, per block) is told after each block.
"""
from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger("graphrt.engine")


def build_runner(mrt, spec, *, rounds: int, dtype: str, target=None):
    """A SpeculativeRunner attached to mrt (its slots, graph runner, device-error flags), with
    top-k / top-p support (the filtered graphs)."""
    from graphrt.speculative.runner import SpeculativeRunner
    draft = eagle = None
    if spec.method == "draft":
        draft = load_draft(mrt, spec, dtype=dtype, target=target)
    elif spec.method == "eagle3":                     # an EAGLE-3 head (engine/eagle_load.py)
        from graphrt.engine.eagle_load import load_eagle3_phase
        eagle = load_eagle3_phase(mrt, spec)
    return SpeculativeRunner.attach(mrt, spec, rounds=rounds, draft=draft, filtered=True, eagle=eagle)


def load_draft(mrt, spec, *, dtype: str, target=None):
    """The draft model of spec.draft_model as a DraftProposer over caches indexed like mrt's."""
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.checkpoint.loader import load_checkpoint
    from graphrt.checkpoint.decoder import build_model
    from graphrt.speculative.draft import DraftProposer
    try:
        ck = load_checkpoint(spec.draft_model, device=mrt.device, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise ValueError(f"speculative.model: cannot load the draft checkpoint {spec.draft_model!r}: {e}") from e
    vocab = mrt.model.spec.vocab_size
    if ck.spec.vocab_size != vocab:
        raise ValueError(f"speculative.model: the draft's vocab_size {ck.spec.vocab_size} differs from "
                         f"the target's {vocab} (they must share a tokenizer)")
    c = mrt.config
    # the target's kernel set where it asked for Triton's (the default resolves per model: an FP8
    # draft falls back to Triton by itself)
    kernels = mrt.model.kernels if mrt.model.kernels == "triton" else None
    model = build_model(ck, max_positions=c.max_context_len, kernels=kernels)
    s = ck.spec
    rc = c.replace(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                   kv_cache_dtype="auto")   # the draft's own cache: model dtype (no scales to calibrate)
    caches = [PagedKVCache.allocate(rc, mrt.num_pages, mrt.device, seed=c.seed + 1000 + i)
              for i in range(s.num_layers)]
    from graphrt.model.prefill import PrefillAttention
    from graphrt.model.prefill_graphs import PrefillGraphs
    graphed = mrt.prefill_graphs                  # the target's: the draft's graphs take its size
    return DraftProposer(model, caches, spec.num_tokens, max_len=c.max_context_len,
                         attention=PrefillAttention(rc, mrt.device, workspace_mb=64),
                         prefill_tokens=mrt.prefill_chunk_tokens,
                         prefill_graphs=None if graphed is None else
                         PrefillGraphs(model, rc, mrt.device, max_tokens=graphed.max_tokens, phase="draft_prefill"))


# ---- the engine's per-block speculation bookkeeping (host, loop thread) ---------------------------
def spec_columns(block, counts: dict) -> list[list[int]]:
    """A speculative block's tokens per column (host tensors: tokens [R, cols, k + 1], emitted
    and proposed [R, cols]): the emitted ones, rounds in order; the block's proposal / acceptance
    counts of its rows are added to `counts`, and its per-column counts kept in
    `block.col_counts` (for `observe`); its log-probs (block.logprobs: [R, cols, k + 1(, N)] host
    tensors, or None) are laid out as a plain block's, [S, cols(, N)] with each column's emitted
    tokens first in order (`column_logprobs`). Three tolist() calls, then list slices: at these
    sizes (R * cols <= a few hundred) each numpy call costs more than the whole walk (loop thread,
    once per block)."""
    toks, em = block.tokens.tolist(), block.emitted.tolist()     # [R][cols][k + 1], [R][cols]
    cols = []
    for c in range(len(em[0]) if em else 0):
        col = []
        for tr, er in zip(toks, em):
            e = er[c]
            if e > 0:
                col += tr[c][:e]
        cols.append(col)
    per = block.col_counts = _col_counts(em, block.proposed.tolist())
    live = [c for _, c, _, _ in block.rows]
    for key, values in zip(("proposed", "accepted", "rounds", "emitted"), per):
        counts[key] += sum(values[c] for c in live)
    by_k = counts.setdefault("by_k", {})                   # blocks finished per k (the policy's mix)
    by_k[block.spec_k] = by_k.get(block.spec_k, 0) + 1
    if block.logprobs is not None:
        block.logprobs = column_logprobs(block.logprobs, block.emitted)
    return cols


def column_logprobs(lp: tuple, emitted: torch.Tensor) -> tuple:
    """A speculative block's log-probs (token [R, cols, Q], rank [R, cols, Q], ids [R, cols, Q, N],
    vals [R, cols, Q, N] host tensors; entry (r, c, j) of round r's j-th token) -> the plain block
    layout [S = R * Q, cols(, N)]: column c's emitted tokens (emitted [R, cols], rounds in order,
    the first emitted[r, c] of each) first, in the order spec_columns lists them."""
    r, cols, q = lp[0].shape
    keep = torch.arange(q)[None, None, :] < emitted[:, :, None]              # [R, cols, Q]
    flat = keep.permute(1, 0, 2).reshape(cols, r * q)                       # [cols, R * Q]
    order = torch.argsort((~flat).to(torch.int8), dim=1, stable=True)       # kept entries first
    out = []
    for t in lp:
        x = t.transpose(0, 1).reshape(cols, r * q, *t.shape[3:])             # [cols, R * Q(, N)]
        idx = order if x.dim() == 2 else order[:, :, None].expand(-1, -1, x.shape[2])
        out.append(x.gather(1, idx).transpose(0, 1))                         # [R * Q, cols(, N)]
    return tuple(out)


def _col_counts(em: list, prop: list) -> tuple[list[int], ...]:
    """Per column of a block's emitted / proposed counts ([R][cols] lists): (proposed, accepted
    (emitted - 1 where positive), rounds with an emission, emitted), summed over the rounds."""
    em_cols = list(zip(*em))
    return ([sum(c) for c in zip(*prop)], [sum(e - 1 for e in c if e > 1) for c in em_cols],
            [sum(1 for e in c if e > 0) for c in em_cols], [sum(c) for c in em_cols])


def observe(policy, block) -> None:
    """The policy sees each live row's counts of a speculative block, or a plain decode block."""
    if block.kind == "prefill":
        return
    live = [(req.slot, c) for req, c, epoch, _ in block.rows
            if req.finish_reason is None and req.epoch == epoch and req.slot >= 0]
    if block.kind == "decode":
        policy.observe_plain([slot for slot, _ in live])
        return
    per = getattr(block, "col_counts", None)               # spec_columns' (same block), or anew
    proposed, accepted, rounds, _ = per if per is not None else \
        _col_counts(block.emitted.tolist(), block.proposed.tolist())
    k = block.spec_k
    for slot, c in live:
        policy.observe(slot, proposed=proposed[c], accepted=accepted[c], rounds=rounds[c], k=k)


class BlockClock:
    """The loop's cadence per block kind, told to the policy (`SpecPolicy.observe_wall`, per round
    for spec blocks (k >= 1), per step for plain ones (k = 0)). Under overlap (`depth` 1: block N
    is launched, then block N - 1 is read) the interval from launch N to launch N + 1 is block
    N - 1's (the host waits for it inside); without overlap (depth 0) it is block N's. An
    interval is charged only in the steady state: the block it waited for, the one before it and
    the one launched at its start have the same (bucket, k), so a plain block is never charged a
    spec block's tail nor a switch's catch-up. The interval in which a spec block was launched
    after a plain one, less the steady wall of the block it waited for, is the switch's cost (a
    draft's catch-up: its stream drain and eager prefill), told to `observe_switch` where the
    policy has it. An interval with a prefill in it, or after
    an idle loop, is not charged, nor are the blocks launched before it.
    Totals over the charged intervals (the decode phase only: what the engine adds per block):
    wall_s, their wall time; graph_s, the same blocks at the policy's measured graph costs
    (`graph_costs`, CUDA graphs; 0 without them). graph_s / wall_s ~ 1: the loop adds nothing.
    now: the clock (seconds; time.perf_counter)."""

    def __init__(self, policy=None, *, now=time.perf_counter, depth: int = 1):
        if depth not in (0, 1):
            raise ValueError(f"depth: the blocks in flight while one is read must be 0 or 1, got {depth!r}")
        self.policy, self.now, self.depth = policy, now, depth
        self._t, self._run = None, []       # the last launch's time; blocks (bucket, k, units) since a reset
        self.wall_s = self.graph_s = 0.0

    def launched(self, policy, bucket: int, k: int, units: int) -> None:
        """A decode block (k proposals a round, 0 = plain; `units` rounds or steps) chosen by
        `policy` is about to launch at this bucket. A policy without observe_wall is told nothing;
        a new policy starts a new interval."""
        now = self.now()
        if not hasattr(policy, "observe_wall") or policy is not self.policy:
            self._t, self._run = None, []
        run = self._run
        if self._t is not None and now > self._t and len(run) >= self.depth + 2:
            b, kk, n = run[-1 - self.depth]                  # the block this interval waited for
            us = (now - self._t) * 1e6
            if all(r == run[-1] for r in run[-2 - self.depth:]) and n > 0:   # steady: no switch in it
                policy.observe_wall(b, kk, us / n)
                costs = getattr(policy, "graph_costs", None)
                if costs is not None:
                    self.wall_s += us / 1e6
                    self.graph_s += n * (costs.round_us(b, kk) if kk else costs.step_us(b)) / 1e6
            elif run[-1][1] and not run[-2][1] and hasattr(policy, "observe_switch"):
                steady = policy.realized_us(b, kk)       # this interval launched a plain -> spec switch
                if steady is not None:
                    policy.observe_switch(run[-1][0], max(0.0, us - n * steady))
        self.policy = policy if hasattr(policy, "observe_wall") else None
        self._t = now if self.policy is not None else None
        if self.policy is not None:
            run.append((bucket, k, units))
            del run[:-(self.depth + 2)]

    def interrupted(self) -> None:
        """A prefill ran, or the loop went idle: the running interval is not a block's, and the
        blocks in flight overlapped it."""
        self._t, self._run = None, []


def spec_stats(counts: dict, clock: BlockClock | None = None) -> dict:
    """Engine.stats()'s speculation keys from the cumulative counts (and the block clock's totals:
    spec_block_wall_s, spec_block_graph_s)."""
    c = dict(counts)
    timing = {} if clock is None else {"spec_block_wall_s": clock.wall_s, "spec_block_graph_s": clock.graph_s}
    return {"spec_proposed": c["proposed"], "spec_accepted": c["accepted"], "spec_rounds": c["rounds"],
            "spec_emitted": c["emitted"], "spec_blocks": c["blocks"], "spec_plain_blocks": c["plain_blocks"],
            "spec_acceptance_rate": c["accepted"] / c["proposed"] if c["proposed"] else 0.0,
            "spec_tokens_per_round": c["emitted"] / c["rounds"] if c["rounds"] else 0.0,
            "spec_blocks_by_k": dict(c.get("by_k", {})), **timing}


def default_policy(executor, caps):
    """The speculation policy over the executor's measured step costs (CUDA graphs only), or
    None (speculate every block) where nothing can be measured or the policy module is absent,
    and for EAGLE-3 (its head must see every token: a plain block would leave it behind).
    caps: the executor's Capabilities."""
    if caps.speculative.method == "eagle3":
        return None
    costs = executor.measure_costs()
    if costs is None:
        return None
    try:
        from graphrt.speculative.policy import SpecPolicy
    except ImportError:
        log.warning("engine: graphrt/speculative/policy.py not found; speculating every block")
        return None
    # a draft model: the prior is not trusted (rows start plain until a probe, paid from 3% of the
    # plain blocks' time with the drafts' skipped prefill on top, measures the acceptance): a cold
    # start with a poor draft otherwise pays its prefill and a dozen exploratory blocks
    # (docs/NOTES.md, "a cold start that cannot lose")
    draft = caps.draft_state
    return SpecPolicy(costs, ks=caps.spec_ks, max_slots=caps.config.max_batch, rounds=caps.spec_rounds,
                      steps=caps.steps_per_graph, prior_trusted=not draft, probe_budget=0.03 if draft else 0.01)


__all__ = ["build_runner", "load_draft", "spec_columns", "column_logprobs", "observe", "spec_stats", "default_policy",
           "BlockClock"]
