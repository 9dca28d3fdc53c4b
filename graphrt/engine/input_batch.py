"""The persistent input batch: each decode slot's inputs kept on the device, written on change.

    batch = InputBatch(max_batch=64, max_pages_per_seq=512, device=dev)
    batch.set_pages(slot, col, pages)            # admission, page growth (host mirror + dirty)
    batch.activate(slot, seq_len=.., step=.., advance=K, temperature=.., top_k=.., top_p=.., seed=..)
    batch.deactivate(slot)                       # finished, preempted, or no tokens left to draw
    batch.flush()                                # one staged copy of what changed, then scatters
    tokens = runtime.decode_trusted(n, next_tokens, batch.block_table, batch.seq_lens, ...)
    batch.advance(n)                             # seq_lens and step += K on the device

Nothing is re-staged per block: rows are written when a request is admitted, grows a page, stops
drawing or leaves; seq_lens and the sampling draw index advance on the device (one add per
block). The host keeps a mirror of every row (numpy) and a set of dirty cells / rows; `flush`
packs them into pinned buffers (two sets, each reused only after the copy that read it passed),
copies them with non-blocking copies and scatters them with `index_copy_` (no sync).

Device tensors (the runtime's device; B = max_batch, W = max_pages_per_seq):
    block_table  [B, W] int32    page ids; a row's columns past its pages are stale (never read:
                                 rows read only the pages their seq_len covers)
    ints         [4, B] int32    rows: seq_lens (0 = padding), step (the next draw index),
                                 advance (K while the row decodes, else 0), top_k (0 = off)
    floats       [2, B] float32  rows: temperature (0 = greedy), top_p
    seed         [B]    int64
"""
from __future__ import annotations

import numpy as np
import torch

from graphrt.model.sampling import SamplingInputs

PAD_PAGE = -1                       # host mirror: block-table entries past a request's pages
SEQ, STEP, ADVANCE, TOP_K = range(4)  # rows of `ints`
TEMPERATURE, TOP_P = range(2)          # rows of `floats`


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
    def __init__(self, *, max_batch: int, max_pages_per_seq: int, device: torch.device):
        b, w = max_batch, max_pages_per_seq
        self.max_batch, self.width, self.device = b, w, device
        # host mirror (numpy): written immediately, copied to the device by flush()
        self.block_table_host = np.full((b, w), PAD_PAGE, dtype=np.int32)
        self._ints = np.zeros((4, b), dtype=np.int32)
        self._floats = np.zeros((2, b), dtype=np.float32)
        self._floats[TOP_P] = 1.0
        self._seed = np.zeros(b, dtype=np.int64)
        self._dirty_cells: list[int] = []            # flat indices into block_table
        self._dirty_rows: set[int] = set()
        # device
        self.block_table = torch.full((b, w), PAD_PAGE, dtype=torch.int32, device=device)
        self.ints = torch.zeros((4, b), dtype=torch.int32, device=device)
        self.floats = torch.from_numpy(self._floats.copy()).to(device)
        self.seed = torch.zeros(b, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self._stages = [_Stage(pin), _Stage(pin)]
        self._flip = 0

    # ---- device views -------------------------------------------------------------------------
    @property
    def seq_lens(self) -> torch.Tensor:
        """[B] int32 device: KV tokens per row counting the current token; 0 = padding."""
        return self.ints[SEQ]

    def sampling(self, n: int) -> SamplingInputs:
        """Rows [0, n) of the sampling parameters (device views, valid while the batch lives)."""
        return SamplingInputs(self.floats[TEMPERATURE, :n], self.ints[TOP_K, :n],
                              self.floats[TOP_P, :n], self.seed[:n], self.ints[STEP, :n])

    # ---- host writes (recorded, copied by flush) ----------------------------------------------
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

    def activate(self, slot: int, *, seq_len: int, step: int, advance: int, temperature: float,
                 top_k: int, top_p: float, seed: int) -> None:
        """The row decodes from the next block: seq_len counts its current token; step is the
        draw index of its next token; advance: K (seq_len and step grow by it each block)."""
        ints, fl = self._ints, self._floats
        ints[SEQ, slot], ints[STEP, slot], ints[ADVANCE, slot], ints[TOP_K, slot] = seq_len, step, advance, top_k
        fl[TEMPERATURE, slot], fl[TOP_P, slot] = temperature, top_p
        self._seed[slot] = seed
        self._dirty_rows.add(slot)

    def deactivate(self, slot: int) -> None:
        """The row becomes padding (seq_len 0) and stops advancing."""
        self._ints[SEQ, slot] = self._ints[ADVANCE, slot] = 0
        self._floats[TEMPERATURE, slot] = 0.0
        self._dirty_rows.add(slot)

    # ---- device updates -----------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return bool(self._dirty_cells or self._dirty_rows)

    def flush(self) -> None:
        """Copy every recorded change to the device (stream-ordered, no sync)."""
        if not self.dirty:
            return
        cells = self._dirty_cells
        if len(set(cells)) != len(cells):            # a cell written twice: once is enough
            cells = sorted(set(cells))
        cells = np.array(cells, dtype=np.int64)
        rows = np.fromiter(self._dirty_rows, dtype=np.int64, count=len(self._dirty_rows))
        self._dirty_cells = []
        self._dirty_rows.clear()
        m, s = len(cells), len(rows)
        stage = self._stages[self._flip]
        self._flip ^= 1
        (i64, n64), (i32, n32), (f32, nf) = stage.take(m + 2 * s, m + 4 * s, 2 * s)
        n64[:m] = cells
        n32[:m] = self.block_table_host.reshape(-1)[cells]
        if s:
            n64[m:m + s], n64[m + s:] = rows, self._seed[rows]
            n32[m:] = self._ints[:, rows].reshape(-1)
            nf[:] = self._floats[:, rows].reshape(-1)
        dev = self.device
        d64, d32 = i64.to(dev, non_blocking=True), i32.to(dev, non_blocking=True)   # no-ops on CPU
        df = f32.to(dev, non_blocking=True) if s else None
        if stage.event is not None:
            stage.event.record()
        if m:
            self.block_table.view(-1).index_copy_(0, d64[:m], d32[:m])
        if s:
            idx = d64[m:m + s]
            self.ints.index_copy_(1, idx, d32[m:].view(4, s))
            self.floats.index_copy_(1, idx, df.view(2, s))
            self.seed.index_copy_(0, idx, d64[m + s:])

    def advance(self, n: int) -> None:
        """After a block over rows [0, n): seq_lens and step += advance (device, one kernel)."""
        self.ints[SEQ:STEP + 1, :n].add_(self.ints[ADVANCE, :n])


__all__ = ["InputBatch", "PAD_PAGE"]
