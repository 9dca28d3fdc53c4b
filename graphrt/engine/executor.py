"""The executor: the engine's one interface to the device, in this process or over ranks.

    ex = LocalExecutor(ModelRuntime(...), spec=SpeculativeRunner.attach(mrt, ...))   # one GPU
    ex = TPDriver(LocalExecutor(rank 0's runtime), control, health=...)   # graphrt/parallel: the
                                                                           # same calls, broadcast
    ex.capture()
    first = ex.prefill_slots(prompts, table, slots, sampling)   # prefill + first draws into the slots
    ex.apply(update)                                            # the input batch's staged changes
    tokens = ex.decode_block(n, sampled=False)                  # [K, n]: K decode steps
    out = ex.spec_block(n, k=2, filtered=False)                 # BlockOutput: R rounds, k in spec_ks

Every call is a pure function of the runtime's slot state (model/slots.py) plus its arguments,
so a tensor-parallel driver can replay the same call on every rank: a single-GPU engine imports
nothing from graphrt/parallel/. Attributes the engine reads: config, k (decode steps per block),
device, num_pages, model, speculative (its SpeculativeConfig or None), rounds, spec_ks (the
proposal counts a speculative block may run: one graph family each; () without speculation).

With a draft model the executor keeps the draft's K/V consistent across a policy's switches: a
plain decode block runs only the target, so the slots it served are marked, and the next
speculative block over a marked slot first re-prefills the draft over that slot's tokens
(SpeculativeRunner.sync_draft: eager, one host read of the lengths, once per switch back on).
"""
from __future__ import annotations

import logging

import torch

from graphrt.model.sampling import SamplingInputs, sample_eager

log = logging.getLogger("graphrt.engine")


