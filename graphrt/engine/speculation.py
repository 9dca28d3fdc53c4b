"""Speculative decoding for the engine: the runner beside a ModelRuntime (and its draft model).

    runner = build_runner(mrt, SpeculativeConfig(method="ngram", num_tokens=4), rounds=4,
                          dtype="bfloat16", target=checkpoint)
    executor = LocalExecutor(mrt, runner)

Method "ngram" needs nothing more than the runtime's token history; method "eagle3" loads the
head with engine/eagle_load.py (its prefill and rounds: speculative/eagle3/phase.py). Method "draft" loads the
draft checkpoint like the target (engine/loader.py, same dtype and device), checks that it shares
the target's vocabulary, and gives it its own paged KV caches with the target's page ids (the
same pool size, its own geometry), so the scheduler's pages serve both models.

The engine's per-block bookkeeping lives here too: a block's tokens per request, the cumulative
proposal / acceptance counts behind Engine.stats() and /metrics, and what the policy
(speculative/policy.py: plain decode or speculation, per block) is told after each block.
"""
from __future__ import annotations

import logging
import time

import numpy as np
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
    from graphrt.engine.loader import load_checkpoint
    from graphrt.engine.model import build_model
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
    model = build_model(ck, max_positions=c.max_context_len)
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
    counts of its rows are added to `counts`. numpy views of the host tensors (no torch op per
    row: this runs on the loop thread once per block)."""
    tokens, em, prop = block.tokens.numpy(), block.emitted.numpy(), block.proposed.numpy()
    keep = np.arange(tokens.shape[2])[None, None, :] < em[:, :, None]      # [R, cols, k + 1]
    cols = [tokens[:, c][keep[:, c]].tolist() for c in range(em.shape[1])]   # rounds in order
    live = [c for _, c, _, _ in block.rows]
    sub = em[:, live]
    counts["proposed"] += int(prop[:, live].sum())
    counts["accepted"] += int(np.maximum(sub - 1, 0).sum())
    counts["rounds"] += int((sub > 0).sum())
    counts["emitted"] += int(sub.sum())
    by_k = counts.setdefault("by_k", {})                   # blocks finished per k (the policy's mix)
    by_k[block.spec_k] = by_k.get(block.spec_k, 0) + 1
    return cols


def observe(policy, block) -> None:
    """The policy sees each live row's counts of a speculative block, or a plain decode block."""
    if block.kind == "prefill":
        return
    live = [(req.slot, c) for req, c, epoch, _ in block.rows
            if req.finish_reason is None and req.epoch == epoch and req.slot >= 0]
    if block.kind == "decode":
        policy.observe_plain([slot for slot, _ in live])
        return
    em, prop = block.emitted.numpy(), block.proposed.numpy()
    for slot, c in live:
        e = em[:, c]
        policy.observe(slot, proposed=int(prop[:, c].sum()), accepted=int(np.maximum(e - 1, 0).sum()),
                       rounds=int((e > 0).sum()), k=block.spec_k)


class BlockClock:
    """The loop's cadence per block kind, told to the policy (`SpecPolicy.observe_wall`): the
    wall time from one decode launch to the next is charged to the first block (its host work,
    the previous block's read-back under overlap, a draft catch-up before it), per round (spec,
    k >= 1) or per step (plain, k = 0). An interval with a prefill in it, or after an idle loop,
    is not charged (it measures the prefill or the wait, not the block).
    Totals over the charged intervals (the decode phase only: what the engine adds per block):
    wall_s, their wall time; graph_s, the same blocks at the policy's measured graph costs
    (`graph_costs`, CUDA graphs; 0 without them). graph_s / wall_s ~ 1: the loop adds nothing."""

    def __init__(self, policy=None):
        self.policy, self._last, self._clean = policy, None, False
        self.wall_s = self.graph_s = 0.0

    def launched(self, policy, bucket: int, k: int, units: int) -> None:
        """A decode block (k proposals a round, 0 = plain; `units` rounds or steps) chosen by
        `policy` is about to launch at this bucket. A policy without observe_wall is told nothing;
        a new policy starts a new interval."""
        now = time.perf_counter()
        if not hasattr(policy, "observe_wall"):
            self._last = None
            return
        if self._last is not None and self._clean and policy is self.policy:
            b, kk, n, t0 = self._last
            if now > t0 and n > 0:                       # a clock that did not advance says nothing
                policy.observe_wall(b, kk, (now - t0) * 1e6 / n)
                costs = getattr(policy, "graph_costs", None)
                if costs is not None:
                    self.wall_s += now - t0
                    self.graph_s += n * (costs.round_us(b, kk) if kk else costs.step_us(b)) / 1e6
        self.policy, self._last, self._clean = policy, (bucket, k, units, now), True

    def interrupted(self) -> None:
        """A prefill ran, or the loop went idle: the running interval is not a block's."""
        self._clean = False


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


def default_policy(executor):
    """The speculation policy over the executor's measured step costs (CUDA graphs only), or
    None (speculate every block) where nothing can be measured or the policy module is absent,
    and for EAGLE-3 (its head must see every token: a plain block would leave it behind)."""
    if executor.speculative.method == "eagle3":
        return None
    measure = getattr(executor, "measure_costs", None)
    costs = measure() if measure is not None else None
    if costs is None:
        return None
    try:
        from graphrt.speculative.policy import SpecPolicy
    except ImportError:
        log.warning("engine: graphrt/speculative/policy.py not found; speculating every block")
        return None
    ks = getattr(executor, "spec_ks", ()) or (executor.speculative.num_tokens,)
    return SpecPolicy(costs, ks=ks, max_slots=executor.config.max_batch)


__all__ = ["build_runner", "load_draft", "spec_columns", "observe", "spec_stats", "default_policy",
           "BlockClock"]
