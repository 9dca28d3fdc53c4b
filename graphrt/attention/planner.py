"""Split-KV planning for FlashInfer decode: the host model, the parity check, and the device path.

The device planner itself is the PLAN branch of `kernels.prepare._prepare_kernel`: one launch
per step that also fills the paged-KV metadata. This module holds what surrounds it:

- `host_plan`: FlashInfer 0.7.4's host planning semantics in numpy (chunk-size binary search,
  tile lists, o/merge indptr, block_valid_mask) for a PlanSpec, including its one flaw: the
  CUDA-core search counts empty rows as 0 tiles but gives each one tile, so the tile list can
  overflow the captured grid (`plan_fits` says when) and drop real requests' tiles.
- `graphrt_plan`: what graphrt's device planner writes: the same, except that the search counts
  every row as the tiles it gets, so the tile list always fits the grid. Where FlashInfer's plan
  fits, the two are byte-identical (the search's predicate only grows, so its minimum is the
  same); where it does not, graphrt picks the smallest chunk that fits.
- `compare_plans`: field-by-field parity of two plans read with `flashinfer_layout.read_plan`.
"""
from __future__ import annotations

import numpy as np
import torch

from graphrt.kernels.plan_layout import ABSENT, PlanSpec


def _cdiv(a, b):
    return -(-a // b)


def host_plan(spec: PlanSpec, seq_lens) -> dict[str, torch.Tensor]:
    """The plan FlashInfer's host planner writes for these lengths, cut to its meaningful ranges.

    seq_lens: [spec.batch_size] ints (0 = padding row). Returns int32 CPU tensors keyed like
    `flashinfer_layout.read_plan`. May overflow the grid (CUDA-core, empty rows): `plan_fits`.
    """
    return _plan(spec, seq_lens, empty_counts_one=spec.empty_counts_one)


def graphrt_plan(spec: PlanSpec, seq_lens) -> dict[str, torch.Tensor]:
    """The plan graphrt's device planner writes (never overflows the grid); see module doc."""
    return _plan(spec, seq_lens, empty_counts_one=True)


def plan_fits(spec: PlanSpec, plan: dict[str, torch.Tensor], num_rows: int | None = None) -> bool:
    """True if every tile of rows [0, num_rows) (default: all) lies inside the padded grid."""
    n = spec.batch_size if num_rows is None else num_rows
    return int(plan["o_indptr"][n]) <= spec.padded_batch_size


def _plan(spec: PlanSpec, seq_lens, *, empty_counts_one: bool) -> dict[str, torch.Tensor]:
    lens = np.asarray(seq_lens, dtype=np.int64)
    if lens.shape != (spec.batch_size,):
        raise ValueError(f"seq_lens: shape {lens.shape}, expected ({spec.batch_size},)")
    pages = _cdiv(lens, spec.page_size)
    count = np.maximum(pages, 1) if empty_counts_one else pages
    lo, hi = spec.min_chunk_pages, int(count.max())
    while lo < hi:
        mid = (lo + hi) // 2
        if int(_cdiv(count, mid).sum()) > spec.budget:
            lo = mid + 1
        else:
            hi = mid
    chunk = lo
    tiles = _cdiv(np.maximum(pages, 1), chunk)
    o_indptr = np.concatenate([[0], np.cumsum(tiles)])
    n_valid = int(o_indptr[-1])
    req = np.repeat(np.arange(spec.batch_size), tiles)
    kv_tile = np.concatenate([np.arange(t) for t in tiles])
    n = min(n_valid, spec.padded_batch_size)
    i32 = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int32))  # noqa: E731
    out = {"o_indptr": i32(o_indptr), "kv_chunk_size": i32([chunk * spec.page_size]),
           "request_indices": i32(req[:n]), "kv_tile_indices": i32(kv_tile[:n])}
    if spec.qo_tile_indices != ABSENT:
        out["qo_tile_indices"] = i32(np.zeros(n))
    if spec.merge_indptr != ABSENT:
        out["merge_indptr"] = i32(o_indptr)
    if spec.total_num_rows != ABSENT:
        out["total_num_rows"] = i32([spec.batch_size])
    if spec.block_valid_mask != ABSENT:
        mask = np.arange(spec.padded_batch_size) < n_valid
        out["block_valid_mask"] = torch.as_tensor(mask.astype(np.uint8))
    return out


def compare_plans(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names of the fields where two plans differ (empty list = byte-identical)."""
    diffs = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key].cpu(), b[key].cpu()
        if x.shape != y.shape or not torch.equal(x.to(torch.int64), y.to(torch.int64)):
            diffs.append(key)
    return diffs
