"""The executor: the engine's one interface to the device, in this process or over ranks.

    ex = LocalExecutor(ModelRuntime(...), spec=SpeculativeRunner.attach(mrt, ...))   # one GPU
    ex = TPDriver(LocalExecutor(rank 0's runtime), control, health=...)   # graphrt/parallel: the
                                                                           # same calls, broadcast
    ex.capture()
    first = ex.prefill_slots(prompts, table, slots, sampling)   # prefill + first draws into the slots
    ex.apply(update)                                            # the input batch's staged changes
    tokens = ex.decode_block(n, sampled=False)                  # [K, n]: K decode steps
    out = ex.spec_block(n, filtered=False)                      # BlockOutput: R speculative rounds

Every call is a pure function of the runtime's slot state (model/slots.py) plus its arguments,
so a tensor-parallel driver can replay the same call on every rank: a single-GPU engine imports
nothing from graphrt/parallel/. Attributes the engine reads: config, k (decode steps per block),
device, num_pages, model, speculative (its SpeculativeConfig or None), rounds.
"""
from __future__ import annotations

import torch

from graphrt.model.sampling import SamplingInputs, sample_eager


class LocalExecutor:
    """runtime: the ModelRuntime (the decode phase, the slots, the graph runner); spec: a
    SpeculativeRunner attached to it (speculative/runner.py), or None."""

    def __init__(self, runtime, spec=None):
        if spec is not None and spec.slots is not runtime.slots:
            raise ValueError("spec: the speculative runner must share the runtime's slots "
                             "(SpeculativeRunner.attach)")
        self.runtime, self.spec = runtime, spec

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
    history_width = property(lambda self: None if self.runtime.slots.history is None
                             else self.runtime.slots.history.shape[1])

    # ---- calls --------------------------------------------------------------------------------
    def capture(self) -> dict:
        """Every phase's graphs (decode, then speculative rounds), one pool; {GraphKey: stats}."""
        stats = self.runtime.capture()
        if self.spec is not None and self.runtime.uses_graphs:
            self.spec.capture()
            stats = dict(self.runtime.graphs.stats)
        return stats

    def prefill(self, prompts: list[torch.Tensor], block_table: torch.Tensor) -> torch.Tensor:
        """As ModelRuntime.prefill: [m, V] float32 last-token logits."""
        return self.runtime.prefill(prompts, block_table)

    def prefill_slots(self, prompts: list[torch.Tensor], block_table: torch.Tensor, slots: list[int],
                      sampling: SamplingInputs, *, sources: list[int] | None = None,
                      copies: list[tuple[int, int]] = ()) -> torch.Tensor:
        """Prefill each prompt (row i of block_table), draw each slot's next token with
        sampling's row i (its step is not advanced) from the last logits of prompt sources[i]
        (default: slot i's own prompt, i < m) and write it as the slot's current token (and into
        its token history at index len(prompt)). copies: (src, dst) KV pages copied after the
        prefill, in every layer (n > 1: a sample's copy of the prompt's partial last page). With
        a draft model, the draft's caches are prefilled (and copied) too. Returns the [s] int64
        first tokens (device), one per slot."""
        logits = self.prefill(prompts, block_table)                      # [m, V]
        dev = self.device
        if sources is not None:
            logits = logits.index_select(0, torch.tensor(sources, device=logits.device))   # [s, V]
        first = sample_eager(logits, sampling)                           # [s] device
        st = self.runtime.slots
        idx = torch.tensor(slots, device=dev)
        st.tokens.index_copy_(0, idx, first)
        src = sources if sources is not None else range(len(slots))
        if st.history is not None:
            at = torch.tensor([s * st.history.shape[1] + prompts[j].numel() for s, j in zip(slots, src)],
                              device=dev)
            st.history.view(-1).index_copy_(0, at, first.to(torch.int32))
        draft = self.spec.draft if self.spec is not None else None
        if draft is not None:
            draft.prefill([p.to(dev) for p in prompts], block_table.to(dev))
        if copies:
            _copy_pages(list(self.runtime.kv_caches) + (list(draft.kv_caches) if draft is not None else []),
                        copies, dev)
        return first

    def apply(self, update) -> None:
        """An input batch's staged changes into the slots (SlotState.apply)."""
        self.runtime.slots.apply(update)

    def decode_block(self, n: int, *, sampled: bool) -> torch.Tensor:
        """K decode steps over slots [0, n) -> [K, n] int64 (a view, valid until the next block)."""
        return self.runtime.decode_slots(n, sampled=sampled)

    def spec_block(self, n: int, *, filtered: bool = False):
        """R speculative rounds over slots [0, n) -> BlockOutput views (speculative/runner.py);
        filtered: some slot uses top_k / top_p."""
        if self.spec is None:
            raise ValueError("spec_block: this executor was built without speculation")
        return self.spec.run(n, filtered=filtered)

    def measure_costs(self, *, replays: int = 10):
        """Device µs of one plain decode step and one speculative round per bucket, timed with
        CUDA events around replays of the captured graphs on empty slots (fixed-shape graphs:
        the GEMMs, which dominate at low batch, cost the same) -> speculative/policy.py's
        StepCosts (verify_us[b][k + 1] = a whole round: proposer, draft and verify), or None
        without captured graphs (CPU) or without the policy module."""
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
                verify[b] = {spec.config.query_len: _time_us(lambda: spec.run(b, filtered=False), replays) / spec.rounds}
        return StepCosts(decode_us=decode, verify_us=verify)

    def check_device_errors(self) -> None:
        self.runtime.check_device_errors()


def _copy_pages(caches, copies: list[tuple[int, int]], device) -> None:
    """KV pages src -> dst in every cache (PagedKVCache: k, v [num_pages, ...]); device work,
    ordered on the stream after the prefill that wrote src."""
    src = torch.tensor([a for a, _ in copies], device=device)
    dst = torch.tensor([b for _, b in copies], device=device)
    for c in caches:
        for t in c.as_tuple():
            t.index_copy_(0, dst, t.index_select(0, src))


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
