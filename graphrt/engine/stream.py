"""A request's stream of RequestOutput deltas (an iterator; the engine fills it).

Without an engine thread, reading a stream runs the engine's step on the reader's thread. On the
main thread a Ctrl-C (SIGINT) that arrives during a step is held until the step has finished
(`interrupt_after`): a KeyboardInterrupt raised half-way through a step would leave the engine's
state half-updated (and the engine dead); raised between steps, the caller can abort its own
requests (LLM.generate does) and the engine goes on serving.
"""
from __future__ import annotations

import asyncio
import queue
import signal
import threading
from contextlib import contextmanager

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
                    with interrupt_after():
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
                total = RequestOutput(d.request_id, d.prompt_token_ids, d.text, list(d.token_ids), None,
                                      num_cached_tokens=d.num_cached_tokens,
                                      logprobs=None if d.logprobs is None else list(d.logprobs),
                                      prompt_logprobs=d.prompt_logprobs)
            else:
                total.text += d.text
                total.token_ids += d.token_ids
                if d.logprobs is not None:
                    total.logprobs = (total.logprobs or []) + d.logprobs
            total.finish_reason = d.finish_reason
        return total


@contextmanager
def interrupt_after():
    """Hold SIGINT for the duration of the block; raise KeyboardInterrupt when it ends if one came.
    Only on the main thread, and only while Python's default handler is installed (a handler the
    application installed is left alone); elsewhere a no-op."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    held = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if held:
            raise KeyboardInterrupt
