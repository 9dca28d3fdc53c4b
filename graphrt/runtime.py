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

from .backends import make_backend
from .buckets import pick_bucket
from .buffers import BucketView, StaticBuffers
from .config import RuntimeConfig
from .graphs import GraphManager
from .kernels import ERR_GRID, ERR_PAGE_ID, ERR_SEQ_LEN
from .kvcache import PagedKVCache


class DeviceInputError(RuntimeError):
    """The prepare kernel found bad inputs on the device (rows were neutralised, not read OOB)."""


def _device(device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


class DecodeRuntime:
    def __init__(self, config: RuntimeConfig, kv_cache: PagedKVCache, device="cuda", *,
                 backend: str | None = None):
        if not isinstance(config, RuntimeConfig):
            raise TypeError(f"config: expected RuntimeConfig, got {type(config).__name__}")
        self.config = config
        self.device = _device(device)
        kv_cache.check(config, self.device)
        self.kv_cache = kv_cache
        self.buffers = StaticBuffers(config, self.device)
        self.backend = make_backend(config, kv_cache, self.device, name=backend)
        self.graphs: GraphManager | None = None
        self._set_up = False

    # ---- capture ------------------------------------------------------------------------
    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and self.backend.capturable

    def _views_largest_first(self) -> list[BucketView]:
        return [self.buffers.view(b) for b in reversed(self.config.buckets)]

    def setup(self) -> None:
        """Per-bucket backend state (idempotent); capture() calls it."""
        if not self._set_up:
            self.backend.setup(self._views_largest_first())
            self._set_up = True

    def capture(self, *, progress: bool = False) -> dict:
        """Capture every bucket (largest first, one pool). Returns per-bucket CaptureStats."""
        self.setup()
        if not self.uses_graphs:
            return {}
        self.graphs = self.graphs or GraphManager(self.device)
        views = [v for v in self._views_largest_first() if v.size not in self.graphs]
        for view in _progress(views, progress, f"capturing {self.backend.name}"):
            view.block_table.zero_()        # warm-up/capture inputs: 1-token requests on page 0
            view.seq_lens.fill_(1)
            if self.backend.needs_host_inputs:  # host planner: the workspace must hold this plan
                self.backend.host_prepare(view, view.seq_lens.cpu())
            self.graphs.capture(view.size, lambda v=view: self._step(v))
            view.seq_lens.zero_()
        return dict(self.graphs.stats)

    def _step(self, view: BucketView) -> None:
        self.backend.prepare(view)
        self.backend.run(view)

    # ---- per step -------------------------------------------------------------------------
    def static_inputs(self, n: int) -> BucketView:
        """The static buffers of the bucket that serves a batch of n (zero-copy path)."""
        return self.buffers.view(pick_bucket(self.config.buckets, n))

    def replay(self, view: BucketView) -> torch.Tensor:
        """One step over the whole bucket as it stands in its static buffers; returns view.output."""
        self.setup()
        if self.graphs is not None and view.size in self.graphs:
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
        n = self._check_inputs(q, block_table, seq_lens)
        view = self.buffers.view(pick_bucket(self.config.buckets, n))
        view.load_inputs(q, block_table.to(self.device, non_blocking=True),
                         seq_lens.to(self.device, non_blocking=True))
        if block_table.shape[1] < self.config.max_pages_per_seq:
            view.block_table[:n, block_table.shape[1]:].fill_(-1)  # stale columns: invalid ids
        if self.backend.needs_host_inputs:
            self.backend.host_prepare(view, seq_lens.cpu())  # a sync if seq_lens is on the GPU
        return self.replay(view)[:n]

    def _check_inputs(self, q, block_table, seq_lens) -> int:
        c = self.config
        for name, t in (("q", q), ("block_table", block_table), ("seq_lens", seq_lens)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if q.dim() != 3 or tuple(q.shape[1:]) != (c.num_qo_heads, c.head_dim):
            raise ValueError(f"q: shape {tuple(q.shape)}, expected [n, {c.num_qo_heads}, {c.head_dim}]")
        if q.dtype != c.torch_dtype:
            raise ValueError(f"q: dtype {q.dtype}, config dtype is {c.torch_dtype}")
        if q.device != self.device:
            raise ValueError(f"q: on {q.device}, runtime device is {self.device}")
        n = q.shape[0]
        # raises BatchTooLargeError naming the largest bucket, ValueError for an empty batch
        pick_bucket(c.buckets, n)
        for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
            if t.dtype != torch.int32:
                raise ValueError(f"{name}: dtype {t.dtype}, expected torch.int32")
            if t.device not in (self.device, torch.device("cpu")):
                raise ValueError(f"{name}: on {t.device}, expected {self.device} or cpu")
        if block_table.dim() != 2 or block_table.shape[0] != n or not 1 <= block_table.shape[1] <= c.max_pages_per_seq:
            raise ValueError(f"block_table: shape {tuple(block_table.shape)}, expected [{n}, w] with "
                             f"1 <= w <= max_pages_per_seq={c.max_pages_per_seq}")
        if tuple(seq_lens.shape) != (n,):
            raise ValueError(f"seq_lens: shape {tuple(seq_lens.shape)}, expected [{n}]")
        if seq_lens.device.type == "cpu":
            self._check_host_values(block_table, seq_lens)
        return n

    def _check_host_values(self, block_table, seq_lens) -> None:
        c = self.config
        lo, hi = int(seq_lens.min()), int(seq_lens.max())
        if lo < 0 or hi > c.max_context_len:
            raise ValueError(f"seq_lens: values in [{lo}, {hi}], allowed [0, max_context_len="
                             f"{c.max_context_len}]")
        need = -(-hi // c.page_size)
        if need > block_table.shape[1]:
            raise ValueError(f"block_table: {block_table.shape[1]} columns, seq_lens needs {need} pages")
        if block_table.device.type == "cpu" and need:
            used = block_table[:, :need]
            pages = (seq_lens + c.page_size - 1) // c.page_size
            live = used[torch.arange(need)[None, :] < pages[:, None]]
            if live.numel() and (int(live.min()) < 0 or int(live.max()) >= self.kv_cache.num_pages):
                raise ValueError(f"block_table: page ids in [{int(live.min())}, {int(live.max())}], "
                                 f"KV pool has {self.kv_cache.num_pages} pages")

    def check_device_errors(self) -> None:
        """Synchronise, read and clear the prepare kernel's sticky flags; raise if any was set."""
        flags = int(self.buffers.device_error.item())
        if not flags:
            return
        self.buffers.device_error.zero_()
        why = []
        if flags & ERR_SEQ_LEN:
            why.append(f"seq_lens outside [0, max_context_len={self.config.max_context_len}] (rows set empty)")
        if flags & ERR_PAGE_ID:
            why.append(f"block_table page ids outside [0, {self.kv_cache.num_pages}) (set to page 0)")
        if flags & ERR_GRID:
            why.append("a request's KV tiles did not fit the captured grid")
        raise DeviceInputError("device input guard: " + "; ".join(why))

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
                         **self.backend.describe(b)})
        return rows


def _progress(items, enabled: bool, desc: str):
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; stay usable without it
        return items
    return tqdm(items, desc=desc, unit="bucket")

