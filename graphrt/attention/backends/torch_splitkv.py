"""Torch split-KV backend: the device planner's schedule, executed in float32 torch. Eager only.

It runs the same prepare launch (metadata + plan) as the FlashInfer backend, for the plan layout
FlashInfer would use on a nominal H200 (flashinfer_layout.nominal_spec), then executes the planned
tiles and merges them with `reference.split_kv_decode`. On a CPU this is the end-to-end check of
the device planner: every KV token must be covered exactly once to match `reference_decode`.
"""
from __future__ import annotations

import torch

from graphrt.attention import flashinfer_layout as layout
from graphrt.attention.buffers import BucketView
from graphrt.attention.reference import split_kv_decode
from graphrt.attention.backends.base import AttentionBackend
from graphrt.kernels.plan_layout import PlanSpec


# FlashInfer allocates its int workspace in 16-byte-aligned chunks; the prepare kernel views it as
# int32, so its size must be a multiple of 4. The plan's used bytes end at a 1-byte array (the
# block-valid mask), so they often are not: round up.
INT_WORKSPACE_ALIGN = 16


def int_workspace_nbytes(spec: PlanSpec) -> int:
    """Bytes to allocate for a plan's int workspace: its used bytes rounded up to 16."""
    return -(-spec.int_workspace_bytes // INT_WORKSPACE_ALIGN) * INT_WORKSPACE_ALIGN


class TorchSplitKVBackend(AttentionBackend):
    name = "torch-splitkv"
    capturable = False  # reads the plan back to the host

    def __init__(self, config, kv_cache, device):
        super().__init__(config, kv_cache, device)
        self.specs: dict[int, PlanSpec] = {}
        self.int_workspace: dict[int, torch.Tensor] = {}

    def setup(self, views: list[BucketView]) -> None:
        c = self.config
        for view in views:
            spec = layout.nominal_spec(c.decode_kernel, view.size, c.page_size, c.num_kv_heads)
            ws = torch.zeros(int_workspace_nbytes(spec), dtype=torch.uint8, device=self.device)
            self.specs[view.size], self.int_workspace[view.size] = spec, ws
            self._prepare[view.size] = self._metadata_launch(view, spec=spec, int_workspace=ws)

    def attend(self, view: BucketView, q, kv, out) -> None:
        plan = layout.read_plan(self.specs[view.size], self.int_workspace[view.size])
        k, v = kv.as_tuple()
        k_scale, v_scale = kv.kv_scales()              # FP8 pages: dequantized in float32
        result = split_kv_decode(
            q, k, v, indptr=view.paged_kv_indptr, indices=view.paged_kv_indices,
            last_page_len=view.paged_kv_last_page_len, request_indices=plan["request_indices"],
            kv_tile_indices=plan["kv_tile_indices"], o_indptr=plan["o_indptr"],
            kv_chunk_size=int(plan["kv_chunk_size"]), layout=self.config.kv_layout,
            sm_scale=self.sm_scale, k_scale=k_scale, v_scale=v_scale)
        out.copy_(result)

    def describe(self, size: int) -> dict:
        s = self.specs.get(size)
        return {"backend": self.name, "planner": "device (nominal H200 layout)",
                "padded_batch_size": s.padded_batch_size if s else None}
