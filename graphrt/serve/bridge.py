"""The boundary between the asyncio server and the engine's thread: a queue each way.

The engine (graphrt.engine.Engine) runs its loop on its own thread; `add_request` returns a
blocking iterator of RequestOutput deltas. `AsyncEngine.submit` turns that into an async
iterator: one small pump thread per request blocks on the engine's stream and hands each delta
to the event loop (`call_soon_threadsafe`). Leaving the async iterator early (client gone,
server error) aborts the request so the engine frees its pages.

Admission counts engine sequences, not HTTP requests: a prompt with n (or best_of) samples is
that many sequences, a completions request with several prompts the sum. At most max_batch
(decode slots) + max_waiting sequences are in flight. A request's sequences are held all at once
(`admit`) before any of its prompts is queued: a request that alone exceeds the limit is a 400
naming its field and the limit (it could never be admitted), one that does not fit now a 503 (retry
later).

Work that takes the event loop's thread for long is run on a small worker pool (`run`): request
parsing and validation, tokenization and chat templates, and the engine's add_request (its
token-id scan of the prompt and the stop-string automaton), so that /health and every stream
keep moving while a large request is taken in. A structured-output grammar compiles on the
engine's compile pool while the event loop, not a worker, waits for it (engine.compile_ahead):
slow grammars cannot take the pool that every other request needs; the grammar of a request's
tools is built on a pool of its own, also waited for on the event loop (`run_bounded`). At shutdown (`close_streams`) every open stream
ends with a 503 error and its request is aborted.
"""
from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from graphrt.serve.errors import APIError
from graphrt.serve.metrics import EngineStats, Metrics

GRAMMAR_WORKERS = 2         # threads for the grammars of tools (run_bounded)


