"""The persistent per-slot device state: what every graphed step reads and advances.

One object per runtime (`ModelRuntime.slots`), rows = decode slots (B = max_batch; a bucket of
b rows reads the first b). The decode graphs (K steps) and the speculative graphs (R rounds)
read it in place and advance it on the device (seq_lens by K or by the accepted count, the draw
index, the current token, the token history): nothing is copied into it per block. The host
writes it only through `apply(SlotUpdate)` (the executor's InputBatch stages what changed) or
through ModelRuntime.decode's explicit input copy.

Device tensors (the runtime's device):
    block_table [B, W] int32    page ids (W = max_pages_per_seq); columns past a row's pages are
                                stale or PAD_PAGE and never read (rows read what seq_len covers)
    ints        [5, B] int32    rows SEQ: tokens held counting the current one, whose K/V is not
                                in the cache yet (0 = empty slot / padding); STEP: draw index of
                                the next sampled token; TOP_K (0 = off); LIMIT: the most tokens the
                                slot may hold (speculative rounds stop there); SPEC_K: proposals a
                                speculative round may verify for the slot (<= k; 0 = none)
    floats      [2, B] float32  rows TEMPERATURE (0 = greedy), TOP_P (1 = off)
    seed        [B] int64       per-request Philox key
    tokens      [B] int64       each slot's current token (the decode graphs' input)
    history     [B, H] int32    prompt + output tokens of each slot (H = max_context_len), or None
                                when no phase needs it (n-gram lookup / the speculative token buffer)
    proc        ProcessState    the logits-processing rows (token counts, prompt mask, penalties,
                                min_p, token rules: model/processing.py), or None when the runtime
                                was built without processing; written by the prefill of a slot's
                                request, advanced by the processed decode graphs
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from graphrt.model.processing import ProcessRows, ProcessState
from graphrt.model.sampling import SamplingInputs

PAD_PAGE = -1                                  # block-table entries past a request's pages
SEQ, STEP, TOP_K, LIMIT, SPEC_K = range(5)     # rows of `ints`
TEMPERATURE, TOP_P = range(2)                  # rows of `floats`
NUM_INTS, NUM_FLOATS = 5, 2


@dataclass(frozen=True)
class SlotUpdate:
    """Staged changes to a SlotState (CPU tensors, pinned when the stager pins; or tensors on
    the state's device, e.g. a row whose last token a prefill drew there: `SlotState.row_update`).

    i64 = [cells (m) | rows (s) | seeds (s) | history indices (h) | token rows (t) | tokens (t)
           | int cells (c)],
    i32 = [cell values (m) | ints (NUM_INTS * s, row-major [NUM_INTS, s]) | history tokens (h)
           | int cell values (c)],
    f32 = [floats (NUM_FLOATS * s)]. cells and history indices are flat indices into block_table /
    history; token rows get their current token (a row that starts decoding from its last
    context token, with no prefill draw before it); int cells are flat indices into ints
    ([NUM_INTS, B]: field * B + slot), one field of a row whose other fields advance on the
    device (a speculative row's SPEC_K: rewriting the whole row would move its SEQ / STEP back to
    the host mirror's). proc_slots / proc_rows: slots whose
    logits-processing rows are reset to `proc_rows` (model/processing.py ProcessRows; a row that
    starts decoding without a prefill of its own), or () / None."""

    i64: torch.Tensor
    i32: torch.Tensor
    f32: torch.Tensor
    m: int
    s: int
    h: int
    t: int = 0
    proc_slots: tuple = ()
    proc_rows: ProcessRows | None = None
    c: int = 0

    @classmethod
    def processing_rows(cls, slots: list[int], rows: ProcessRows) -> "SlotUpdate":
        """An update that only resets `slots`' processing rows to `rows`."""
        if len(slots) != rows.params.shape[0]:
            raise ValueError(f"rows: {rows.params.shape[0]} processing rows for {len(slots)} slots")
        empty = torch.empty(0, dtype=torch.int64)
        return cls(empty, empty.to(torch.int32), empty.to(torch.float32), 0, 0, 0,
                   proc_slots=tuple(slots), proc_rows=rows)


@dataclass(frozen=True)
class SlotState:
    block_table: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    seed: torch.Tensor
    tokens: torch.Tensor
    history: torch.Tensor | None
    proc: ProcessState | None = None

    @classmethod
    def allocate(cls, max_batch: int, max_pages: int, device: torch.device, *,
                 history_width: int | None = None, vocab: int | None = None) -> "SlotState":
        """vocab: allocate the logits-processing rows for this vocabulary (None: none)."""
        b = max_batch
        floats = torch.zeros((NUM_FLOATS, b), dtype=torch.float32, device=device)
        floats[TOP_P] = 1.0
        return cls(block_table=torch.full((b, max_pages), PAD_PAGE, dtype=torch.int32, device=device),
                   ints=torch.zeros((NUM_INTS, b), dtype=torch.int32, device=device), floats=floats,
                   seed=torch.zeros(b, dtype=torch.int64, device=device),
                   tokens=torch.zeros(b, dtype=torch.int64, device=device),
                   history=None if history_width is None else
                   torch.zeros((b, history_width), dtype=torch.int32, device=device),
                   proc=None if vocab is None else ProcessState.allocate(b, vocab, device))

    # ---- row views (device, [B] each; `[:size]` for a bucket) ---------------------------------
    @property
    def max_batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_lens(self) -> torch.Tensor:
        return self.ints[SEQ]

    @property
    def step(self) -> torch.Tensor:
        return self.ints[STEP]

    @property
    def top_k(self) -> torch.Tensor:
        return self.ints[TOP_K]

    @property
    def limit(self) -> torch.Tensor:
        return self.ints[LIMIT]

    @property
    def spec_k(self) -> torch.Tensor:
        return self.ints[SPEC_K]

    @property
    def temperature(self) -> torch.Tensor:
        return self.floats[TEMPERATURE]

    @property
    def top_p(self) -> torch.Tensor:
        return self.floats[TOP_P]

    def sampling(self, n: int) -> SamplingInputs:
        """Rows [0, n) of the sampling parameters (device views, advanced in place by graphs)."""
        return SamplingInputs(self.temperature[:n], self.top_k[:n], self.top_p[:n], self.seed[:n],
                              self.step[:n])

    # ---- host -> device ---------------------------------------------------------------------
    def row_update(self, slot: int, *, seq_len: int = 0, limit: int = 0, step: int = 0, top_k: int = 0,
                   spec_k: int = 0, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                   block_table: torch.Tensor | None = None, history: torch.Tensor | None = None,
                   append: torch.Tensor | None = None) -> SlotUpdate:
        """A SlotUpdate that rewrites one slot's whole row (apply() writes it; the defaults are an
        empty slot's). block_table: [w] int32 CPU page ids (the rest of the row -> 0), None = the
        row's pages unchanged; history: [h] int32 CPU tokens from position 0, then `append` (a
        one-element device tensor such as a prefill's first token: no host sync); the row's
        current token becomes the last of them."""
        dev, w_all = self.tokens.device, self.block_table.shape[1]
        cells = vals = torch.empty(0, dtype=torch.int64)
        if block_table is not None:
            cells = slot * w_all + torch.arange(w_all, dtype=torch.int64)
            vals = torch.zeros(w_all, dtype=torch.int64)
            vals[:block_table.numel()] = block_table.reshape(-1).to("cpu", torch.int64)
        ints = [0] * NUM_INTS
        ints[SEQ], ints[STEP], ints[TOP_K], ints[LIMIT], ints[SPEC_K] = seq_len, step, top_k, limit, spec_k
        floats = [0.0] * NUM_FLOATS
        floats[TEMPERATURE], floats[TOP_P] = temperature, top_p
        hist = torch.empty(0, dtype=torch.int64) if history is None else history.reshape(-1).to("cpu", torch.int64)
        h = hist.numel() + (0 if append is None else 1)
        at = slot * (0 if self.history is None else self.history.shape[1]) + torch.arange(h, dtype=torch.int64)
        t = 1 if h else 0
        i64 = torch.cat([cells, torch.tensor([slot, seed], dtype=torch.int64), at,
                         torch.tensor([slot] * t, dtype=torch.int64)])
        i32 = torch.cat([vals, torch.tensor(ints, dtype=torch.int64), hist]).to(torch.int32)
        if append is not None:                       # the last token stays on the device
            last = append.reshape(1).to(device=dev, dtype=torch.int64)
            i64 = torch.cat([i64.to(dev), last])
            i32 = torch.cat([i32.to(dev), last.to(torch.int32)])
        elif t:
            i64 = torch.cat([i64, hist[-1:]])
        return SlotUpdate(i64, i32, torch.tensor(floats, dtype=torch.float32), cells.numel(), 1, h, t)

    def apply(self, u: SlotUpdate) -> None:
        """Scatter a staged update into the state (non-blocking copies, stream-ordered, no sync)."""
        m, s, h = u.m, u.s, u.h
        dev = self.tokens.device
        d64, d32 = u.i64.to(dev, non_blocking=True), u.i32.to(dev, non_blocking=True)
        if m:
            self.block_table.view(-1).index_copy_(0, d64[:m], d32[:m])
        if s:
            idx = d64[m:m + s]
            self.ints.index_copy_(1, idx, d32[m:m + NUM_INTS * s].view(NUM_INTS, s))
            self.floats.index_copy_(1, idx, u.f32.to(dev, non_blocking=True).view(NUM_FLOATS, s))
            self.seed.index_copy_(0, idx, d64[m + s:m + 2 * s])
        if h:
            if self.history is None:
                raise ValueError("update: history tokens given, but this state keeps no history")
            self.history.view(-1).index_copy_(0, d64[m + 2 * s:m + 2 * s + h],
                                              d32[m + NUM_INTS * s:m + NUM_INTS * s + h])
        if u.t:
            at = m + 2 * s + h
            self.tokens.index_copy_(0, d64[at:at + u.t], d64[at + u.t:at + 2 * u.t])
        if u.c:
            at, at32 = m + 2 * s + h + 2 * u.t, m + NUM_INTS * s + h
            self.ints.view(-1).index_copy_(0, d64[at:at + u.c], d32[at32:at32 + u.c])
        if u.proc_rows is not None:
            if self.proc is None:
                raise ValueError("update: processing rows given, but this state keeps none (processing=False)")
            self.proc.write_rows(torch.tensor(u.proc_slots, dtype=torch.int64), u.proc_rows)

    def load(self, n: int, tokens: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
             sampling: SamplingInputs | None) -> None:
        """The explicit input copy of a public decode call: rows [0, n) from the caller's tensors
        (validated by the caller; block_table may be narrower than W: the rest -> PAD_PAGE), the
        padded tail [n, B) reset to empty slots."""
        width = block_table.shape[1]
        self.block_table[:n, :width].copy_(block_table, non_blocking=True)
        if width < self.block_table.shape[1]:
            self.block_table[:n, width:].fill_(PAD_PAGE)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.seq_lens[n:].fill_(0)
        self.tokens[:n].copy_(tokens, non_blocking=True)
        if sampling is not None:
            mine = self.sampling(n)
            for f in fields(SamplingInputs):
                getattr(mine, f.name).copy_(getattr(sampling, f.name), non_blocking=True)
        else:
            self.temperature[:n].zero_()
        self.temperature[n:].zero_()


__all__ = ["SlotState", "SlotUpdate", "PAD_PAGE", "SEQ", "STEP", "TOP_K", "LIMIT", "SPEC_K",
           "TEMPERATURE", "TOP_P", "NUM_INTS", "NUM_FLOATS"]
