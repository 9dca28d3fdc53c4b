"""The EAGLE-3 head as a phase of the speculative rounds: its per-slot state and its three hooks.

    phase = Eagle3Phase(drafter, layer_ids, target_hidden=H, max_batch=B, dtype=..., device=...)
    phase.attach_prefill(mrt)                          # the head's prompt pass in mrt's prefill graphs
    runner = SpeculativeRunner(..., eagle=phase)       # or SpeculativeRunner.attach(mrt, ..., eagle=phase)
    logits, h3 = phase.target_prefill(mrt, prompts, table)    # the target's prefill, recording
    phase.prefill(h3, prompts, first, table, slots)           # the head's prefill -> first proposals

Unlike the n-gram and draft proposers, the head proposes AFTER acceptance: a round of the runner
verifies the proposals the previous round (or the prefill) left in `proposals`, recording the
target's hidden states of all k + 1 verified tokens into `hidden`, accepts, then runs the head's
draft-extend over those states and k - 1 chain steps (Eagle3Drafter.round), which write the next
round's proposals. Inside a block (R rounds) nothing goes to the host.

State (device, persistent; rows = slots, B = max_batch, Q = k + 1):
    proposals [B + 1, k] int64    each slot's next proposals (target ids), written by the head
                                  (row B: where the first-draft graphs' padding rows write)
    hidden    [B * Q, 3 * H]      the verify's recorded hidden states (row b * Q + j), model dtype
The head's K/V lives in the drafter's PagedKVCache, indexed by the target's block tables (same
page ids), so it follows the scheduler's pages. Invariant between rounds, for a slot holding n
tokens: the head's K/V at positions 0 .. n - 2 is that of the target's hidden states paired with
the next token. The head never sees tokens of a plain decode block: an engine with this phase
speculates every block (greedy output stays exact either way; acceptance would drop).

After a prompt: where the target's prefill runs through its prefill graphs (`attach_prefill`),
the head's prompt pass runs inside them and the first draft is one more replay
(eagle3/prompt.py); where it runs eagerly, the head's pass is eager too (Eagle3Drafter.prefill,
the same head code). `target_prefill` decides (ModelRuntime.prefill_graphed) and `prefill`
follows.
"""
from __future__ import annotations

import torch

from graphrt.kernels.transfer import tensor_on, to_device


