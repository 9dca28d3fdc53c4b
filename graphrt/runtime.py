"""DecodeRuntime: the Python API. Pick a bucket, copy inputs in, replay (or run eagerly), hand back.

    rt = DecodeRuntime(config, kv_cache, device="cuda")
    rt.capture()                                   # every bucket, largest first
    out = rt.decode(q, block_table, seq_lens)      # [n, Hq, D] view, valid until the next step

Zero-copy serving loop (no input copies by the runtime: the host work is one replay):

    view = rt.static_inputs(n)                     # the bucket's static buffers
    ... write view.query[:n], view.block_table[:n], view.seq_lens[:n]; view.seq_lens[n:] = 0 ...
    out = rt.replay(view)[:n]

On a CPU device (or with the eager-only reference backend) the same path runs eagerly.
"""
from __future__ import annotations

import torch

from .backends import AttentionBackend, make_backend
from .buckets import pick_bucket
from .buffers import BucketView, StaticBuffers
from .config import RuntimeConfig
from .graphs import GraphManager
from .inputs import check_inputs
from .kernels import ERR_GRID, ERR_PAGE_ID, ERR_SEQ_LEN
from .kernels.append_kv import ERR_KV_SLOT
from .kernels.rope_append import ERR_POSITION
from .kvcache import PagedKVCache


class DeviceInputError(RuntimeError):
    """The prepare kernel found bad inputs on the device (rows were neutralised, not read OOB)."""


def _device(device) -> torch.device:
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
    plan() before the first capture (default 4).
    """

    def __init__(self, config: RuntimeConfig, kv_cache: PagedKVCache, device="cuda", *,
                 backend: str | None = None, bucket_backends: dict[int, str] | None = None,
                 lazy: bool = False, parity_sets: int | None = None):
        if not isinstance(config, RuntimeConfig):
            raise TypeError(f"config: expected RuntimeConfig, got {type(config).__name__}")
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy: expected a bool, got {lazy!r}")
        if parity_sets is not None and (isinstance(parity_sets, bool) or not isinstance(parity_sets, int)
                                        or parity_sets < 1):
            raise ValueError(f"parity_sets: must be an int >= 1 (the device planner is never used "
                             f"unchecked), got {parity_sets!r}")
        self.config = config
        self.device = _device(device)
        kv_cache.check(config, self.device)
        self.kv_cache = kv_cache
        self.buffers = StaticBuffers(config, self.device)
        names = _bucket_backend_names(config, backend, bucket_backends)
        self.backends = {name: make_backend(config, kv_cache, self.device, name=name,
                                            parity_sets=parity_sets)
                         for name in sorted(set(names.values()))}
        self._backend_of = {b: self.backends[names[b]] for b in config.buckets}
        self.lazy = lazy
        self.startup_s: dict[str, float] = {}
        self.graphs: GraphManager | None = None
        self._set_up = False

    @classmethod
    def from_cache(cls, cache_dir, *, kv_cache: PagedKVCache, device="cuda", lazy: bool = False,
                   progress: bool = False) -> "DecodeRuntime":
        """Open a graph cache built by graphrt-capture: no compilation, then capture (or lazy)."""
        from .cache import open_cache
        return open_cache(cls, cache_dir, kv_cache=kv_cache, device=device, lazy=lazy,
                          progress=progress)

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

        Returns per-bucket CaptureStats of the buckets captured so far."""
        self.setup()
        if not self.uses_graphs:
            return {}
        self.graphs = self.graphs or GraphManager(self.device)
        if not self.lazy:
            todo = [v for v in self._views_largest_first()
                    if self._captures(v.size) and v.size not in self.graphs]
            for view in _progress(todo, progress, "capturing"):
                self._capture_bucket(view)
        return dict(self.graphs.stats)

    def _capture_bucket(self, view: BucketView) -> None:
        backend = self._backend_of[view.size]
        view.block_table.zero_()        # warm-up/capture inputs: 1-token requests on page 0
        view.seq_lens.fill_(1)
        if backend.needs_host_inputs:   # host planner: the workspace must hold this plan
            backend.host_prepare(view, view.seq_lens.cpu())
        self.graphs.capture(view.size, lambda: self._step(view))
        view.seq_lens.zero_()

    def _capture_lazily(self, view: BucketView) -> None:
        """First use of a bucket under lazy=True: verify eagerly, capture, keep the user's inputs."""
        from .verify import TOLERANCE, verify_bucket
        saved = [t.clone() for t in (view.query, view.block_table, view.seq_lens)]
        self._capture_bucket(view)
        err = verify_bucket(self, view.size, seed=self.config.seed + view.size)
        for dst, src in zip((view.query, view.block_table, view.seq_lens), saved):
            dst.copy_(src)
        if not err <= TOLERANCE[self.config.dtype]:
            raise RuntimeError(f"bucket {view.size}: lazily captured graph failed verification "
                               f"(rel err {err:.2e})")

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
        from seq_lens_cpu if given, else from a copy of view.seq_lens (a device sync)."""
        graphed = self.graphs is not None and view.size in self.graphs
        if not graphed:
            self.setup()
            if self.lazy and self._captures(view.size):
                self.graphs = self.graphs or GraphManager(self.device)
                self._capture_lazily(view)  # restores the inputs it found
                graphed = True
        backend = self._backend_of[view.size]
        if backend.needs_host_inputs:
            backend.host_prepare(view, view.seq_lens.cpu() if seq_lens_cpu is None else seq_lens_cpu)
        if graphed:
            self.graphs.replay(view.size)
        else:
            self._step(view)
        return view.output

    def decode(self, q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Attention for n decode requests. Validates everything before writing anything.

        q [n, Hq, D] (config dtype, runtime device); block_table [n, <=max_pages] int32 and
        seq_lens [n] int32, on the runtime device or the CPU (CPU values are checked on the host;
        device values by the prepare kernel, see check_device_errors). Returns a [n, Hq, D] view.
        """
        n = check_inputs(self.config, self.device, self.kv_cache.num_pages, q, block_table, seq_lens)
        view = self.buffers.view(pick_bucket(self.config.buckets, n))
        view.load_inputs(q, block_table.to(self.device, non_blocking=True),
                         seq_lens.to(self.device, non_blocking=True))
        if block_table.shape[1] < self.config.max_pages_per_seq:
            view.block_table[:n, block_table.shape[1]:].fill_(-1)  # stale columns: invalid ids
        host_lens = seq_lens.cpu() if self._backend_of[view.size].needs_host_inputs else None
        return self.replay(view, seq_lens_cpu=host_lens)[:n]  # .cpu(): a sync for GPU seq_lens

    def check_device_errors(self) -> None:
        """Synchronise, read and clear the prepare kernel's sticky flags; raise if any was set."""
        raise_device_errors(self.buffers.device_error, self.config, self.kv_cache.num_pages)

    # ---- reports ----------------------------------------------------------------------------
    def report(self) -> list[dict]:
        """Per bucket: buffer bytes, capture ms, graph bytes, backend description."""
        rows = []
        per_bucket = self.buffers.bytes_per_bucket()
        for b in self.config.buckets:
            s = self.graphs.stats.get(b) if self.graphs else None
            rows.append({"bucket": b, "buffer_bytes": per_bucket[b],
                         "capture_ms": s.capture_ms if s else None,
                         "graph_bytes": s.graph_bytes if s else None,
                         **self._backend_of[b].describe(b)})
        return rows


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
    raise DeviceInputError("device input guard: " + "; ".join(why))


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

