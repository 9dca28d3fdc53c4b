"""A prompt chunk carried by a decode block's first step: one weight stream for both.

A prompt chunk prefilled between two decode blocks streams every weight of the model once more,
and the decoding rows wait for all of it. A mixed step runs the decode rows' B tokens and up to
C prompt tokens of one slot through one pass of the layer loop (`LlamaDecoder.mixed_step`): the
GEMMs see B + C rows (one weight stream), one rope_append launch writes the K/V of both, the
decode rows attend with the step's plan and the chunk with the plan-free multi-query kernel
(causal over its slot's cached tokens). The chunk's logits are not computed: a prompt's last
token is not in a chunk but the current token of its slot's decode row, which the engine starts
in the same block (engine/blocks.py), so the block's first step draws the request's first token.

    mc = MixedChunk(model, config, device, max_tokens=128)
    mc.stage(slot, tokens, start, table_row=row, num_pages=P)   # host: checks, one pinned copy
    ... inside a decode graph's first step (model/runtime.py, GraphKey(..., chunk=C)):
    logits = mc.step(model, ctx, tokens, kv_caches, block_table, error)   # [B, V]

The chunk's K/V go to `block_table[slot]`, the runtime's slot table (the executor's input batch):
the slot's row is read on the device, never copied per block. Capture and warm-up run with
n = 0 (nothing written). Each staged chunk is replayed once (`take`): a second replay of the same
staging is refused.

Device buffer (the runtime's device, one host-to-device copy per staging): buf [3 + C] int64 =
slot, start (tokens of the slot already in the cache), n (real chunk tokens, 0 = none), then the
C chunk tokens (past the n real ones: 0).
"""
from __future__ import annotations

import numpy as np
import torch

from graphrt.attention.inputs import check_host_values
from graphrt.config import check_mixed_tokens
from graphrt.kernels.mq_launch import piece_launch
from graphrt.kernels.transfer import copy_into

SLOT, START, LEN = range(3)    # the first entries of `buf`


class MixedChunk:
    """The chunk inputs of one runtime's mixed decode graphs. model: the LlamaDecoder (one rank);
    config: its RuntimeConfig; max_tokens: C, the chunk bucket (1..MAX_MIXED_TOKENS)."""

    def __init__(self, model, config, device, *, max_tokens: int):
        if check_mixed_tokens(max_tokens) < 1:
            raise ValueError("mixed_prefill_tokens: must be >= 1 to build a MixedChunk")
        if max_tokens > config.max_context_len:
            raise ValueError(f"mixed_prefill_tokens: {max_tokens} exceeds max_context_len={config.max_context_len}")
        self.config, self.device, self.max_tokens = config, torch.device(device), max_tokens
        self.vocab = model.spec.vocab_size
        self.buf = torch.zeros(3 + max_tokens, dtype=torch.int64, device=self.device)  # slot, start, n, tokens
        self.tokens = self.buf[3:]                                                     # [C] view
        self._host = torch.zeros(3 + max_tokens, dtype=torch.int64)                    # staging (CPU)
        self._staged = False
        heads = getattr(model, "local_spec", model.spec)
        group = heads.num_heads // heads.num_kv_heads
        self.splits, self.block_n = piece_launch(self.device, max_tokens, group, heads.num_kv_heads,
                                                 config.max_context_len)   # as the graphed prefill's

    @property
    def capture_inputs(self) -> list:
        """(tensor, fill) pairs the graph runner sets for warm-up and capture (n = 0: nothing
        written) and restores after."""
        return [(self.buf, 0)]

    def stage(self, slot: int, tokens: torch.Tensor, start: int, *, table_row=None,
              num_pages: int | None = None) -> None:
        """The next mixed replay prefills `tokens` (CPU [n] int64, 1 <= n <= C, ids in the
        vocabulary) at positions [start, start + n) of `slot`. table_row (host ints, the slot's
        block-table row) and num_pages: when given, every page the chunk reads or writes
        (positions < start + n) must be a page id in [0, num_pages). ValueError names the field;
        one non-blocking copy to the device (no host sync)."""
        c = self.config
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < c.max_batch:
            raise ValueError(f"slot: must be an int in [0, {c.max_batch}), got {slot!r}")
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64 or tokens.dim() != 1 \
                or tokens.device.type != "cpu" or not 1 <= tokens.numel() <= self.max_tokens:
            got = f"{tuple(tokens.shape)} {tokens.dtype} on {tokens.device}" if isinstance(tokens, torch.Tensor) \
                else type(tokens).__name__
            raise ValueError(f"tokens: expected CPU [1..{self.max_tokens}] int64, got {got}")
        n = tokens.numel()
        ids = tokens.numpy()                                   # numpy: no torch dispatch per block
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab:
            raise ValueError(f"tokens: ids in [{lo}, {hi}], vocabulary has {self.vocab}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start + n > c.max_context_len:
            raise ValueError(f"start: must be an int >= 0 with start + {n} <= max_context_len="
                             f"{c.max_context_len}, got {start!r}")
        if table_row is not None:                              # the decode checks' page rule
            try:
                check_host_values(c, c.pool_pages if num_pages is None else num_pages,
                                  torch.from_numpy(np.ascontiguousarray(table_row, dtype=np.int32)[None]),
                                  np.array([start + n]), lens_name="start + tokens")
            except ValueError as e:
                raise ValueError(f"table_row: {e}") from None
        h = self._host
        h[SLOT], h[START], h[LEN] = slot, start, n
        h[3:3 + n] = tokens
        h[3 + n:] = 0
        copy_into(self.buf, h)
        self._staged = True

    def take(self) -> None:
        """A mixed replay is about to run: RuntimeError unless a chunk was staged since the last."""
        if not self._staged:
            raise RuntimeError("mixed chunk: nothing staged for this replay (stage() first; each "
                               "staging runs once)")
        self._staged = False

    def step(self, model, ctx, tokens: torch.Tensor, kv_caches, block_table: torch.Tensor,
             error: torch.Tensor) -> torch.Tensor:
        """The mixed decode step: tokens [B] int64 (the decode rows; ctx prepared for them) plus
        the staged chunk -> [B, V] logits of the decode rows (model dtype). block_table: the
        runtime's slot table [max_batch, W] int32; error: the sticky device flag the K/V
        appends raise. Fixed shapes, no host sync: capturable."""
        head = self.buf[:3].to(torch.int32)                                 # slot, start, n
        n = head[LEN:LEN + 1]                                               # [1] int32
        slot = head[SLOT:SLOT + 1]
        start = head[START]
        seq = ctx.view.seq_lens                                             # [B] int32 (decode rows)
        b = tokens.shape[0]
        j = torch.arange(self.max_tokens, device=self.device, dtype=torch.int32)
        i = torch.arange(b, device=self.device, dtype=torch.int32)
        positions = torch.cat([(seq - 1).clamp_min(0), start + j])          # [B + C] int32
        rows = torch.cat([torch.where(seq > 0, i, -1), torch.where(j < n, slot, -1)]).to(torch.int32)
        #      ^ the decode rows' own table rows, then the chunk's slot (padding: -1 writes none)
        kv_lens = torch.where(n > 0, start + n, 0).to(torch.int32)          # [1]
        table = block_table.index_select(0, slot.long())                    # [1, W] (device gather)
        return model.mixed_step(ctx, tokens, self.tokens, positions.to(torch.int32), rows, table, kv_lens,
                                n, kv_caches, block_table, error, splits=self.splits, block_n=self.block_n)

__all__ = ["MixedChunk"]
