"""A request's stream of RequestOutput deltas (an iterator; the engine fills it)."""
from __future__ import annotations

import asyncio
import queue

from graphrt.engine.params import RequestOutput


class RequestStream:
    """Iterate for deltas (text and token ids new since the previous item); the last item has
    finish_reason set. Without an engine thread, iterating drives the engine's loop."""

    def __init__(self, engine, request_id: str):
        self.engine, self.request_id = engine, request_id
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._done = False

    def put(self, item) -> None:
        """Engine side: a RequestOutput delta, or an exception to raise in the reader."""
        self._q.put(item)

    def _next(self):
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                if self.engine.threaded:
                    item = self._q.get()
                else:
                    self.engine.step()
                    continue
            if isinstance(item, BaseException):
                raise item
            return item

    def __iter__(self):
        while not self._done:
            out = self._next()
            self._done = out.finished
            yield out

    async def __aiter__(self):
        """For asyncio servers: each wait runs in a worker thread (start() the engine first)."""
        if not self.engine.threaded:
            raise RuntimeError("stream: async iteration needs the engine's thread (engine.start())")
        while not self._done:
            out = await asyncio.to_thread(self._next)
            self._done = out.finished
            yield out

    def result(self) -> RequestOutput:
        """Read the stream to its end; the whole output (text and token_ids concatenated)."""
        total = None
        for d in self:
            if total is None:
                total = RequestOutput(d.request_id, d.prompt_token_ids, d.text, list(d.token_ids), None)
            else:
                total.text += d.text
                total.token_ids += d.token_ids
            total.finish_reason = d.finish_reason
        return total
