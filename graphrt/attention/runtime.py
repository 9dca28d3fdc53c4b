"""DecodeRuntime: the Python API. Pick a bucket, copy inputs in, replay (or run eagerly), hand back.

    rt = DecodeRuntime(config, kv_cache, device="cuda")
    rt.capture()                                   # every bucket, largest first
    out = rt.decode(q, block_table, seq_lens)      # [n, Hq, D] view, valid until the next step
    rt.decode(q, block_table, seq_lens, out=mine)  # or copied into the caller's buffer (threads)

Zero-copy serving loop (no input copies by the runtime: the host work is one replay):

    view = rt.static_inputs(n)                     # the bucket's static buffers
    ... write view.query[:n], view.block_table[:n], view.seq_lens[:n]; view.seq_lens[n:] = 0 ...
    out = rt.replay(view)[:n]

On a CPU device (or with the eager-only reference backend) the same path runs eagerly.

Threads: decode() and replay() hold `rt.lock` (a reentrant lock) for the whole step (input copy,
replay, output copy into `out=`), so concurrent calls serialise instead of mixing their inputs.
The returned view is the bucket's static output, rewritten by the next step from any thread:
threads sharing a runtime pass `out=` (copied under the lock) or hold `rt.lock` themselves while
they read the view; the zero-copy path must hold `rt.lock` from writing the static inputs to
reading the output. All calls must use one CUDA stream (the graph's replays are ordered on it).
"""
from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Callable, ContextManager

import torch

from graphrt.attention.backends import AttentionBackend, make_backend
from graphrt.attention.buckets import pick_bucket
from graphrt.attention.buffers import BucketView, StaticBuffers
from graphrt.config import RuntimeConfig
from graphrt.attention.graphs import GraphKey, GraphRunner
from graphrt.attention.inputs import check_exclusive_writes, check_inputs
from graphrt.kernels.flags import ERR_GRID, ERR_KV_SLOT, ERR_PAGE_ID, ERR_POSITION, ERR_SEQ_LEN, ERR_STALL
from graphrt.attention.kvcache import PagedKVCache


class DeviceInputError(RuntimeError):
    """The prepare kernel found bad inputs on the device (rows were neutralised, not read OOB)."""


