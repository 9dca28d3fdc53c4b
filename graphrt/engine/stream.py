"""A request's stream of RequestOutput deltas (an iterator; the engine fills it).

Without an engine thread, reading a stream runs the engine's step on the reader's thread. On the
main thread a Ctrl-C (SIGINT) that arrives during a step is held until the step has finished
(`interrupt_after`): a KeyboardInterrupt raised half-way through a step would leave the engine's
state half-updated (and the engine dead); raised between steps, the caller can abort its own
requests (LLM.generate does) and the engine goes on serving.
"""
from __future__ import annotations

import _signal
import asyncio
import queue
import signal
import threading

from graphrt.engine.params import RequestOutput, join_deltas


class RequestStream:
    """Iterate for deltas (text and token ids new since the previous item); the last item has
    finish_reason set. Without an engine thread, iterating drives the engine's loop."""

    def __init__(self, engine, request_id: str, *, prompt: str | None = None):
        self.engine, self.request_id, self.prompt = engine, request_id, prompt
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._done = False

    def put(self, item) -> None:
        """Engine side: a RequestOutput delta (its `prompt` set to the request's prompt string),
        or an exception to raise in the reader."""
        if self.prompt is not None and isinstance(item, RequestOutput):
            item.prompt = self.prompt
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
        """Read the stream to its end; the whole output: each completion's deltas joined (text,
        token_ids and logprobs concatenated; the last cumulative_logprob, finish and stop
        reasons), completions ordered by index."""
        first, deltas = None, {}
        for d in self:
            first = first or d
            for o in d.outputs:
                deltas.setdefault(o.index, []).append(o)
        return RequestOutput(first.request_id, first.prompt_token_ids,
                             outputs=[join_deltas(i, deltas[i]) for i in sorted(deltas)],
                             prompt=first.prompt, prompt_logprobs=first.prompt_logprobs, finished=True,
                             num_cached_tokens=first.num_cached_tokens)


class interrupt_after:
    """Hold SIGINT for the duration of the block; raise KeyboardInterrupt when it ends if one came.
    Only on the main thread, and only while Python's default handler is installed (a handler the
    application installed is left alone); elsewhere a no-op. Entered once per engine step by a
    stream's reader: the handler is swapped through `_signal`, CPython's C module under `signal`
    (the same calls, without the enum wrapping: ~1 µs a step instead of ~25)."""

    __slots__ = ("_held", "_on")

    def __enter__(self):
        self._on = (threading.current_thread() is threading.main_thread()
                    and _signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        if self._on:
            self._held = []
            _signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self._held.append(signum)

    def __exit__(self, *exc) -> bool:
        if self._on:
            _signal.signal(signal.SIGINT, signal.default_int_handler)
            if self._held:
                raise KeyboardInterrupt
        return False
