"""The EAGLE-3 head's prompt pass as CUDA graphs: inside the target's prefill pieces, then one first draft.

    prompt = Eagle3PromptGraphs(drafter, layer_ids, mrt.prefill_graphs, mrt.graphs,
                                buckets=mrt.config.buckets, proposals=phase.proposals)   # before capture
    mrt.capture(); prompt.capture(error)                    # the pieces' graphs, then first drafts
    logits = mrt.prefill(prompts, table, record=layer_ids, hidden_last=prompt.buf.hidden)
    prompt.first_draft(first, slots, lens, host_table, error)    # -> proposals[slots]

After a prompt's prefill the head must hold K/V for every prompt position t (the target's
states at t paired with token t + 1) and draft the first round's k proposals from the last
position, paired with the first sampled token. Two facts shape the graphs:
- A position's K/V is k/v_proj of its own input (one decoder layer): no attention. Only the
  last position's output is ever read. So the pass over the prompt is `Eagle3Head.write_kv`
  (fc, two norms, the qkv GEMM and the K/V append: no attention, MLP or LM head).
- The last position needs the first sampled token, drawn from the target's logits after the
  prefill with each request's sampling (outside any graph).

Hence two graphs:
- The piece graph is the target's own (model/prefill_graphs.py, one per token bucket): target
  layers, recording the head's three states into the piece buffers, then `PromptStage`
  (PrefillGraphs.add_stage): write_kv over the piece's q_len real tokens (padding writes
  nothing) from buf.hidden, buf.tokens[1 : T + 1] (the host stages each piece with the token
  after it), cache_len and the table row. One replay per piece. The prompt's last position is
  paired there with a stale token: its K/V is rewritten by the first draft before any query
  reads it (the draft-extend's rule for rejected slots).
  Why the same graph and not a second one per bucket: everything the pass reads is the
  piece's persistent buffers, just written by the target inside that graph, and what it writes
  (the head's KV cache, the piece's error flag) nothing else in the graph reads; a second graph
  would read the same buffers one replay later for nothing but a launch. The target's graphs
  take the stage as an opaque callable: model/ imports nothing of the head.
- The first-draft graph (GraphKey("eagle_first", bucket), one per decode bucket, in the same
  pool): `Eagle3Drafter.first` (the round's draft-extend at one slot, then k - 1 chain steps)
  over `FirstDraftBuffers`, the proposals scattered into the phase's rows by slot.
The eager pass (a target prefill that runs eagerly: CPU by default, prompt log-probs, more than
EAGER_ABOVE_TOKENS new tokens) is `Eagle3Drafter.prefill`: the same write_kv per prompt, then
the same `first`. On a device without graphs both graphs run eagerly through the runner (tests).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.attention.buckets import pick_bucket
from graphrt.attention.graphs import GraphKey
from graphrt.kernels.transfer import copy_into

PAD_LEN = -1    # a padding row's last position: it writes no K/V and drafts nothing read


@dataclass
class FirstDraftBuffers:
    """The first-draft graphs' inputs and outputs, one row per prompt of an admission (B rows:
    the largest decode bucket), on the runtime device.
    hidden [B, 3H] model dtype: each prompt's last position's recorded target states (the
    prefill graphs' hidden_last); tokens [B] int64: its first sampled token;
    ints [B, 2 + W] int32: the last position (length - 1; PAD_LEN: padding row), the slot whose
    proposals the row writes (B: none, the phase's spare row), the prompt's block-table row
    (one host-to-device copy an admission); proposals [B, k] int64: the first proposals."""

    hidden: torch.Tensor
    tokens: torch.Tensor
    ints: torch.Tensor
    proposals: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, width: int, features: int, k: int, dtype, device) -> "FirstDraftBuffers":
        return cls(torch.zeros((rows, features), dtype=dtype, device=device),
                   torch.zeros(rows, dtype=torch.int64, device=device),
                   torch.zeros((rows, 2 + width), dtype=torch.int32, device=device),
                   torch.zeros((rows, k), dtype=torch.int64, device=device))

    cache_lens = property(lambda self: self.ints[:, 0])          # [B] int32 (strided view)
    slots = property(lambda self: self.ints[:, 1])               # [B] int32
    table = property(lambda self: self.ints[:, 2:])              # [B, W] int32


def stage_rows(size: int, lens, slots, host_table: torch.Tensor, *, width: int, spare: int) -> torch.Tensor:
    """FirstDraftBuffers.ints[:size] on the host (pure): rows i < len(lens) for prompt i (last
    position lens[i] - 1, slots[i], host_table[i]), the rest padding (PAD_LEN, `spare`, zeros)."""
    m = len(lens)
    if not m <= size or len(slots) != m or host_table.shape[0] < m or host_table.shape[1] > width:
        raise ValueError(f"lens, slots, host_table: {m} prompts, {len(slots)} slots, table "
                         f"{tuple(host_table.shape)}; expected at most {size} of each and <= {width} pages a row")
    ints = torch.zeros((size, 2 + width), dtype=torch.int32)
    ints[:, 0], ints[:, 1] = PAD_LEN, spare
    if m:
        ints[:m, 0] = torch.as_tensor(lens, dtype=torch.int32) - 1
        ints[:m, 1] = torch.as_tensor(slots, dtype=torch.int32)
        ints[:m, 2:2 + host_table.shape[1]] = host_table[:m]
    return ints


class PromptStage:
    """The head's prompt pass over one prefill piece (PrefillGraphs.add_stage): write_kv of the
    piece's q_len real positions, paired with the tokens after them, into the head's cache."""

    def __init__(self, head, kv_cache):
        self.head, self.kv_cache = head, kv_cache

    def __call__(self, t: int, buf) -> None:
        self.head.write_kv(buf.hidden[:t].view(1, t, -1), buf.tokens[1: t + 1].view(1, t), buf.cache_len,
                           self.kv_cache, buf.table, buf.error, q_lens=buf.q_len)


class Eagle3PromptGraphs:
    """The head's graphed prompt pass beside a runtime: its stage in the target's prefill graphs
    and the first-draft graphs. drafter: the Eagle3Drafter; layer_ids: the target states it
    reads (recorded by the prefill graphs from now on); prefill_graphs: the runtime's
    PrefillGraphs (not yet captured); graphs: its GraphRunner; buckets: the decode buckets
    (admissions of up to buckets[-1] prompts); proposals: the phase's [buckets[-1] + 1, k]
    int64 rows (the last: padding rows' writes)."""

    def __init__(self, drafter, layer_ids, prefill_graphs, graphs, *, buckets, proposals: torch.Tensor):
        self.buckets = tuple(buckets)
        if proposals.shape != (self.buckets[-1] + 1, drafter.k):
            raise ValueError(f"proposals: expected [{self.buckets[-1] + 1}, {drafter.k}], got "
                             f"{tuple(proposals.shape)}")
        self.drafter, self.prefill_graphs, self.graphs, self.proposals = drafter, prefill_graphs, graphs, proposals
        prefill_graphs.record_states(layer_ids)
        prefill_graphs.add_stage(PromptStage(drafter.head, drafter.kv_cache), caches=[drafter.kv_cache])
        pg = prefill_graphs.buf
        self.width = pg.table.shape[1]
        self.buf = FirstDraftBuffers.allocate(self.buckets[-1], self.width, pg.hidden.shape[1], drafter.k,
                                              pg.hidden.dtype, pg.hidden.device)
        self._error = None                           # the flag the graphs were captured with

    def key(self, size: int) -> GraphKey:
        return GraphKey("eagle_first", size)

    def _first(self, size: int, error: torch.Tensor) -> None:
        b = self.buf
        self.drafter.first(b.hidden[:size], b.tokens[:size], b.cache_lens[:size], b.table[:size],
                           b.proposals[:size], error)
        self.proposals.index_copy_(0, b.slots[:size].long(), b.proposals[:size])

    def capture(self, error: torch.Tensor) -> None:
        """The first-draft graph of every bucket not yet captured, largest first, on padding rows
        (nothing written but the spare proposals row). error: [1] int32, the device-error flag
        every later first_draft passes."""
        self._error = error
        copy_into(self.buf.ints, stage_rows(self.buckets[-1], [], [], torch.zeros((0, 0), dtype=torch.int32),
                                            width=self.width, spare=self.buckets[-1]))
        for size in reversed(self.buckets):
            if self.key(size) not in self.graphs:
                self.graphs.capture(self.key(size), lambda s=size: self._first(s, error),
                                    scratch=[self.drafter.kv_cache])

    def first_draft(self, first: torch.Tensor, slots, lens, host_table: torch.Tensor, error: torch.Tensor) -> None:
        """After a graphed prefill of whole prompts i (lens[i] tokens, block-table rows
        host_table[i], [m, W] int32 CPU; their last states in buf.hidden) whose first tokens
        are first ([m] int64, device): the head's K/V at each last position and the first k
        proposals into proposals[slots[i]]. One host-to-device copy, one replay, no sync."""
        if self._error is not None and error is not self._error:
            raise ValueError("error: the first-draft graphs were captured with another device-error flag")
        m = len(slots)
        if not 1 <= m <= self.buckets[-1] or first.shape != (m,):
            raise ValueError(f"slots, first: {m} slots and first {tuple(first.shape)}; expected 1 to "
                             f"{self.buckets[-1]} prompts, one first token each")
        size = pick_bucket(self.buckets, m)
        copy_into(self.buf.ints[:size], stage_rows(size, lens, slots, host_table, width=self.width,
                                                   spare=self.buckets[-1]))
        self.buf.tokens[:m].copy_(first)
        self.graphs.run(self.key(size), lambda: self._first(size, error))


__all__ = ["Eagle3PromptGraphs", "FirstDraftBuffers", "PromptStage", "stage_rows", "PAD_LEN"]