class Eagle3Phase:
    """drafter: an Eagle3Drafter (its head, its KV cache, k); layer_ids: the target hidden
    states the head reads (ascending, Eagle3Checkpoint.layer_ids); target_hidden: the target's
    hidden size H; max_batch: slots; dtype / device: the target model's."""

    def __init__(self, drafter, layer_ids, *, target_hidden: int, max_batch: int, dtype: torch.dtype,
                 device):
        layer_ids = tuple(layer_ids)
        if len(layer_ids) != 3:
            raise ValueError(f"layer_ids: expected 3 target layer ids, got {list(layer_ids)}")
        fc_in = drafter.head.weights.fc.shape[1]
        if fc_in != len(layer_ids) * target_hidden:
            raise ValueError(f"target_hidden: the head's fc reads {fc_in} features, 3 x {target_hidden} given")
        self.drafter, self.layer_ids, self.k = drafter, layer_ids, drafter.k
        self.device = torch.device(device)
        q = self.k + 1
        self.proposals = torch.zeros((max_batch + 1, self.k), dtype=torch.int64, device=self.device)
        self.hidden = torch.zeros((max_batch * q, fc_in), dtype=dtype, device=self.device)
        self.max_batch = max_batch
        self.prompt = None               # Eagle3PromptGraphs once attach_prefill has run

    @property
    def kv_cache(self):
        return self.drafter.kv_cache

    # ---- the runner's hooks (capturable: fixed shapes, no host sync) -------------------------
    def proposals_of(self, size: int) -> torch.Tensor:
        """The round's proposals: the slots' stored ones, read in place -> [size, k] int64 (a
        view of this phase's rows: the round reads it before `after` overwrites it). Every slot
        proposes k (round_inputs(full=True)); an idle slot's are ignored: the round's inputs mark
        it inactive and it emits nothing, as with n-gram proposals."""
        return self.proposals[:size]

    def verify_kwargs(self, size: int) -> dict:
        """What the target's verify_step records: every layer id into hidden's first size * Q rows."""
        return {"record": self.layer_ids, "hidden_out": self.hidden[: size * (self.k + 1)]}

    def after(self, size: int, out_tokens: torch.Tensor, emitted: torch.Tensor, cache_lens: torch.Tensor,
              block_table: torch.Tensor, error: torch.Tensor) -> None:
        """After accept: out_tokens [size, Q] int64 (-1 past emitted), emitted [size] int32 (0 =
        inactive slot), cache_lens [size] int32 (the verify's first position, -1 for inactive);
        the head's draft-extend + chain write the next proposals of the emitting slots."""
        q = self.k + 1
        self.drafter.round(self.hidden[: size * q].view(size, q, -1), out_tokens, cache_lens, emitted,
                           block_table, self.proposals[:size], error)

    # ---- after a prefill ---------------------------------------------------------------------
    def attach_prefill(self, runtime) -> None:
        """The head's prompt pass into the runtime's prefill graphs (none: nothing to do), with
        its first-draft graphs; before the runtime's capture (ModelRuntime, its prefill_graphs,
        graphs and config.buckets)."""
        if runtime.prefill_graphs is None:
            return
        from graphrt.speculative.eagle3.prompt import Eagle3PromptGraphs
        if runtime.config.buckets[-1] != self.max_batch:
            raise ValueError(f"runtime: its largest bucket {runtime.config.buckets[-1]} is not this "
                             f"phase's max_batch {self.max_batch}")
        self.prompt = Eagle3PromptGraphs(self.drafter, self.layer_ids, runtime.prefill_graphs, runtime.graphs,
                                         buckets=runtime.config.buckets, proposals=self.proposals)

    def capture(self, block_table: torch.Tensor, error: torch.Tensor) -> None:
        """Before serving (the runner's capture): the eager prompt pass's and first draft's kernels
        compiled on CUDA (Eagle3Head.warm_prefill, Eagle3Drafter.warm_first; they write nothing), then the first-draft graphs where the prompt
        pass is graphed. block_table [>= 1, W] int32, error [1] int32 (the runner's flag)."""
        if self.device.type == "cuda":
            self.drafter.head.warm_prefill(self.kv_cache, block_table, error)
            self.drafter.warm_first(block_table, error)
        if self.prompt is not None:
            self.prompt.capture(error)

    def target_prefill(self, runtime, prompts: list[torch.Tensor], block_table: torch.Tensor, *, after=None,
                       **kw):
        """The target's prefill through `runtime` (ModelRuntime.prefill, its other keywords `kw`:
        starts, ...) recording the head's hidden states -> ([m, V] float32 logits, states).
        states None: the call ran through the runtime's prefill graphs with the head's prompt
        pass inside (every position's head K/V written, the last paired with after[i] where
        given (a chunk), each prompt's last states kept for the first draft); else [sum T_i,
        3H], every new token's, for the eager pass (`prefill` or `prefill_part`)."""
        new = sum(p.numel() for p in prompts)
        with runtime.lock:                              # the decision and the prefill, together
            if self.prompt is not None and runtime.prefill_graphs is self.prompt.prefill_graphs \
                    and len(prompts) <= self.max_batch and runtime.prefill_graphed(
                        new, logits_rows=kw.get("logits_rows", frozenset()), record=self.layer_ids):
                return runtime.prefill(prompts, block_table, record=self.layer_ids,
                                       hidden_last=self.prompt.buf.hidden, after=after, **kw), None
            hidden = torch.empty((new, self.hidden.shape[1]), dtype=self.hidden.dtype, device=self.device)
            logits = runtime.prefill(prompts, block_table, record=self.layer_ids, hidden_out=hidden, **kw)
            return logits, hidden

    @torch.no_grad()
    def prefill(self, hidden: torch.Tensor | None, prompts: list[torch.Tensor], first: torch.Tensor,
                block_table: torch.Tensor, slots: list[int], error: torch.Tensor, *, starts=None) -> None:
        """The head over each prompt paired with the next tokens (the prompt shifted by one, then
        first[i], its first sampled token, [m] int64 device), then k - 1 chain steps: the first
        proposals of slots[i]. hidden: target_prefill's states (None: graphed, the prompt pass
        is done; one replay drafts); prompt i on row i of block_table [m, W] int32 (a host
        table: no sync) from position starts[i] (host ints, default 0: the head's K/V below it
        is already in the pages, see `prefill_part`). error: [1] int32 device_error."""
        dev = self.device
        starts = [0] * len(prompts) if starts is None else [int(a) for a in starts]
        if hidden is None:
            host = block_table if block_table.device.type == "cpu" else block_table.cpu()
            self.prompt.first_draft(first, slots, [a + p.numel() for a, p in zip(starts, prompts)], host, error)
            return
        tokens = torch.cat([t for i, p in enumerate(prompts) for t in (to_device(p, dev)[1:], first[i:i + 1])])
        props = torch.empty((len(prompts), self.k), dtype=torch.int64, device=dev)
        self.drafter.prefill(hidden, tokens, [p.numel() for p in prompts], to_device(block_table, dev), props,
                             error, starts=starts)
        self.proposals.index_copy_(0, tensor_on(slots, torch.long, dev), props)

    @torch.no_grad()
    def prefill_part(self, hidden: torch.Tensor | None, prompts: list[torch.Tensor], after,
                     block_table: torch.Tensor, starts, error: torch.Tensor) -> None:
        """After target_prefill of chunks that draw nothing yet (prompt i: positions [starts[i],
        starts[i] + T_i) of a longer context, row i of block_table): the head's K/V at those
        positions, the last paired with after[i] (host int: the context's next token; None: a
        stale token, as at a prompt's last position until its first draft). Graphed (hidden None):
        done inside the target's graphs. No proposals: the request draws after its last piece."""
        if hidden is None:
            return
        dev = self.device
        nxt = tensor_on([0 if a is None else int(a) for a in after], torch.int64, dev)     # one host copy
        tokens = torch.cat([t for i, p in enumerate(prompts) for t in (to_device(p, dev)[1:], nxt[i:i + 1])])
        self.drafter.head.prefill_kv(hidden, tokens, [p.numel() for p in prompts], self.kv_cache,
                                     to_device(block_table, dev), error, starts=starts, whole=True)


__all__ = ["Eagle3Phase"]