def runtime_device(device) -> torch.device:
    """torch.device(device), with a bare "cuda" pinned to the current CUDA device's index."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


class DecodeRuntime:
    """Decode attention over per-bucket static buffers, replayed as CUDA graphs where possible.

    backend: one backend name for every bucket (default config.backend); bucket_backends: a
    name per bucket instead (graphrt-capture's `auto` choice). lazy=True captures a bucket on its
    first use (verified against the reference first) instead of in capture(). parity_sets:
    random length sets per bucket on which the device planner is checked against FlashInfer's
    plan() before the first capture (default 4). check_forks=True: refuse (ValueError) host-known
    batches in which a row's newest page (holding slot seq_len - 1, which the caller wrote this
    step) is used by another row; off by default since this runtime only reads the cache.
    """

    def __init__(self, config: RuntimeConfig, kv_cache: PagedKVCache, device="cuda", *,
                 backend: str | None = None, bucket_backends: dict[int, str] | None = None,
                 lazy: bool = False, parity_sets: int | None = None, check_forks: bool = False):
        if not isinstance(config, RuntimeConfig):
            raise TypeError(f"config: expected RuntimeConfig, got {type(config).__name__}")
        for name, flag in (("lazy", lazy), ("check_forks", check_forks)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {flag!r}")
        if parity_sets is not None and (isinstance(parity_sets, bool) or not isinstance(parity_sets, int)
                                        or parity_sets < 1):
            raise ValueError(f"parity_sets: must be an int >= 1 (the device planner is never used "
                             f"unchecked), got {parity_sets!r}")
        self.config = config
        self.device = runtime_device(device)
        kv_cache.check(config, self.device)
        self.kv_cache = kv_cache
        self.buffers = StaticBuffers(config, self.device)
        names = _bucket_backend_names(config, backend, bucket_backends)
        self.backends = {name: make_backend(config, kv_cache, self.device, name=name,
                                            parity_sets=parity_sets)
                         for name in sorted(set(names.values()))}
        self._backend_of = {b: self.backends[names[b]] for b in config.buckets}
        self.lazy = lazy
        self.check_forks = check_forks
        self.lock = threading.RLock()  # held for a whole step: see the module docstring
        self.startup_s: dict[str, float] = {}
        # entered around each lazy capture; from_cache points the compilers at the cache there
        self.compile_scope: Callable[[], ContextManager] = nullcontext
        self.graphs = GraphRunner(self.device)   # attention-only graphs, keyed GraphKey("attention", b)
        self._set_up = False

    @classmethod
    def from_cache(cls, cache_dir, *, kv_cache: PagedKVCache, device="cuda", lazy: bool = False,
                   progress: bool = False, expect_digest: str | None = None,
                   config: RuntimeConfig | None = None,
                   trust_unsafe_permissions: bool = False) -> "DecodeRuntime":
        """Open a graph cache built by graphrt-capture: no compilation, then capture (or lazy).

        expect_digest: the manifest's sha256 (graphrt-capture prints it) and config: the
        RuntimeConfig the cache must hold; both pin the cache against edits (README "Graph cache
        trust model"). trust_unsafe_permissions: accept a cache other users can write (or that
        another user owns). Raises CacheMismatchError naming each file and what differs."""
        from graphrt.cache.load import open_cache
        return open_cache(cls, cache_dir, kv_cache=kv_cache, device=device, lazy=lazy,
                          progress=progress, expect_digest=expect_digest, config=config,
                          trust_unsafe_permissions=trust_unsafe_permissions)

    # ---- capture ------------------------------------------------------------------------
    @property
    def backend(self) -> AttentionBackend:
        """The backend of the largest bucket (the only one unless bucket_backends was given)."""
        return self._backend_of[self.config.max_batch]

    def backend_for(self, bucket: int) -> AttentionBackend:
        return self._backend_of[bucket]

    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and any(b.capturable for b in self.backends.values())

    def _captures(self, bucket: int) -> bool:
        return self.device.type == "cuda" and self._backend_of[bucket].capturable

    def _views_largest_first(self) -> list[BucketView]:
        return [self.buffers.view(b) for b in reversed(self.config.buckets)]

    def setup(self) -> None:
        """Per-bucket backend state (idempotent); capture() calls it."""
        if not self._set_up:
            views = self._views_largest_first()
            for backend in self.backends.values():
                backend.setup([v for v in views if self._backend_of[v.size] is backend])
            self._set_up = True

    def capture(self, *, progress: bool = False) -> dict:
        """Capture every bucket (largest first, one pool); with lazy=True only set up.

        Idempotent: buckets already captured are skipped. Returns per-bucket CaptureStats of the
        buckets captured so far."""
        with self.lock:
            self.setup()
            if not self.uses_graphs:
                return {}
            if not self.lazy:
                todo = [v for v in self._views_largest_first()
                        if self._captures(v.size) and _key(v.size) not in self.graphs]
                for view in _progress(todo, progress, "capturing"):
                    self._capture_bucket(view)
            return self.graphs.stats_by_bucket("attention")

    def captured(self, bucket: int) -> bool:
        """Whether `bucket` replays a captured graph."""
        return _key(bucket) in self.graphs

    def _host_plan(self, view: BucketView, seq_lens_cpu: torch.Tensor | None = None):
        """prepare hook for the graph runner: a host-planned backend plans from the lengths."""
        backend = self._backend_of[view.size]
        if not backend.needs_host_inputs:
            return None
        return lambda: backend.host_prepare(
            view, view.seq_lens.cpu() if seq_lens_cpu is None else seq_lens_cpu)

    def _capture_bucket(self, view: BucketView) -> None:
        # warm-up/capture inputs: 1-token requests on page 0 (attention only reads the cache)
        self.graphs.capture(_key(view.size), lambda: self._step(view),
                            inputs=[(view.block_table, 0), (view.seq_lens, 1)],
                            prepare=self._host_plan(view))

    def _capture_lazily(self, view: BucketView) -> None:
        """First use of a bucket under lazy=True: capture, verify the replay against the
        reference, and restore the user's static inputs whatever happens. A graph that failed
        (capture or verification raised, or the error is over tolerance) is dropped, so the next
        use of the bucket captures and verifies again instead of replaying it."""
        from graphrt.attention.verify import TOLERANCE, verify_bucket
        inputs = (view.query, view.block_table, view.seq_lens)
        saved = [t.clone() for t in inputs]
        try:
            self._capture_bucket(view)
            err = verify_bucket(self, view.size, seed=self.config.seed + view.size)
            if not err <= TOLERANCE[self.config.dtype]:
                raise RuntimeError(f"bucket {view.size}: lazily captured graph failed "
                                   f"verification (rel err {err:.2e}); graph dropped")
        except BaseException:
            self.graphs.drop(_key(view.size))
            raise
        finally:
            for dst, src in zip(inputs, saved):
                dst.copy_(src)

    def _step(self, view: BucketView) -> None:
        backend = self._backend_of[view.size]
        backend.prepare(view)
        backend.run(view)

    # ---- per step -------------------------------------------------------------------------
    def static_inputs(self, n: int) -> BucketView:
        """The static buffers of the bucket that serves a batch of n (zero-copy path)."""
        return self.buffers.view(pick_bucket(self.config.buckets, n))

    def replay(self, view: BucketView, *, seq_lens_cpu: torch.Tensor | None = None) -> torch.Tensor:
        """One step over the whole bucket as it stands in its static buffers; returns view.output.

        A host-planned backend (planner 'host', or a device-planner fallback) plans here first,
        from seq_lens_cpu if given, else from a copy of view.seq_lens (a device sync). Holds
        rt.lock for the step; threads must hold it across their input writes too."""
        with self.lock:
            return self._replay(view, seq_lens_cpu)

    def _replay(self, view: BucketView, seq_lens_cpu: torch.Tensor | None) -> torch.Tensor:
        key = _key(view.size)
        if key not in self.graphs:
            self.setup()
            if self.lazy and self._captures(view.size):
                with self.compile_scope():
                    self._capture_lazily(view)  # restores the inputs it found
        self.graphs.run(key, lambda: self._step(view), prepare=self._host_plan(view, seq_lens_cpu))
        return view.output

    def decode(self, q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention for n decode requests. Validates everything before writing anything.

        q [n, Hq, D] (config dtype, runtime device); block_table [n, <=max_pages] int32 and
        seq_lens [n] int32, on the runtime device or the CPU (CPU values are checked on the host;
        device values by the prepare kernel, see check_device_errors). Returns a [n, Hq, D] view
        of the static output, valid until the next step; with out= ([n, Hq, D], q's dtype and
        device) the rows are copied into out under rt.lock and out is returned (thread-safe).

        Forked requests: rows may share read-only prefix pages, but the page holding a row's
        slot seq_len - 1 (its newest token, written by the caller) must be the row's own. The
        caller keeps that copy-on-write contract; with check_forks=True and a CPU block_table
        and seq_lens, decode refuses a batch that breaks it (ValueError naming rows and page).
        """
        n = check_inputs(self.config, self.device, self.kv_cache.num_pages, q, block_table, seq_lens)
        if out is not None and (not isinstance(out, torch.Tensor) or out.shape != q.shape
                                or out.dtype != q.dtype or out.device != q.device):
            raise ValueError(f"out: expected a [{n}, {q.shape[1]}, {q.shape[2]}] {q.dtype} tensor "
                             f"on {q.device}, got {_describe(out)}")
        if self.check_forks and block_table.device.type == "cpu" and seq_lens.device.type == "cpu":
            check_exclusive_writes(self.config, block_table, (seq_lens - 1).clamp_min(0), seq_lens)
        view = self.buffers.view(pick_bucket(self.config.buckets, n))
        with self.lock:
            view.load_inputs(q, block_table.to(self.device, non_blocking=True),
                             seq_lens.to(self.device, non_blocking=True))
            if block_table.shape[1] < self.config.max_pages_per_seq:
                view.block_table[:n, block_table.shape[1]:].fill_(-1)  # stale columns: invalid ids
            host_lens = seq_lens.cpu() if self._backend_of[view.size].needs_host_inputs else None
            rows = self._replay(view, host_lens)[:n]  # .cpu(): a sync for GPU seq_lens
            return rows if out is None else out.copy_(rows)

    def check_device_errors(self) -> None:
        """Synchronise, read and clear the prepare kernel's sticky flags; raise if any was set."""
        raise_device_errors(self.buffers.device_error, self.config, self.kv_cache.num_pages)

    # ---- reports ----------------------------------------------------------------------------
    def report(self) -> list[dict]:
        """Per bucket: buffer bytes, capture ms, graph bytes, backend description."""
        rows = []
        per_bucket = self.buffers.bytes_per_bucket()
        for b in self.config.buckets:
            s = self.graphs.stats.get(_key(b))
            rows.append({"bucket": b, "buffer_bytes": per_bucket[b],
                         "capture_ms": s.capture_ms if s else None,
                         "graph_bytes": s.graph_bytes if s else None,
                         **self._backend_of[b].describe(b)})
        return rows


