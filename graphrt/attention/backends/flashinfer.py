"""FlashInfer batch decode (tensor-core or CUDA-core) over the persistent bucket buffers.

planner="device": one host plan() per bucket at capture gives the plan info (offsets, padded
grid, split flag); every step the prepare kernel rewrites the schedule in the int workspace
inside the graph. Before any capture, the device planner is checked byte-for-byte against a
twin wrapper's host plan() on random length sets; any difference (or an unknown FlashInfer
version / plan layout) falls back to host planning for the whole config, with a warning.

planner="host": the engines' pattern (the baseline): indptr/last_page_len built with numpy in
pinned host buffers, plan() on them before every replay; the graph packs the page indices on the
device (as engines do with a Triton kernel) and runs attention.

FP8 KV cache (config.kv_cache_dtype="fp8"): every wrapper (and the parity twin) is planned with
kv_data_type=float8_e4m3fn, q in the model dtype, so the plan info and the device plan checked
against it are FP8's. The per-tensor scales stay on the device (they may be calibrated after
capture): q is multiplied by k_scale before run() (the logits then carry sm_scale * k_scale)
and the output by v_scale after it, inside the graph.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from graphrt.attention import flashinfer_layout as layout
from graphrt.attention.flashinfer_import import flashinfer_version, import_flashinfer
from graphrt.attention.buffers import BucketView
from graphrt.attention.planner import compare_plans, graphrt_plan, plan_fits
from graphrt.attention.backends.base import AttentionBackend
from graphrt.kernels.plan_layout import PlanSpec

INT_WORKSPACE_BYTES = 8 * 1024 * 1024
PARITY_SETS_PER_BUCKET = 5


def host_csr(seq_lens: torch.Tensor, block_table: torch.Tensor, size: int, page_size: int):
    """Host-side paged-KV CSR for a bucket of `size` rows (rows past len(seq_lens) are padding).

    seq_lens [n] int32 CPU, block_table [n, >=pages] int32 CPU -> (indptr [size+1],
    indices [total_pages], last_page_len [size]) int32 CPU tensors.
    """
    n = seq_lens.shape[0]
    lens = torch.zeros(size, dtype=torch.int32)
    lens[:n] = seq_lens
    pages = (lens + page_size - 1) // page_size
    indptr = torch.zeros(size + 1, dtype=torch.int32)
    torch.cumsum(pages, 0, out=indptr[1:])
    cols = torch.arange(block_table.shape[1], dtype=torch.int32)
    indices = block_table[cols[None, :] < pages[:n, None]]
    last = torch.where(pages > 0, lens - (pages - 1) * page_size, 0).to(torch.int32)
    return indptr, indices.to(torch.int32), last


class FlashInferBackend(AttentionBackend):
    capturable = True

    def __init__(self, config, kv_cache, device, *, planner: str = "device",
                 parity_sets: int = PARITY_SETS_PER_BUCKET):
        super().__init__(config, kv_cache, device)
        if device.type != "cuda":
            raise RuntimeError(f"backend {config.backend!r}: FlashInfer runs on CUDA devices only; "
                               f"use backend 'reference' on {device}")
        self._decode = import_flashinfer(f"backend {config.backend!r}", "flashinfer.decode")   # lazy: CUDA only
        self.version = flashinfer_version(f"backend {config.backend!r}")
        self.kind = config.decode_kernel
        self.planner = planner
        self.name = f"flashinfer-{'device' if planner == 'device' else 'host'}plan-{self.kind}"
        self.fallback_reason: str | None = None
        self.float_workspace = torch.zeros(config.workspace_mb << 20, dtype=torch.uint8, device=device)
        self.int_workspace = torch.zeros(INT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrappers: dict[int, object] = {}
        self.specs: dict[int, PlanSpec] = {}
        self.plan_info: dict[int, list[int]] = {}
        self.parity_sets: dict[int, int] = {}
        self.parity_sets_per_bucket = parity_sets
        self._pinned: dict[int, _PinnedCSR] = {}
        self._host_specs: dict[int, PlanSpec] = {}

    # ---- capture-time -----------------------------------------------------------------
    def _wrapper(self, indptr, indices, last_page_len, int_workspace=None):
        w = self._decode.BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace, self.config.kv_layout, use_cuda_graph=True,
            use_tensor_cores=self.kind == layout.TENSOR_CORE,
            paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last_page_len,
            backend="fa2" if self.kind == layout.TENSOR_CORE else "auto")
        if int_workspace is not None:
            w.reset_workspace_buffer(self.float_workspace, int_workspace)
        return w

    def _plan(self, wrapper, indptr, indices, last_page_len) -> None:
        c = self.config
        wrapper.plan(indptr, indices, last_page_len, c.num_qo_heads, c.num_kv_heads, c.head_dim,
                     c.page_size, q_data_type=c.torch_dtype, kv_data_type=c.kv_torch_dtype,
                     non_blocking=True)

    def setup(self, views: list[BucketView]) -> None:
        """Per bucket: wrapper over the view's buffers, one host plan; then the parity gate."""
        for view in views:
            b = view.size
            w = self._wrapper(view.paged_kv_indptr, view.paged_kv_indices,
                              view.paged_kv_last_page_len, self.int_workspace)
            ones = torch.ones(b, dtype=torch.int32)
            self._plan(w, torch.arange(b + 1, dtype=torch.int32), torch.zeros(b, dtype=torch.int32), ones)
            self._wrappers[b] = w
            self.plan_info[b] = [int(x) for x in w._plan_info]
        if self.planner == "device":
            try:
                layout.check_version(self.version)
                for view in views:
                    self._setup_device_plan(view)
            except layout.LayoutMismatch as e:
                self.fallback_reason = str(e)
                warnings.warn(f"graphrt: FlashInfer {self.version}: device planning refused ({e}); "
                              "falling back to host plan() before every replay", RuntimeWarning)
                self.planner = "host"
                self.name = self.name.replace("deviceplan", "hostplan(fallback)")
        for view in views:
            if self.planner == "device":
                self._prepare[view.size] = self._metadata_launch(
                    view, spec=self.specs[view.size], int_workspace=self.int_workspace)
            else:  # host planner: the graph only packs indices (plan() copies indptr/last)
                self._prepare[view.size] = self._metadata_launch(view)
                self._pinned[view.size] = _PinnedCSR(view.size)
                try:  # known layout: plan() overflow is checked per step (host_prepare)
                    self._host_specs[view.size] = layout.parse_plan_info(
                        self.kind, self.plan_info[view.size], view.size, self.config.page_size,
                        self.config.group_size)
                except layout.LayoutMismatch:
                    warnings.warn(f"graphrt: FlashInfer {self.version}: unknown plan layout; host "
                                  "plan() cannot be checked for grid overflow", RuntimeWarning)

    def _setup_device_plan(self, view: BucketView) -> None:
        b, c = view.size, self.config
        spec = layout.parse_plan_info(self.kind, self.plan_info[b], b, c.page_size, c.group_size)
        self.specs[b] = spec
        self.parity_sets[b] = check_parity(self, view, spec, self.parity_sets_per_bucket,
                                           seed=c.seed + b)

    # ---- per step ---------------------------------------------------------------------
    def host_prepare(self, view: BucketView, seq_lens_cpu: torch.Tensor) -> None:
        """Host planner: plan() for these lengths. Raises ValueError, before anything runs, when
        FlashInfer's plan drops tiles of rows [0, n) off the captured grid (CUDA-core kernel with
        empty rows: its output would be wrong; see flashinfer_layout)."""
        if self.planner == "host":
            pin = self._pinned[view.size]
            total = pin.fill(seq_lens_cpu, self.config.page_size)
            wrapper = self._wrappers[view.size]
            self._plan(wrapper, pin.indptr, view.paged_kv_indices[:total], pin.last)
            spec = self._host_specs.get(view.size)
            if spec is not None:
                lost = layout.host_plan_overflow(spec, wrapper._pin_memory_int_workspace_buffer,
                                                 seq_lens_cpu.shape[0])
                if lost:
                    raise ValueError(
                        f"seq_lens: FlashInfer {self.version}'s {self.kind} plan() for these lengths "
                        f"puts {lost} work tiles past the captured grid of {spec.padded_batch_size} "
                        f"(empty rows before long ones): its output would be wrong. Use graphrt's "
                        f"device planner or the tensor-core kernel")

    @property
    def needs_host_inputs(self) -> bool:  # type: ignore[override]
        return self.planner == "host"

    def attend(self, view: BucketView, q, kv, out) -> None:
        if kv.fp8:   # device scales: q * k_scale (model dtype), out * v_scale
            k_scale, v_scale = kv.kv_scales()
            self._wrappers[view.size].run(q * k_scale, kv.as_tuple(), out=out)
            out.mul_(v_scale)
            return
        self._wrappers[view.size].run(q, kv.as_tuple(), out=out)

    def describe(self, size: int) -> dict:
        d = {"backend": self.name, "planner": self.planner, "flashinfer": self.version,
             "plan_info": self.plan_info.get(size)}
        if size in self.parity_sets:
            d["parity_sets"] = self.parity_sets[size]
        if self.fallback_reason:
            d["fallback_reason"] = self.fallback_reason
        return d


