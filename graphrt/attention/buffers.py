"""Persistent device buffers: allocated once at the largest bucket, viewed per bucket.

Buckets replay one at a time on one stream, so every bucket's view can share the memory of
the largest: a bucket of B rows sees the first B rows of each buffer (contiguous views, so
the addresses baked into a captured graph stay valid for the runtime's life).

Copy directions are explicit: `BucketView.load_inputs` copies a batch into the static
inputs and resets the padded tail; `BucketView.output_rows` is the view handed back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.config import RuntimeConfig

PAD_SEQ_LEN = 0  # padding rows: no pages, an empty request for every backend
INT = torch.int32


@dataclass(frozen=True)
class BucketView:
    """The static buffers of one bucket of `size` rows (all on the runtime device).

    block_table            [B, max_pages]   int32  page ids per request (input)
    block_table_checked    [B, max_pages]   int32  its used columns with bad ids -> page 0 (xqa)
    seq_lens               [B]              int32  KV tokens per request, 0 = padding (input)
    query                  [B, Hq, D]       dtype  (input)
    output                 [B, Hq, D]       dtype  (written by attention)
    paged_kv_indptr        [B + 1]          int32  exclusive prefix sum of pages (FlashInfer CSR)
    paged_kv_indices       [B * max_pages]  int32  block-table rows packed by indptr
    paged_kv_last_page_len [B]              int32  tokens in each request's last page (0 if empty)
    device_error           [1]              int32  sticky input-guard flags set by the prepare kernel
    """

    size: int
    block_table: torch.Tensor
    block_table_checked: torch.Tensor
    seq_lens: torch.Tensor
    query: torch.Tensor
    output: torch.Tensor
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    device_error: torch.Tensor

    def load_inputs(self, q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Inputs -> static buffers (rows [0, n)); padded tail rows [n, B) reset to empty requests.

        Caller has validated shapes/dtypes/devices. block_table may be narrower than max_pages.
        """
        n, width = block_table.shape
        self.query[:n].copy_(q, non_blocking=True)
        self.block_table[:n, :width].copy_(block_table, non_blocking=True)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        if n < self.size:
            self.seq_lens[n:].fill_(PAD_SEQ_LEN)

    def output_rows(self, n: int) -> torch.Tensor:
        """View of the first n output rows (valid until the next step writes the bucket)."""
        return self.output[:n]

    def nbytes(self) -> int:
        tensors = (self.block_table, self.seq_lens, self.query, self.output, self.paged_kv_indptr,
                   self.paged_kv_indices, self.paged_kv_last_page_len)
        return sum(t.numel() * t.element_size() for t in tensors)


class StaticBuffers:
    """Owns every persistent per-step buffer, sized for the largest bucket.

    block_table [B, max_pages] int32 / seq_lens [B] int32: the inputs, allocated here unless the
    caller hands its own persistent tensors (a model runtime's slot state, model/slots.py: the
    graphs then read the slots in place; rows must be contiguous)."""

    def __init__(self, config: RuntimeConfig, device: torch.device, *,
                 block_table: torch.Tensor | None = None, seq_lens: torch.Tensor | None = None):
        self.config = config
        self.device = device
        b, p = config.max_batch, config.max_pages_per_seq
        hq, d = config.num_qo_heads, config.head_dim
        if block_table is not None and (tuple(block_table.shape) != (b, p) or block_table.dtype != INT
                                        or not block_table.is_contiguous()):
            raise ValueError(f"block_table: expected contiguous [{b}, {p}] int32, got "
                             f"{tuple(block_table.shape)} {block_table.dtype}")
        if seq_lens is not None and (tuple(seq_lens.shape) != (b,) or seq_lens.dtype != INT
                                     or seq_lens.stride(0) != 1):
            raise ValueError(f"seq_lens: expected contiguous [{b}] int32, got "
                             f"{tuple(seq_lens.shape)} {seq_lens.dtype}")
        self.block_table = torch.zeros((b, p), dtype=INT, device=device) if block_table is None else block_table
        self.block_table_checked = torch.zeros((b, p), dtype=INT, device=device)
        self.seq_lens = torch.zeros((b,), dtype=INT, device=device) if seq_lens is None else seq_lens
        self.query = torch.zeros((b, hq, d), dtype=config.torch_dtype, device=device)
        self.output = torch.zeros((b, hq, d), dtype=config.torch_dtype, device=device)
        self.paged_kv_indptr = torch.zeros((b + 1,), dtype=INT, device=device)
        self.paged_kv_indices = torch.zeros((b * p,), dtype=INT, device=device)
        self.paged_kv_last_page_len = torch.zeros((b,), dtype=INT, device=device)
        self.device_error = torch.zeros((1,), dtype=INT, device=device)
        self._views = {size: self._make_view(size) for size in config.buckets}

    def _make_view(self, size: int) -> BucketView:
        p = self.config.max_pages_per_seq
        return BucketView(
            size=size,
            block_table=self.block_table[:size],
            block_table_checked=self.block_table_checked[:size],
            seq_lens=self.seq_lens[:size],
            query=self.query[:size],
            output=self.output[:size],
            paged_kv_indptr=self.paged_kv_indptr[: size + 1],
            paged_kv_indices=self.paged_kv_indices[: size * p],
            paged_kv_last_page_len=self.paged_kv_last_page_len[:size],
            device_error=self.device_error,
        )

    def view(self, size: int) -> BucketView:
        return self._views[size]

    def nbytes(self) -> int:
        return self.view(self.config.max_batch).nbytes()

    def bytes_per_bucket(self) -> dict[int, int]:
        """Bytes each bucket's view spans (views overlap: the total is `nbytes()`)."""
        return {size: v.nbytes() for size, v in self._views.items()}
