"""The attention-backend interface: the graph lifecycle made explicit.

    setup(views)         capture time, outside any graph: per-bucket state for all buckets at once
                         (wrappers, one host plan each, parity checks) before the first capture
    host_prepare(...)    every step, on the host before replay (only host-planned backends use it)
    prepare(view)        every step, inside the graph: metadata fill (+ device plan), one launch
    run(view)            every step, inside the graph: attention from view.query into view.output
    attend(view, q, kv, out)  the same for any query / layer KV cache (model code, see context.py)

A backend owns its workspaces and library objects; the BucketView owns the per-step buffers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from graphrt.attention.buffers import BucketView
from graphrt.config import RuntimeConfig
from graphrt.attention.kvcache import PagedKVCache


class AttentionBackend(ABC):
    name: str = "?"
    capturable: bool = True          # False: the runtime runs it eagerly (never in a graph)
    needs_host_inputs: bool = False  # True: host_prepare needs seq_lens on the CPU
    reads_block_table: bool = False  # True: reads view.block_table_checked (the sanitised copy)

    def __init__(self, config: RuntimeConfig, kv_cache: PagedKVCache, device: torch.device):
        self.config = config
        self.kv_cache = kv_cache
        self.device = device
        self.sm_scale = config.head_dim ** -0.5
        self._prepare: dict = {}                  # bucket size -> its PrepareLaunch

    def setup(self, views: list[BucketView]) -> None:
        """Capture time, all buckets. Default: the metadata-only prepare launch per bucket."""
        for view in views:
            self._prepare[view.size] = self._metadata_launch(view)

    def _metadata_launch(self, view: BucketView, **plan):
        """The prepare kernel's launch for a bucket (kernels/prepare.py, imported here: a backend
        that never launches it, the torch one, imports no Triton)."""
        from graphrt.kernels.prepare import PrepareLaunch
        c = self.config
        return PrepareLaunch(view, c.page_size, c.max_context_len, self.kv_cache.num_pages,
                             checked_table=self.reads_block_table, **plan)

    def host_prepare(self, view: BucketView, seq_lens_cpu: torch.Tensor) -> None:
        """Host work before replay (seq_lens_cpu: [n] int32 CPU, rows n.. are padding).
        Device-planned backends do nothing here."""

    def prepare(self, view: BucketView) -> None:
        self._prepare[view.size]()

    def run(self, view: BucketView) -> None:
        """Attention for all rows of the bucket: view.query -> view.output (the runtime's KV)."""
        self.attend(view, view.query, self.kv_cache, view.output)

    @abstractmethod
    def attend(self, view: BucketView, q: torch.Tensor, kv: PagedKVCache, out: torch.Tensor) -> None:
        """Attention of q [B, Hq, D] over `kv` with the bucket's prepared metadata into out.

        Any layer's KV cache may be passed: the metadata (and plan) prepared once per step is
        shared by all layers, since they share block tables and lengths."""

    def describe(self, size: int) -> dict:
        """What this backend does for a bucket (planner in use, plan info) for reports."""
        return {"backend": self.name}