class _PinnedCSR:
    """Pinned host indptr [B+1] / last_page_len [B] (int32) for host planning, filled with numpy."""

    def __init__(self, size: int):
        self.indptr = torch.zeros(size + 1, dtype=torch.int32).pin_memory()
        self.last = torch.zeros(size, dtype=torch.int32).pin_memory()
        self.lens = np.zeros(size, dtype=np.int32)
        self._indptr_np, self._last_np = self.indptr.numpy(), self.last.numpy()

    def fill(self, seq_lens_cpu: torch.Tensor, page_size: int) -> int:
        """Host CSR for these lengths (rows past them are padding); returns the total pages."""
        n = seq_lens_cpu.shape[0]
        self.lens[:n] = seq_lens_cpu.numpy()
        self.lens[n:] = 0
        pages = (self.lens + page_size - 1) // page_size
        np.cumsum(pages, out=self._indptr_np[1:])
        np.copyto(self._last_np, np.where(pages > 0, self.lens - (pages - 1) * page_size, 0))
        return int(self._indptr_np[-1])


def check_parity(backend: FlashInferBackend, view: BucketView, spec: PlanSpec,
                 n_sets: int, *, seed: int) -> int:
    """Device planner vs FlashInfer's own plan() on `n_sets` random length sets for one bucket.

    A twin wrapper (own buffers and workspace) plans on the host; the prepare kernel plans on the
    device from the same inputs. Where FlashInfer's plan fits the grid the two must be
    byte-identical; where it overflows (CUDA-core, empty rows) the device plan must equal
    `planner.graphrt_plan` and fit. Raises LayoutMismatch on any differing plan-info field or
    plan byte. Leaves the view's inputs as empty requests. Returns the number of sets compared.
    """
    c, b, dev = backend.config, view.size, view.block_table.device
    twin_buffers = (torch.zeros(b + 1, dtype=torch.int32, device=dev),
                    torch.zeros(view.paged_kv_indices.numel(), dtype=torch.int32, device=dev),
                    torch.zeros(b, dtype=torch.int32, device=dev))
    twin = backend._wrapper(*twin_buffers)
    scratch_ws = torch.zeros_like(backend.int_workspace)
    launch = backend._metadata_launch(view, spec=spec, int_workspace=scratch_ws)
    gen = torch.Generator().manual_seed(seed)
    for i in range(n_sets):
        lens = random_lengths(b, c.max_context_len, gen, kind=i)
        table = torch.randint(0, backend.kv_cache.num_pages, (b, c.max_pages_per_seq),
                              generator=gen, dtype=torch.int32)
        view.block_table.copy_(table)
        view.seq_lens.copy_(lens)
        launch()
        backend._plan(twin, *host_csr(lens, table, b, c.page_size))
        twin_info = [int(x) for x in twin._plan_info]
        if twin_info != backend.plan_info[b]:
            raise layout.LayoutMismatch(f"bucket {b}: plan info changed with the lengths "
                                        f"({backend.plan_info[b]} -> {twin_info})")
        theirs = layout.read_plan(spec, twin._int_workspace_buffer)
        if plan_fits(spec, theirs):
            want, source = theirs, "plan()"
        else:  # FlashInfer's own plan drops tiles: graphrt's deliberate deviation applies
            want, source = graphrt_plan(spec, lens.tolist()), "graphrt_plan"
        diff = compare_plans(layout.read_plan(spec, scratch_ws), want)
        if diff:
            raise layout.LayoutMismatch(f"bucket {b}: device plan differs from {source} in {diff}")
    view.seq_lens.zero_()
    return n_sets


def random_lengths(b: int, max_len: int, gen: torch.Generator, *, kind: int = 0) -> torch.Tensor:
    """Length sets that exercise the planner: 0 ragged, 1 all-max, 2 one long + short, 3 padded,
    4 empty rows first then long ones (FlashInfer's CUDA-core plan overflows there)."""
    lens = torch.randint(1, max_len + 1, (b,), generator=gen, dtype=torch.int32)
    k = kind % 5
    if k == 1:
        lens.fill_(max_len)
    elif k == 2:
        lens = torch.randint(1, 17, (b,), generator=gen, dtype=torch.int32)
        lens[0] = max_len
    elif k == 3 and b > 1:
        lens[b // 2 + 1:] = 0  # padding tail
    elif k == 4 and b > 1:
        lens[: b - 1 - b // 4] = 0  # idle slots before long requests
        lens[b - 1 - b // 4:] = max_len
    return lens