class LocalExecutor:
    """runtime: the ModelRuntime (the decode phase, the slots, the graph runner); spec: a
    SpeculativeRunner attached to it (speculative/runner.py), or None."""

    def __init__(self, runtime, spec=None):
        if spec is not None and spec.slots is not runtime.slots:
            raise ValueError("spec: the speculative runner must share the runtime's slots "
                             "(SpeculativeRunner.attach)")
        self.runtime, self.spec = runtime, spec
        self._draft_stale: set[int] = set()   # slots whose draft K/V misses plain-block tokens

    # ---- what the engine reads ----------------------------------------------------------------
    config = property(lambda self: self.runtime.config)
    k = property(lambda self: self.runtime.k)
    device = property(lambda self: self.runtime.device)
    num_pages = property(lambda self: self.runtime.num_pages)
    model = property(lambda self: self.runtime.model)
    graphs = property(lambda self: self.runtime.graphs)
    lock = property(lambda self: self.runtime.lock)
    uses_graphs = property(lambda self: self.runtime.uses_graphs)
    speculative = property(lambda self: None if self.spec is None else self.spec.config)
    rounds = property(lambda self: 0 if self.spec is None else self.spec.rounds)
    spec_ks = property(lambda self: () if self.spec is None else self.spec.ks)
    # a speculative phase whose proposer keeps per-slot device state of its own (a draft model's
    # K/V) has `draft` (with prefill) and `sync_draft(slots)`: it is caught up after plain blocks
    _proposer_state = property(lambda self: getattr(self.spec, "draft", None) is not None)
    history_width = property(lambda self: None if self.runtime.slots.history is None
                             else self.runtime.slots.history.shape[1])

    # ---- calls --------------------------------------------------------------------------------
    def capture(self) -> dict:
        """Every phase's graphs (decode, then speculative rounds: one per bucket, k in spec_ks
        and filtered variant), one pool; {GraphKey: stats}. The speculative graphs' count,
        capture time and pool growth are logged (what the extra k values cost)."""
        stats = self.runtime.capture()
        if self.spec is not None and self.runtime.uses_graphs:
            self.spec.capture()
            stats = dict(self.runtime.graphs.stats)
            spec = [s for key, s in stats.items() if key.phase == "spec"]
            log.info("speculative graphs: %d (buckets %s x k in %s), %.0f ms capture, %.1f MiB",
                     len(spec), list(self.config.buckets), list(self.spec.ks),
                     sum(s.capture_ms + s.warmup_ms for s in spec), sum(s.graph_bytes for s in spec) / 2**20)
        return stats

    def prefill(self, prompts: list[torch.Tensor], block_table: torch.Tensor) -> torch.Tensor:
        """As ModelRuntime.prefill: [m, V] float32 last-token logits."""
        return self.runtime.prefill(prompts, block_table)

    def prefill_slots(self, prompts: list[torch.Tensor], block_table: torch.Tensor, slots: list[int],
                      sampling: SamplingInputs) -> torch.Tensor:
        """Prefill each prompt (row i of block_table, for slot slots[i]), draw its next token
        with sampling's row i (its step is not advanced) and write it as the slot's current
        token (and into its token history at index len(prompt)). With a draft model, the
        draft's caches are prefilled too. Returns the [m] int64 first tokens (device)."""
        logits = self.prefill(prompts, block_table)
        first = sample_eager(logits, sampling)                           # [m] device
        st, dev = self.runtime.slots, self.device
        idx = torch.tensor(slots, device=dev)
        st.tokens.index_copy_(0, idx, first)
        if st.history is not None:
            at = torch.tensor([s * st.history.shape[1] + p.numel() for s, p in zip(slots, prompts)],
                              device=dev)
            st.history.view(-1).index_copy_(0, at, first.to(torch.int32))
        if self._proposer_state:
            self.spec.draft.prefill([p.to(dev) for p in prompts], block_table.to(dev))
            self._draft_stale.difference_update(slots)
        return first

    def apply(self, update) -> None:
        """An input batch's staged changes into the slots (SlotState.apply)."""
        self.runtime.slots.apply(update)

    def decode_block(self, n: int, *, sampled: bool) -> torch.Tensor:
        """K decode steps over slots [0, n) -> [K, n] int64 (a view, valid until the next block)."""
        if self._proposer_state:
            self._draft_stale.update(range(n))
        return self.runtime.decode_slots(n, sampled=sampled)

    def spec_block(self, n: int, *, k: int | None = None, filtered: bool = False):
        """R speculative rounds with k proposals a round (one of spec_ks; default the configured
        num_tokens) over slots [0, n) -> BlockOutput views (speculative/runner.py); filtered:
        some slot uses top_k / top_p."""
        if self.spec is None:
            raise ValueError("spec_block: this executor was built without speculation")
        if self._draft_stale:
            stale = sorted(s for s in self._draft_stale if s < n)
            self.spec.sync_draft(stale)
            self._draft_stale.difference_update(stale)
        return self.spec.run(n, k=k, filtered=filtered)

    def measure_costs(self, *, replays: int = 10):
        """Device µs of one plain decode step and one speculative round per bucket and k in
        spec_ks, timed with CUDA events around replays of the captured graphs on empty slots
        (fixed-shape graphs: the GEMMs, which dominate at low batch, cost the same) ->
        speculative/policy.py's StepCosts (verify_us[b][k + 1] = a whole round at k: proposer,
        draft and verify), or None without captured graphs (CPU) or without the policy module."""
        rt, spec = self.runtime, self.spec
        if spec is None or not rt.uses_graphs or not rt.graphs.keys():
            return None
        try:
            from graphrt.speculative.policy import StepCosts
        except ImportError:
            return None
        decode, verify = {}, {}
        with rt.lock:
            for b in rt.config.buckets:
                decode[b] = _time_us(lambda: rt.decode_slots(b, sampled=False), replays) / rt.k
                verify[b] = {k + 1: _time_us(lambda k=k: spec.run(b, k=k, filtered=False), replays) / spec.rounds
                             for k in spec.ks}
        return StepCosts(decode_us=decode, verify_us=verify)

    def check_device_errors(self) -> None:
        self.runtime.check_device_errors()


def _time_us(fn, replays: int) -> float:
    """Mean µs of fn() on the current CUDA stream (one warm-up call first)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


__all__ = ["LocalExecutor"]
