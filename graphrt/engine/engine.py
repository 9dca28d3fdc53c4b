"""The engine loop: requests in, prefill, K-step decode blocks, tokens streamed out.

    engine = Engine(executor, tokenizer, eos_token_ids=(...), max_model_len=4096)   # graphrt/worker
    stream = engine.add_request("Hello", SamplingParams(max_tokens=32))   # thread-safe
    for delta in stream: ...                      # RequestOutput deltas; the last has finish_reason
    engine.abort(stream.request_id)               # thread-safe; frees the pages in the loop

One loop (`step`) drives everything; call it yourself (streams do, when iterated without a
thread) or run it on a background thread (`start()` / `shutdown()`); callers only touch queues.

Overlap (overlap=True, the default): a block is launched before the previous block's tokens are
read. While the GPU runs block N+1 the host waits for block N's tokens (a non-blocking copy plus
an event), detokenizes them, checks stops, streams deltas, frees finished requests' pages and
admits (and prefills) new requests; block N+1 reads the runtime's per-slot device state in place
(model/slots.py: input tokens, lengths, block table, sampling rows, token history), which the
executor updates with only what changed (the scheduler's slot changes, worker/changes.py, carried
by each launch) and the graphs advance on the device (by K, or by each row's accepted count).

Speculation (EngineConfig.speculative): a block is R rounds of propose -> verify -> accept on
the device (speculative/runner.py) at the k the policy chose (or a plain K-step block); each row emits 1..k+1 tokens a round, read back with the
block's emitted counts in the same asynchronous copy; deltas then carry several tokens. Stop
ids, EOS, stop strings and max_tokens are applied to them as to a K-step block. The cost: a request that stops inside block
N runs block N+1 too, and those tokens are discarded. Pages freed while a block is in flight
are safe: every device op (decode blocks, prefills of the next owners) runs in order on one
stream. A preempted request (scheduler.py) skips the tokens of its blocks still in flight (its
epoch moved on) and is prefilled again later over prompt + its accepted tokens.
Prefill (ModelRuntime.prefill: captured prefill graphs on CUDA, model/prefill_graphs.py) starts
after the context's cached prefix (prefix cache) and, while rows decode, runs at most
prefill_budget() prompt tokens between two decode blocks (scheduler.py: prefill_work): with
max_prefill_stall, the share of a decode block's measured time a chunk may add (pacing.py),
capped by max_num_batched_tokens. With a runtime built with mixed_prefill_tokens=C (no
speculation), a plain decode block instead carries up to C tokens of the first prefilling
request in its first step (model/mixed.py: one weight stream for both; Scheduler.mixed_piece),
whatever the pacer's budget (the streams' pace first), and the request decodes in the block
that carries its last piece (blocks.py).
Launching a prefill or a block and reading its tokens back: blocks.py (a mixin of Engine).

Failure policy (docs/engine.md): an exception raised by one request's work (its prefill, its
tokens' stop checks and detokenization, its stream) fails that request only: its stream raises
the exception, its slot and pages are freed, the loop goes on. Anything else (a decode block,
admission, a CUDA error, a dead tensor-parallel rank) is unattributable: it is logged with its
traceback, the step's caller gets the error itself, every request's stream raises
EngineDeadError (its __cause__ is the error), `error` is set, `dead` fires, and every later
step / add_request raises EngineDeadError.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import queue
import random
import threading
from collections import deque
from operator import countOf

import numpy as np

from graphrt.engine.blocks import BlockMixin
from graphrt.engine.detokenizer import TextState, make_decoder
from graphrt.engine.failure import EngineDeadError, attributable
from graphrt.engine.group import GroupSink, child_params, child_seeds, prefill_groups
from graphrt.engine.token_bytes import token_bytes
from graphrt.engine.params import SamplingParams, check_prompt_len
from graphrt.engine import sampling_extras as extras
from graphrt.engine.structured import COMPILE_TIMEOUT_S, Grammars, unmasked_ok
from graphrt.engine.scheduler import Request, Scheduler
from graphrt.engine.pacing import PrefillPacer, check_max_stall
from graphrt.engine.speculation import BlockClock, default_policy, spec_stats
from graphrt.engine.stream import RequestStream
from graphrt.worker.protocol import check_executor

log = logging.getLogger("graphrt.engine")
ARRAY_FROM_TOKENS = 64     # prompts this long or longer are also kept as an int64 array (_prompt_ids)


class Engine(BlockMixin):
    """runtime: the executor (graphrt/worker/protocol.py's Executor: a LocalExecutor, the
    tensor-parallel TPExecutor, or any object implementing the protocol). The engine reads its
    `caps` once here and drives it through the protocol's calls only."""

    def __init__(self, runtime, tokenizer, *, eos_token_ids: tuple[int, ...], max_model_len: int,
                 overlap: bool = True, seed: int | None = None, policy=None,
                 enable_prefix_caching: bool = True, max_num_batched_tokens: int | None = None,
                 max_prefill_stall: float | None = None):
        caps = check_executor(runtime).caps
        c, spec = caps.config, caps.speculative
        ahead = max(caps.steps_per_graph, caps.spec_tokens)
        if max_model_len + ahead > c.max_context_len:
            raise ValueError(f"max_model_len: {max_model_len} + lookahead {ahead} (K, or k proposals) "
                             f"exceeds the runtime's max_context_len {c.max_context_len}")
        self.runtime, self.caps, self.tokenizer, self.device = runtime, caps, tokenizer, caps.device
        # the device guards' sticky flags, read with every block's tokens (None: the executor
        # keeps none); under tensor parallelism rank 0's: every rank runs the same inputs
        self._error_flag = runtime.error_flag if caps.device_errors else None
        self.vocab_size, self.max_model_len, self.overlap = caps.vocab_size, max_model_len, overlap
        self.spec, self.rounds = spec, caps.spec_rounds
        seed_key, budget = prefill_options(caps, enable_prefix_caching, max_num_batched_tokens)
        self.scheduler = Scheduler(max_batch=c.max_batch, page_size=c.page_size,
                                   max_pages_per_seq=c.max_pages_per_seq, num_pages=caps.num_pages - 1,
                                   steps_per_graph=caps.steps_per_graph, eos_token_ids=tuple(eos_token_ids),
                                   spec_k=caps.spec_tokens,
                                   spec_rounds=self.rounds, cache_seed=seed_key,
                                   max_num_batched_tokens=budget)
        check_max_stall(max_prefill_stall)
        if max_prefill_stall is not None:
            self.scheduler.pacer = PrefillPacer(max_prefill_stall, page_size=c.page_size, max_tokens=budget,
                                                device=self.device)
        self.scheduler.forks = caps.shared_prefill    # an EAGLE-3 head prefills every sample
        # mixed_tokens C > 0: a plain decode block carries a prompt chunk of up to C tokens
        # (model/mixed.py); not with speculation (its blocks verify instead) or without chunked
        # prefill. May be set to 0 between steps (chunks between blocks instead), never above
        # the runtime's C
        self.mixed_tokens = caps.mixed_tokens if spec is None and budget is not None else 0
        self.mixed_counts = {"chunks": 0, "tokens": 0} if self.mixed_tokens else None   # loop thread
        self.spec_counts = {"proposed": 0, "accepted": 0, "rounds": 0, "emitted": 0,   # loop thread
                            "blocks": 0, "plain_blocks": 0}
        # the speculation policy (speculative/policy.py): per block, k or a plain decode block
        self.policy = policy if policy is not None or spec is None else default_policy(runtime, caps)
        self._clock = BlockClock(None, depth=1 if overlap else 0)   # block wall times -> the policy
        self._pending: deque = deque()         # launched blocks (blocks._Pending), oldest first
        # time_blocks (CUDA; set by tools, off by default): each block's device time from CUDA
        # events around its launch, summed per kind in block_device_s (stats()); loop thread
        self._time_blocks = False
        self.block_device_s = {"prefill": 0.0, "decode": 0.0, "spec": 0.0}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}       # loop thread only
        self._groups: dict[str, list[str]] = {}       # n > 1: request id -> its samples' ids (group.py)
        self._ids = itertools.count()
        self._rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
        self._lock = threading.Lock()                 # ids and seeds (add_request from any thread)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False                        # close(): no new requests
        self._wake = threading.Event()
        self._tokens_generated = 0                     # streamed tokens, all requests
        self._step_lock = threading.Lock()             # one step at a time (streams on many threads)
        self.error: BaseException | None = None         # set once, by an unattributable failure
        self.dead = threading.Event()                   # fires with `error` (supervisors wait on it)
        self._decode_text = make_decoder(tokenizer)    # one per engine, shared by requests
        self._token_bytes = token_bytes(tokenizer, self.vocab_size)   # None: decode through the tokenizer
        self._token_text = extras.TokenText(self._decode_text)        # Logprob.decoded_token
        self._grammars: Grammars | None = None         # built with the first constrained request
        self.compile_timeout_s = COMPILE_TIMEOUT_S     # a grammar compiling longer fails its request
        self._masked_slots: set[int] = set()           # slots whose mask flag is on (loop thread)
        self._ahead = None                             # a split step's forward launched before its draw (constrained._Ahead)

    # ---- requests (any thread) ----------------------------------------------------------------
    def add_request(self, prompt, params: SamplingParams | None = None, *,
                    request_id: str | None = None) -> RequestStream:
        """Queue a prompt (a string or a list of token ids); returns its stream of deltas.
        Raises ValueError naming the field for a bad prompt or parameters."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(params).__name__}")
        self._check_alive()
        if self._closed:                               # a reader may still step it: its streams end
            raise RuntimeError("engine: closed (LLM.shutdown() or Engine.close()); create a new LLM")
        ids, ids_array = self._prompt_ids(prompt)
        check_prompt_len(len(ids), max_tokens=params.max_tokens, max_model_len=self.max_model_len)
        if params.top_k > self.vocab_size:              # the same distribution; fits the int32 row
            params = dataclasses.replace(params, top_k=self.vocab_size)
        need = self.scheduler.pages_needed(len(ids), params.max_tokens)
        if need > self.scheduler.allocator.num_pages:
            raise ValueError(f"prompt: needs {need} KV pages, the pool has num_pages="
                             f"{self.scheduler.allocator.num_pages}")
        child = child_params(params) if params.samples > 1 else params   # n > 1: group.py
        with self._lock:
            rid = request_id if request_id is not None else f"req-{next(self._ids)}"
            seeds = child_seeds(params, lambda: self._rng.randrange(2**63))
        rules = extras.check_request(self.caps, child, self.tokenizer, self.scheduler.eos, self.vocab_size)
        compiled = self._compile(child) if child.structured_outputs is not None else None
        free = ((self.spec is None or self.caps.spec_grammar) and self.FREE_RUN
                and unmasked_ok(child))       # constrained rows: unmasked runs (n-gram speculation too)
        grammar = lambda: None if compiled is None else self._grammars.state(   # noqa: E731 (one per sample)
            compiled, child.structured_outputs.kind, free=free)
        stream = RequestStream(self, rid, prompt=prompt if isinstance(prompt, str) else None)
        text = lambda: TextState(self.tokenizer, child.stop, decode=self._decode_text, table=self._token_bytes)
        if len(seeds) == 1:
            req = Request(rid, ids, params, seeds[0], text(), stream.put, prompt_array=ids_array)
            req.rules = rules
            req.grammar = grammar()
            self._inbox.put(("add", req))
        else:
            if rid in self._groups:
                raise ValueError(f"request_id: {rid!r} is already running")
            cids = [f"{i}_{rid}" for i in range(len(seeds))]
            group = GroupSink(stream, params, ids, child_ids=cids, abort=self.abort, prompt=stream.prompt,
                              done=lambda: self._groups.pop(rid, None))
            self._groups[rid] = cids
            first = None
            for i, (cid, seed) in enumerate(zip(cids, seeds)):
                req = Request(cid, ids, child, seed, text(), group.sink(i), sibling=first, prompt_array=ids_array)
                req.rules = rules
                req.grammar = grammar()
                first = first or req
                self._inbox.put(("add", req))
        self._wake.set()
        if self.error is not None:                      # died meanwhile: the loop may never see it
            stream.put(self._dead_error())
        return stream

    def _compile(self, params: SamplingParams):
        """The request's compiled grammar (engine/structured.py; on the caller's thread, bounded
        by the compile timeout). ValueError naming the field."""
        if not self.caps.structured:
            raise ValueError("structured_outputs: needs a runtime with logits processing (not supported "
                             "under tensor parallelism yet)")
        return self._compiler().compile(params.structured_outputs)

    def compile_ahead(self, params: SamplingParams):
        """Start compiling the request's grammar without waiting (cached): a concurrent Future, or
        None (no constraint, or none supported: add_request says why). A caller that must not hold
        a thread while it compiles (the HTTP server's event loop) waits on it for up to
        `compile_timeout_s`, then calls add_request, which finds it done (or fails it as late)."""
        if params.structured_outputs is None or not self.caps.structured:
            return None
        return self._compiler().submit(params.structured_outputs)

    def _compiler(self) -> Grammars:
        with self._lock:
            if self._grammars is None:                 # seconds: xgrammar reads the vocabulary
                self._grammars = Grammars(self.tokenizer, self._token_bytes, vocab=self.vocab_size,
                                          eos_ids=sorted(self.scheduler.eos), timeout_s=self.compile_timeout_s)
        return self._grammars

    def abort(self, request_id: str) -> None:
        """Cancel a request (a no-op if it already finished); its stream ends with "abort".
        n > 1: the request's id aborts every sample, a sample's id (f"{i}_{id}") that one."""
        for rid in self._groups.get(request_id, (request_id,)):
            self._inbox.put(("abort", rid))
        self._wake.set()

    def _prompt_ids(self, prompt) -> tuple[list[int], np.ndarray | None]:
        """The prompt's token ids checked against the vocabulary: (a list, and for a prompt of
        ARRAY_FROM_TOKENS or more the same ids as a read-only [P] int64 numpy array, which the
        prefix cache's keys and the prefill's inputs read without converting ints again; None
        for a shorter one, where numpy's per-call cost exceeds the conversion). C-level passes:
        a 4k-token prompt costs tens of microseconds here, not a Python loop per token."""
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt).input_ids
            what = "the tokenizer gives id {}, outside the model's vocabulary [0, {}) (tokenizer and checkpoint disagree)"
        elif isinstance(prompt, (list, tuple)) and countOf(map(type, prompt), int) == len(prompt):
            ids = list(prompt)                        # ints only (not bool, not floats)
            what = "token id {} outside the vocabulary [0, {})"
        else:
            raise ValueError(f"prompt: expected a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt: empty (at least one token is needed)")
        arr = None
        if len(ids) < ARRAY_FROM_TOKENS:
            ok = 0 <= min(ids) and max(ids) < self.vocab_size
        else:
            try:
                arr = np.array(ids, dtype=np.int64)
                ok = int(arr.view(np.uint64).max()) < self.vocab_size   # a negative id wraps above
            except OverflowError:                     # an id beyond int64
                ok = False
        if not ok:
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise ValueError("prompt: " + what.format(bad, self.vocab_size))
        if arr is not None:
            arr.flags.writeable = False               # shared by a group's samples
        return ids, arr

    # ---- the loop -----------------------------------------------------------------------------
    def step(self) -> bool:
        """One iteration: commands, admissions + prefill, one decode block, finished results.
        Returns whether work remains. Safe from several threads (one step at a time). On an
        unattributable error it fails every request (their streams raise EngineDeadError) and
        re-raises the error itself (a RankError, a CUDA error) to its caller; later calls raise
        EngineDeadError."""
        with self._step_lock:
            self._check_alive()
            try:
                return self._step()
            except BaseException as e:
                self._die(e)
                raise

    def _step(self) -> bool:
        self._drain_inbox()
        sched = self.scheduler
        launched = False
        sched.admit()
        piece = None
        if self.mixed_tokens:                  # a piece rides the block below instead of a prefill
            rows = sched.decode_rows()
            piece = sched.mixed_piece(self.mixed_tokens, rows) if rows else None
        work = [] if piece is not None else sched.prefill_work()
        if work:
            self._ahead = None                 # a split step's forward launched ahead: dropped (constrained.py)
            pacer = sched.pacer   # paced only while rows decode (a chunk the streams wait for)
            pacer = pacer if pacer is not None and sched.decode_rows() else None
            mark = pacer.start() if pacer is not None else None
            for part in self._prefill_launches(work):
                launched = self._prefill_guarded(part) or launched
            if pacer is not None:
                pacer.launched("chunk", mark, tokens=sum(e - a for _, a, e in work))
        rows = sched.decode_rows()
        if work or not rows:
            self._clock.interrupted()
        if rows:
            launched = self._decode(rows, piece) or launched
        depth = 1 if self.overlap and launched else 0
        while len(self._pending) > depth:
            self._finish(self._pending.popleft())
        if not self._requests:                 # idle: read (and drop) a block run after a stop
            while self._pending:
                self._finish(self._pending.popleft())
        return sched.has_work or bool(self._pending) or not self._inbox.empty()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                if item.request_id in self._requests:
                    item.sink(ValueError(f"request_id: {item.request_id!r} is already running"))
                    continue
                self._requests[item.request_id] = item
                self.scheduler.waiting.append(item)
            elif kind == "abort_all":
                self._abort_every_request()
            else:
                req = self._requests.pop(item, None)
                if req is not None:
                    req.sink(self.scheduler.abort(req))

    def _prefill_guarded(self, work: list) -> bool:
        """Prefill `work` ((request, start, end) context positions); if that raises an
        attributable error, prefill each alone (a prefill writes only its own requests' pages)
        and fail the ones that still raise. -> whether a first-token draw was launched."""
        try:
            return self._prefill(work)
        except BaseException as e:
            if not attributable(e):
                raise
            if len(work) == 1:
                self._fail(work[0][0], e)
                return False
        launched = False
        for group in prefill_groups(work):            # n > 1: samples sharing a prefill go together
            group = [w for w in group if w[0].slot >= 0 and w[0].computed < w[2]]
            if not group:
                continue                              # failed meanwhile, or its chunk ran
            try:
                launched = self._prefill(group) or launched
            except BaseException as e:
                if not attributable(e):
                    raise
                for w in group:
                    self._fail(w[0], e)
        return launched

    def _fail(self, req: Request, e: BaseException) -> None:
        """Fail one request: its stream raises `e`; its slot and pages are freed (tokens of a
        block still in flight for it are discarded: finish_reason is set)."""
        log.warning("engine: request %s failed: %s: %s", req.request_id, type(e).__name__, e)
        req.finish_reason = "error"
        self.scheduler.release(req)
        self._requests.pop(req.request_id, None)
        try:
            req.sink(e)
        except Exception:                             # a broken sink must not take the loop down
            log.exception("engine: request %s: its stream refused the error", req.request_id)

    def _dead_error(self) -> EngineDeadError:
        e = self.error
        err = EngineDeadError(f"engine: stopped after an unrecoverable error: {type(e).__name__}: {e}")
        err.__cause__ = e
        return err

    def _check_alive(self) -> None:
        if self.error is not None:
            raise self._dead_error()

    def _die(self, e: BaseException) -> None:
        """An unattributable failure: log it, free every request's pages, fire `dead`, then fail
        every request (so whoever sees the error also sees `dead`, `error`, not `threaded`)."""
        if self.error is not None:
            return
        self.error = e
        log.error("engine: unrecoverable error; failing every request (%d in flight)", len(self._requests),
                  exc_info=(type(e), e, e.__traceback__))
        err = self._dead_error()
        try:
            self._drain_inbox()
        except Exception:
            pass
        reqs = list(self._requests.values())
        for req in reqs:
            req.finish_reason = "error"
            try:
                self.scheduler.release(req)
            except Exception:
                pass
        self._requests.clear()
        self._pending.clear()
        self._ahead = None
        if self._thread is threading.current_thread():
            self._thread = None                       # the loop ends; streams stop waiting on it
        self.dead.set()
        for req in reqs:
            req.sink(err)

    @property
    def time_blocks(self) -> bool:
        """Whether each block's device time is measured (CUDA events around its launch, summed
        per kind in stats()["block_device_s"]; nothing is recorded on CPU). Off by default."""
        return self._time_blocks

    @time_blocks.setter
    def time_blocks(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise ValueError(f"time_blocks: expected True or False, got {on!r}")
        self._time_blocks = on

    def stats(self) -> dict:
        """A snapshot for monitoring, safe to call from any thread (each count is read once; the
        loop may move between reads): requests running / waiting, KV pages used / free, tokens
        streamed so far; with speculation also spec_proposed, spec_accepted, spec_rounds,
        spec_emitted, spec_acceptance_rate, spec_tokens_per_round, spec_blocks, spec_plain_blocks
        (cumulative device counts, engine/speculation.py) and spec_block_wall_s / spec_block_graph_s
        (decode blocks timed launch to launch, prefills excluded, and the same blocks at their
        graphs' measured costs: BlockClock). pages_free counts cached pages no
        request holds (pages_cached: pages in the prefix cache, held or not); prefix_cache_queries
        / prefix_cache_hits: prompt tokens looked up in the prefix cache / found there. With
        max_prefill_stall: prefill_budget_tokens, prefill_us_per_token, decode_block_us (pacing.py).
        With mixed_prefill_tokens: prefill_mixed_chunks / prefill_mixed_tokens, the prompt chunks
        (and their tokens) carried by decode blocks (model/mixed.py). With time_blocks on (CUDA):
        block_device_s, {"prefill", "decode", "spec"} -> seconds the device spent in the blocks
        read back so far (CUDA events around each launch: the runner's own time for the blocks
        the engine ran, at their real contexts)."""
        sched, alloc = self.scheduler, self.scheduler.allocator
        free, cache = alloc.num_free, sched.kv.cache
        out = {"running": sum(r is not None for r in list(sched.slots)), "waiting": len(sched.waiting),
               "pages_used": alloc.num_pages - free, "pages_free": free,
               "tokens_generated": self._tokens_generated,
               "pages_cached": cache.num_cached if cache is not None else 0,
               "prefix_cache_queries": cache.queries if cache is not None else 0,
               "prefix_cache_hits": cache.hits if cache is not None else 0}
        if self.spec is not None:                     # speculation: cumulative device counts
            out.update(spec_stats(self.spec_counts, self._clock))
        if sched.pacer is not None:
            out.update(sched.pacer.stats())
        if self.time_blocks:
            out["block_device_s"] = dict(self.block_device_s)
        if self.mixed_counts is not None:
            out.update(prefill_mixed_chunks=self.mixed_counts["chunks"],
                       prefill_mixed_tokens=self.mixed_counts["tokens"])
        return out

    # ---- background thread --------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop on a background thread (streams then block instead of stepping)."""
        if self._thread is not None:
            raise RuntimeError("engine: already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="graphrt-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the background thread (once its step in progress has finished) and end every
        request still in flight: its stream gets a final delta with finish_reason "abort" and its
        pages go back. A no-op without the thread."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._thread = None
        with self._step_lock:                          # readers may step the engine from now on
            if self.error is None:
                self._drain_inbox()
                self._abort_every_request()
                while self._pending:                   # blocks in flight: their rows are finished
                    self._finish(self._pending.popleft())

    def _abort_every_request(self) -> None:
        """End every admitted request ("abort" delta, pages back); the step lock held."""
        for req in list(self._requests.values()):
            req.sink(self.scheduler.abort(req))
        self._requests.clear()

    def abort_all(self) -> None:
        """Abort every request queued or running, as abort() of each: applied by the next step
        (the engine's thread, or a reader stepping it)."""
        self._inbox.put(("abort_all", None))
        self._wake.set()

    def close(self) -> None:
        """End the engine for good: every request queued or running ends with finish_reason
        "abort" (a reader blocked on its stream returns; pages back), the thread stops, and
        add_request raises RuntimeError from now on. Idempotent; shutdown() instead only stops
        the thread (the engine can be stepped or started again)."""
        self._closed = True
        self.abort_all()
        self.shutdown()
        with self._step_lock:                          # a reader mid-step finishes its step first
            if self.error is None:
                self._drain_inbox()
                self._abort_every_request()
                while self._pending:
                    self._finish(self._pending.popleft())

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.step()
            except BaseException:                     # step() failed every request and logged it
                self._thread = None
                return
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()


def prefill_options(caps, enable_prefix_caching: bool, max_num_batched_tokens: int | None):
    """(prefix-cache seed or None, prefill token budget or None) for an engine over an executor
    of Capabilities `caps`. The seed names what changes a page's K/V (caps.model_key: the model,
    its dtype, the KV format). A
    speculative proposer's K/V in a cached page (a draft model's, an EAGLE-3 head's) is its
    writer's: it changes acceptance only, never a token, so it is not part of the key."""
    if not isinstance(enable_prefix_caching, bool):
        raise ValueError(f"enable_prefix_caching: expected a bool, got {enable_prefix_caching!r}")
    return (caps.model_key if enable_prefix_caching else None), max_num_batched_tokens


__all__ = ["Engine", "EngineDeadError"]