@dataclass
class Finished:
    """A request's totals, filled as its deltas arrive (read by the routes for `usage`)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0                          # of the prompt's, found in the prefix cache
    output_tokens: int = 0
    finish_reason: str | None = None       # set once every sample has finished
    reason: str | None = None              # the latest sample's finish reason (n > 1)


class AsyncEngine:
    """engine: a started graphrt Engine (add_request / abort / scheduler); max_batch: its decode
    slots; max_waiting: how many more sequences (a request's samples each count) may queue before 503."""

    def __init__(self, engine, *, max_batch: int, max_waiting: int, metrics: Metrics, workers: int | None = None):
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting: must be an int >= 0, got {max_waiting!r}")
        self.engine, self.metrics = engine, metrics
        self.capacity = max_batch + max_waiting        # engine sequences
        self.in_flight = 0                             # sequences held; event-loop thread only
        self.closing = False                           # event-loop thread only: set by close_streams
        self._open: set[DeltaStream] = set()           # event-loop thread only
        n = workers or min(4, os.cpu_count() or 1)     # HF fast tokenizers release the GIL
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="graphrt-serve-work")
        self._grammar_pool = ThreadPoolExecutor(max_workers=GRAMMAR_WORKERS, thread_name_prefix="graphrt-serve-grammar")

    async def run(self, fn, *args):
        """fn(*args) on the worker pool (what it raises is raised here)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    async def run_bounded(self, fn, *args, timeout_s: float):
        """fn(*args) on the grammar pool (apart from the worker pool), waited for on the event loop
        for up to timeout_s, else TimeoutError: work that cannot be interrupted (xgrammar turning
        a client's schema into a grammar) runs on, but holds none of the worker pool's threads; if
        it never started it is cancelled."""
        fut = asyncio.get_running_loop().run_in_executor(self._grammar_pool, functools.partial(fn, *args))
        done, _ = await asyncio.wait([fut], timeout=timeout_s)
        if not done:
            fut.cancel()
            raise TimeoutError(f"not done within {timeout_s:g} s")
        return fut.result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._grammar_pool.shutdown(wait=False, cancel_futures=True)

    def close_streams(self) -> None:
        """Server shutdown (event-loop thread): refuse new requests; every open stream ends with a
        503 error event (whole responses: a 503) and its request is aborted."""
        self.closing = True
        for ds in list(self._open):
            ds._queue.put_nowait(APIError(503, "server: shutting down"))

    def stats(self) -> EngineStats:
        """Read the engine's scheduler from this thread: ints and lengths, no locks (a snapshot
        that may be one loop iteration stale)."""
        sched = self.engine.scheduler
        alloc = sched.allocator
        running = sum(s is not None for s in list(sched.slots))
        waiting = max(len(sched.waiting), self.in_flight - running)
        free = alloc.num_free
        counts = getattr(self.engine, "spec_counts", None) if getattr(self.engine, "spec", None) else None
        cache = getattr(getattr(sched, "kv", None), "cache", None)
        return EngineStats(running=running, waiting=waiting, pages_used=alloc.num_pages - free, pages_free=free,
                           spec=None if counts is None else dict(counts),
                           prefix_queries=cache.queries if cache is not None else 0,
                           prefix_hits=cache.hits if cache is not None else 0,
                           mixed=None if getattr(self.engine, "mixed_counts", None) is None
                           else dict(self.engine.mixed_counts))

    def healthy(self) -> bool:
        """The engine's loop runs and has not died (engine.error: an unattributable failure)."""
        return bool(getattr(self.engine, "threaded", True)) and getattr(self.engine, "error", None) is None

    def admit(self, seqs: int, *, field: str = "n") -> None:
        """Hold `seqs` engine sequences for a request about to be queued (event-loop thread), or
        raise: 503 when the engine is down, shutting down, or the sequences do not fit now; 400
        naming `field` when they exceed the limit on their own. The caller queues them with
        `submit(..., held=True)` or gives back what it does not queue (`release`)."""
        if not self.healthy():
            raise APIError(503, "engine: the engine loop is not running")
        if self.closing:
            raise APIError(503, "server: shutting down")
        self.check_size(seqs, field=field)
        if self.in_flight + seqs > self.capacity:
            self.metrics.rejected += 1
            raise APIError(503, f"queue full: {self.in_flight} sequences in flight and this request's {seqs}, "
                                f"the limit is max_batch + max_waiting = {self.capacity}; retry later")
        self.in_flight += seqs

    def check_size(self, seqs: int, *, field: str = "n") -> None:
        """400 naming `field` when a request of `seqs` sequences could never be admitted (a check
        a route makes before it tokenizes anything; `admit` makes it again)."""
        if seqs > self.capacity:
            raise APIError.bad_request(f"{field}: the request is {seqs} sequences (prompts x n or best_of), the "
                                       f"server admits at most max_batch + max_waiting = {self.capacity} "
                                       f"(--max-waiting)", param=field)

    def release(self, seqs: int) -> None:
        """Give back sequences held by `admit` that were not queued."""
        self.in_flight -= seqs

    async def submit(self, prompt, params, *, kind: str = "cmpl", held: bool = False) -> tuple[str, "DeltaStream"]:
        """Queue a prompt (engine.add_request on the worker pool); returns (request id, async
        iterator of deltas). Its params.samples sequences are held here (`admit`), or were held
        by the caller (held=True); they are given back when it fails or its stream closes.
        Raises APIError 503 when full or shutting down, 400 (from the engine's ValueError) for a
        bad prompt or parameters."""
        seqs = params.samples
        if not held:
            self.admit(seqs)
        elif self.closing:
            self.release(seqs)
            raise APIError(503, "server: shutting down")
        rid = f"{kind}-{uuid.uuid4().hex}"
        loop = asyncio.get_running_loop()
        added = asyncio.ensure_future(self._add(prompt, params, rid))
        try:
            stream = await asyncio.shield(added)
        except asyncio.CancelledError:                 # the route was cancelled: abort once it is added
            self.release(seqs)
            added.add_done_callback(lambda f: f.cancelled() or f.exception() or self.engine.abort(rid))
            raise
        except ValueError as e:
            self.release(seqs)
            raise APIError.from_value_error(e) from None
        except RuntimeError as e:                      # EngineDeadError: it died since healthy()
            self.release(seqs)
            raise APIError(503, f"engine: {e}") from None
        except BaseException:
            self.release(seqs)
            raise
        ds = DeltaStream(self, rid, stream, loop, seqs)
        self._open.add(ds)
        if self.closing:                               # shutdown began while add_request ran
            ds._queue.put_nowait(APIError(503, "server: shutting down"))
        return rid, ds


    async def _add(self, prompt, params, rid: str):
        """engine.add_request on the worker pool, once the request's grammar (if any) compiled: that
        wait is the event loop's (a slow grammar holds no worker of the pool, which every request's
        parsing and tokenization need)."""
        compiling = await self.run(self.engine.compile_ahead, params)
        if compiling is not None:
            await asyncio.wait([asyncio.wrap_future(compiling)], timeout=self.engine.compile_timeout_s)
        return await self.run(functools.partial(self.engine.add_request, prompt, params, request_id=rid))


