"""Prefill pacing: how many prompt tokens may run between two decode blocks while streams decode.

A prompt chunk launched between decode blocks adds its whole time to the running streams' next
delta. The pacer keeps that addition under `max_stall` times a decode block's time: it measures
both (GPU time between CUDA events on the engine's stream; wall time on CPU, where work is
synchronous) and sizes the next chunk from the measured cost per prompt token, in whole pages,
between one page and `max_tokens` (the engine's max_num_batched_tokens). The cost per token is a
running mean over recent chunks, so it follows the chunk sizes the pacer itself picks (a small
chunk costs more per token) and the context the chunks attend to.

Measurements are read without a host sync: a pair of events is read once its end event has
completed (`poll`, called where the engine has just waited for a block anyway).
"""
from __future__ import annotations

import time
from collections import deque

FIRST_CHUNK_PAGES = 4          # before any measurement: a small chunk, measured, then sized
EMA = 0.5                      # weight of the newest measurement in the running means


def check_max_stall(v) -> None:
    """max_prefill_stall: None or a number in (0, 100] (a chunk's time over a decode block's)."""
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 100):
        raise ValueError(f"max_prefill_stall: must be None or a number in (0, 100] (a prompt chunk's time "
                         f"over a decode block's), got {v!r}")


class PrefillPacer:
    """max_stall: a chunk's time over a decode block's (> 0), or None (max_tokens only);
    page_size: chunks are whole pages; max_tokens: the cap (None: no cap, the budget alone);
    device: torch.device of the engine (CUDA: events, else wall time)."""

    def __init__(self, max_stall: float | None, *, page_size: int, max_tokens: int | None, device):
        check_max_stall(max_stall)
        self.max_stall, self.page, self.max_tokens = max_stall, page_size, max_tokens
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.us_per_token: float | None = None      # prompt chunks: GPU us per token
        self.block_us: float | None = None          # decode blocks: GPU us per block
        self._open: deque = deque()                 # (kind, tokens, start, end) not yet read

    def budget(self) -> int | None:
        """Prompt tokens the next step may prefill while rows decode (None: no limit)."""
        if self.max_stall is None:
            return self.max_tokens
        if self.us_per_token is None or self.block_us is None:
            want = FIRST_CHUNK_PAGES * self.page
        else:
            want = int(self.max_stall * self.block_us / self.us_per_token) // self.page * self.page
        want = max(want, self.page)
        return want if self.max_tokens is None else min(want, self.max_tokens)

    def start(self):
        """A mark before a launch: a CUDA event recorded on the current stream, or the clock."""
        if not self.cuda:
            return time.perf_counter()
        import torch
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def launched(self, kind: str, mark, tokens: int = 0) -> None:
        """The work since `mark` (from start()) was one `kind` launch: "chunk" (`tokens` prompt
        tokens prefilled while rows decode) or "block" (a decode block)."""
        if self.max_stall is None:
            return
        if not self.cuda:
            self._observe(kind, tokens, (time.perf_counter() - mark) * 1e6)
            return
        import torch
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._open.append((kind, tokens, mark, end))

    def poll(self) -> None:
        """Read the launches whose end events completed (oldest first; no host sync)."""
        while self._open and self._open[0][3].query():
            kind, tokens, a, b = self._open.popleft()
            self._observe(kind, tokens, a.elapsed_time(b) * 1e3)

    def _observe(self, kind: str, tokens: int, us: float) -> None:
        if kind == "chunk":
            if tokens > 0:
                x = us / tokens
                self.us_per_token = x if self.us_per_token is None else EMA * x + (1 - EMA) * self.us_per_token
        elif kind == "block":
            self.block_us = us if self.block_us is None else EMA * us + (1 - EMA) * self.block_us
        else:
            raise ValueError(f"kind: {kind!r} is neither 'chunk' nor 'block'")

    def stats(self) -> dict:
        """Engine.stats() keys: the current budget and the measured costs behind it."""
        return {"prefill_budget_tokens": self.budget(), "prefill_us_per_token": self.us_per_token,
                "decode_block_us": self.block_us}


__all__ = ["PrefillPacer", "FIRST_CHUNK_PAGES", "check_max_stall"]
