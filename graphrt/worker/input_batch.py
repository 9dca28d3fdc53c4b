"""The executor's input batch: the host-side manager of the runtime's per-slot device state.

    batch = InputBatch(max_batch=64, max_pages_per_seq=512, pin=True)
    batch.record(launch.changes)                 # the scheduler's slot changes (changes.py), or:
    batch.set_pages(slot, col, pages)            # admission, page growth (host mirror + dirty)
    batch.activate(slot, seq_len=.., step=.., temperature=.., top_k=.., top_p=.., seed=..,
                   limit=.., spec_k=..)          # the row decodes from the next block
    batch.set_history(slot, tokens)              # speculation: the slot's prompt + accepted tokens
    batch.set_token(slot, token)                 # its current token (a row that decodes from its
                                                 # last context token: no prefill draw before it)
    batch.deactivate(slot)                       # finished, preempted, or no tokens left to draw
    batch.flush(executor.apply)                  # one staged update of what changed
    tokens = executor.run(Block(n)).tokens       # the graphs read the slots in place

The device rows themselves are the runtime's SlotState (model/slots.py: one owner); this object
keeps a host mirror of every row (numpy) and the set of dirty cells / rows, and `flush` packs
them into pinned buffers (two sets, each reused only after the copies that read it passed)
handed to `apply` (SlotState.apply). It belongs to the executor (worker/local.py: one per rank),
the one host writer of the slots: the engine's scheduler only describes its changes (changes.py),
which ride with each launch. Nothing is re-staged per block: rows are written when a request is admitted,
grows a page, stops drawing or leaves; seq_lens, the draw index, the current token and the token
history advance on the device inside the graphs.
"""
from __future__ import annotations

import numpy as np
import torch

from graphrt.model.slots import (LIMIT, NUM_FLOATS, NUM_INTS, PAD_PAGE, SEQ, SPEC_K, STEP, TEMPERATURE,
                                 TOP_K, TOP_P, SlotUpdate)
from graphrt.worker.changes import Activate, Deactivate, SetHistory, SetPages, SetProcessing, SetSpecK, SetToken


class _Stage:
    """Pinned host buffers for one flush (int64, int32, float32; numpy views of them), grown on
    demand, reused only after `event` (recorded behind the copies that read them) has passed."""

    def __init__(self, pin: bool):
        self.pin = pin
        self.bufs: dict = {}
        self.event = torch.cuda.Event() if pin else None
        self.used = False

    def take(self, n64: int, n32: int, nf: int):
        """(tensor, numpy view) of n64 int64, n32 int32 and nf float32 elements."""
        if self.used and self.event is not None:
            self.event.synchronize()          # normally long past: the copies of a block ago
        out = []
        for n, dt in ((n64, torch.int64), (n32, torch.int32), (nf, torch.float32)):
            buf = self.bufs.get(dt)
            if buf is None or buf[0].numel() < n:
                t = torch.empty(max(2 * n, 1024), dtype=dt, pin_memory=self.pin)
                buf = self.bufs[dt] = (t, t.numpy())
            out.append((buf[0][:n], buf[1][:n]))
        self.used = True
        return out