class DeltaStream:
    """Async iterator over one request's RequestOutput deltas; `totals` is filled as it goes.
    Close it (async for ... break, or aclose()) to abort the request if unfinished."""

    def __init__(self, owner: AsyncEngine, request_id: str, stream, loop: asyncio.AbstractEventLoop,
                 seqs: int = 1):
        self.owner, self.request_id, self.totals = owner, request_id, Finished()
        self.seqs = seqs                                # the engine sequences it holds (owner.admit)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._t0 = time.perf_counter()
        self._t_first: float | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._pump, args=(stream, loop), daemon=True,
                                        name=f"graphrt-serve-{request_id[:12]}")
        self._thread.start()

    def _pump(self, stream, loop) -> None:          # pump thread: blocking reads of the engine's stream
        try:
            for delta in stream:
                loop.call_soon_threadsafe(self._queue.put_nowait, delta)
        except BaseException as e:                      # handed to the reader
            if not loop.is_closed():                    # closed: the server is gone, no reader is left
                loop.call_soon_threadsafe(self._queue.put_nowait, e)

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        t = self.totals
        try:
            while t.finish_reason is None:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    if not isinstance(item, APIError):  # the engine failed it (and freed it);
                        t.finish_reason = "error"       # an APIError (shutdown): _close aborts it
                    raise item
                now = time.perf_counter()
                new = sum(len(o.token_ids) for o in item.outputs)   # n > 1: each sample's delta
                if new and self._t_first is None:
                    self._t_first = now
                t.prompt_tokens = len(item.prompt_token_ids)
                t.cached_tokens = item.num_cached_tokens
                t.output_tokens += new
                self.owner.metrics.tokens_streamed(new)
                for o in item.outputs:                  # the last sample's reason ("abort" wins)
                    if o.finish_reason is not None and t.reason != "abort":
                        t.reason = o.finish_reason
                if item.finished:
                    t.finish_reason = t.reason
                    self._t_last = now
                yield item
        finally:
            self._close()

    def close(self) -> None:
        """Abort the request if unfinished and count it (idempotent; iteration's end calls it)."""
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.owner._open.discard(self)
        t = self.totals
        if t.finish_reason is None:                     # left early: free the engine's pages
            self.owner.engine.abort(self.request_id)
            t.finish_reason = "abort"
        self.owner.release(self.seqs)
        ttft = self._t_first - self._t0 if self._t_first is not None else None
        decode = (self._t_last - self._t_first
                  if self._t_first is not None and t.finish_reason in ("stop", "length") else None)
        self.owner.metrics.request_done(finish_reason=t.finish_reason, prompt_tokens=t.prompt_tokens,
                                        output_tokens=t.output_tokens, ttft_s=ttft, decode_s=decode)


__all__ = ["AsyncEngine", "DeltaStream", "Finished"]