def _key(bucket: int) -> GraphKey:
    return GraphKey("attention", bucket)


def raise_device_errors(device_error: torch.Tensor, config: RuntimeConfig, num_pages: int) -> None:
    """Read (one sync) and clear the sticky device-guard flags; raise DeviceInputError if set."""
    flags = int(device_error.item())
    if not flags:
        return
    device_error.zero_()
    why = []
    if flags & ERR_SEQ_LEN:
        why.append(f"seq_lens outside [0, max_context_len={config.max_context_len}] (rows set empty)")
    if flags & ERR_PAGE_ID:
        why.append(f"block_table page ids outside [0, {num_pages}), or a table narrower than the "
                   f"lengths need (read as page 0, K/V not written)")
    if flags & ERR_GRID:
        why.append("a request's KV tiles did not fit the captured grid")
    if flags & ERR_KV_SLOT:
        why.append("block_table: a new token's K/V slot fell past the block table's width "
                   "(it must hold pages for every decoded token; K/V not written)")
    if flags & ERR_POSITION:
        why.append("a token position fell outside the model's RoPE cos/sin table (K/V not written)")
    if flags & ERR_STALL:
        why.append("a persistent decode step's wait hit its watchdog bound (its tokens are garbage)")
    raise DeviceInputError("device input guard: " + "; ".join(why))


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{list(t.shape)} {t.dtype} on {t.device}"
    return type(t).__name__


def _bucket_backend_names(config, backend, bucket_backends) -> dict[int, str]:
    if bucket_backends is None:
        return {b: backend or config.backend for b in config.buckets}
    if backend is not None:
        raise ValueError("backend / bucket_backends: give one of the two")
    if set(bucket_backends) != set(config.buckets):
        raise ValueError(f"bucket_backends: keys {sorted(bucket_backends)} must be the config's "
                         f"buckets {list(config.buckets)}")
    return dict(bucket_backends)


def _progress(items, enabled: bool, desc: str):
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; stay usable without it
        return items
    return tqdm(items, desc=desc, unit="bucket")