class InputBatch:
    """max_batch rows of max_pages_per_seq pages; pin: stage in pinned memory (a CUDA runtime)
    with an event guarding each staging set; history_width: the slots' token-history width
    (None: they keep none). Host only; owned by the executor."""

    def __init__(self, *, max_batch: int, max_pages_per_seq: int, pin: bool = False,
                 history_width: int | None = None):
        b, w = max_batch, max_pages_per_seq
        self.max_batch, self.width = b, w
        self.block_table_host = np.full((b, w), PAD_PAGE, dtype=np.int32)
        self._ints = np.zeros((NUM_INTS, b), dtype=np.int32)
        self._floats = np.zeros((NUM_FLOATS, b), dtype=np.float32)
        self._floats[TOP_P] = 1.0
        self._seed = np.zeros(b, dtype=np.int64)
        self._dirty_cells: list[int] = []            # flat indices into block_table
        self._dirty_rows: set[int] = set()
        self._history: list[tuple[int, list[int]]] = []   # (slot, tokens from column 0)
        self._tokens: dict[int, int] = {}                    # slot -> its current token
        self._proc: list = []                                # (slot, ProcessRows) to reset
        self._spec_k: set[int] = set()                      # slots whose SPEC_K alone changed
        self.history_width = history_width           # the slots' token-history width (speculation)
        self._stages = [_Stage(pin), _Stage(pin)]
        self._flip = 0

    # ---- host writes (recorded, copied by flush) ----------------------------------------------
    def record(self, changes) -> None:
        """Each slot change (changes.py), in order, as the calls below."""
        for c in changes:
            t = type(c)
            if t is SetPages:
                self.set_pages(c.slot, c.col, c.pages)
            elif t is Activate:
                self.activate(c.slot, seq_len=c.seq_len, step=c.step, temperature=c.temperature, top_k=c.top_k,
                              top_p=c.top_p, seed=c.seed, limit=c.limit, spec_k=c.spec_k)
            elif t is Deactivate:
                self.deactivate(c.slot)
                if c.free:
                    self.clear_pages(c.slot)
            elif t is SetToken:
                self.set_token(c.slot, c.token)
            elif t is SetHistory:
                self.set_history(c.slot, c.tokens)
            elif t is SetProcessing:
                self._proc.append((c.slot, c.rows))
            elif t is SetSpecK:
                self.set_spec_k(c.slot, c.k)
            else:
                raise ValueError(f"changes: {t.__name__} is not a slot change")

    def set_pages(self, slot: int, col: int, pages: list[int]) -> None:
        """block_table[slot, col:col + len(pages)] = pages."""
        if not pages:
            return
        end = col + len(pages)
        if end > self.width:
            raise ValueError(f"pages: columns [{col}, {end}) exceed max_pages_per_seq={self.width}")
        self.block_table_host[slot, col:end] = pages
        start = slot * self.width
        self._dirty_cells.extend(range(start + col, start + end))

    def clear_pages(self, slot: int) -> None:
        """Host mirror only: the row's entries back to PAD_PAGE (the device row is stale, unread)."""
        self.block_table_host[slot].fill(PAD_PAGE)

    def activate(self, slot: int, *, seq_len: int, step: int, temperature: float, top_k: int,
                 top_p: float, seed: int, limit: int = 0, spec_k: int = 0) -> None:
        """The row decodes from the next block: seq_len counts its current token; step is the
        draw index of its next token; limit: the most tokens it may hold (speculative rounds);
        spec_k: proposals a speculative round may verify for it."""
        ints, fl = self._ints, self._floats
        ints[SEQ, slot], ints[STEP, slot], ints[TOP_K, slot] = seq_len, step, top_k
        ints[LIMIT, slot], ints[SPEC_K, slot] = limit, spec_k
        fl[TEMPERATURE, slot], fl[TOP_P, slot] = temperature, top_p
        self._seed[slot] = seed
        self._dirty_rows.add(slot)

    def set_spec_k(self, slot: int, k: int) -> None:
        """Proposals a speculative round may verify for the row from the next block (a
        constrained row's cap): that one cell, not the row (its seq_len and draw index advance
        on the device; the mirror's are the activation's)."""
        if self._ints[SPEC_K, slot] != k:
            self._ints[SPEC_K, slot] = k
            self._spec_k.add(slot)

    def deactivate(self, slot: int) -> None:
        """The row becomes padding (seq_len 0, limit 0) and stops advancing."""
        self._ints[SEQ, slot] = self._ints[LIMIT, slot] = 0
        self._floats[TEMPERATURE, slot] = 0.0
        self._dirty_rows.add(slot)

    def set_token(self, slot: int, token: int) -> None:
        """tokens[slot] = token from the next flush (the row's current token)."""
        self._tokens[slot] = token

    def set_history(self, slot: int, tokens: list[int]) -> None:
        """history[slot, :len(tokens)] = tokens (the slot's prompt + accepted tokens)."""
        if self.history_width is None:
            raise ValueError("history: this batch's slots keep no token history")
        if len(tokens) > self.history_width:
            raise ValueError(f"history: {len(tokens)} tokens exceed the width {self.history_width}")
        self._history.append((slot, tokens))

    # ---- the update ---------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return bool(self._dirty_cells or self._dirty_rows or self._history or self._tokens or self._proc
                    or self._spec_k)

    def flush(self, apply) -> None:
        """Stage every recorded change and hand it to apply(SlotUpdate) (stream-ordered
        non-blocking copies on the device side, no sync): the processing rows to reset first
        (one update each), then one update of the rest; nothing when nothing changed."""
        if not self.dirty:
            return
        proc, self._proc = self._proc, []
        for slot, rows in proc:
            apply(SlotUpdate.processing_rows([slot], rows))
        if not self.dirty:
            return
        cells = self._dirty_cells
        if len(set(cells)) != len(cells):            # a cell written twice: once is enough
            cells = sorted(set(cells))
        cells = np.array(cells, dtype=np.int64)
        rows = np.fromiter(self._dirty_rows, dtype=np.int64, count=len(self._dirty_rows))
        hist, width = self._history, self.history_width or 0
        h = sum(len(t) for _, t in hist)
        current, t = self._tokens, len(self._tokens)
        # caps alone (a row written whole carries its SPEC_K)
        spec = sorted(self._spec_k - self._dirty_rows) if self._spec_k else []
        self._dirty_cells, self._history, self._tokens = [], [], {}
        self._dirty_rows.clear()
        self._spec_k.clear()
        m, s, c = len(cells), len(rows), len(spec)
        stage = self._stages[self._flip]
        self._flip ^= 1
        (i64, n64), (i32, n32), (f32, nf) = stage.take(m + 2 * s + h + 2 * t + c, m + NUM_INTS * s + h + c,
                                                       NUM_FLOATS * s)
        n64[:m] = cells
        n32[:m] = self.block_table_host.reshape(-1)[cells]
        if s:
            n64[m:m + s], n64[m + s:m + 2 * s] = rows, self._seed[rows]
            n32[m:m + NUM_INTS * s] = self._ints[:, rows].reshape(-1)
            nf[:] = self._floats[:, rows].reshape(-1)
        at = 0
        for slot, toks in hist:                       # admissions only: a prompt's worth each
            k = len(toks)
            n64[m + 2 * s + at:m + 2 * s + at + k] = np.arange(slot * width, slot * width + k)
            n32[m + NUM_INTS * s + at:m + NUM_INTS * s + at + k] = toks
            at += k
        if t:
            at = m + 2 * s + h
            n64[at:at + t] = list(current)
            n64[at + t:at + 2 * t] = list(current.values())
        if c:
            at, at32 = m + 2 * s + h + 2 * t, m + NUM_INTS * s + h
            n64[at:at + c] = [SPEC_K * self.max_batch + slot for slot in spec]
            n32[at32:at32 + c] = self._ints[SPEC_K, spec]
        apply(SlotUpdate(i64, i32, f32, m, s, h, t, c=c))
        if stage.event is not None:
            stage.event.record()                      # behind the copies that read the stage


__all__ = ["InputBatch", "PAD_PAGE"]
