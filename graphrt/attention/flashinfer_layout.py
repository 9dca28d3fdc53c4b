"""FlashInfer's private plan layout, as graphrt depends on it. The only module that knows it.

FlashInfer's host `plan()` for batch decode writes a schedule into the wrapper's int workspace
(a uint8 device tensor) at byte offsets that it returns as a "plan info" int64 vector. graphrt's
device planner writes the same arrays at the same offsets inside the graph. This module:

- names the FlashInfer versions whose layout it knows (`KNOWN_VERSIONS`);
- parses plan-info vectors of both decode paths into a `PlanSpec` (graphrt's type,
  `graphrt/kernels/plan_layout.py`);
- models FlashInfer's aligned allocation so the offsets can be predicted on a CPU and the
  parsed offsets checked against the model at capture (a mismatch = unknown layout = refuse);
- reads the meaningful ranges of a workspace back for byte-level parity checks.

Deliberate deviation from FlashInfer's host plan: FlashInfer's CUDA-core
planner (`PartitionPagedKVCacheBinarySearchMinNumPagePerBatch`) searches the chunk size counting
an empty request as 0 tiles, then `DecodeSplitKVIndptr` gives it one tile. With empty rows in
the batch (padding, or an engine's idle slots) the tile list can exceed `padded_batch_size`; the
kernel's grid holds only the first `padded_batch_size` tiles, so a request whose tiles lie past
it returns wrong attention (measured on the H200: rel. err. 0.3-0.8 for `[0]*15 + [32768]`).
graphrt's device planner counts every row as the tiles it gets, so its schedule always fits;
where FlashInfer's own plan fits, both are byte-identical (checked at capture,
`backends.flashinfer.check_parity`); where it does not, graphrt's chunk is the smallest that
fits. FlashInfer's host plan() (planner "host") is refused before the step when it overflows
(`host_plan_overflow`).

Sources: FlashInfer 0.7.4 `include/flashinfer/attention/scheduler.cuh` (DecodePlanInfo,
PrefillPlanInfo, DecodePlanImpl, PrefillPlanImpl, PrefillSplitQOKVIndptr).
"""
from __future__ import annotations

import torch

from graphrt.kernels.plan_layout import ABSENT, PlanSpec  # graphrt's plan type (kernels level)

KNOWN_VERSIONS = ("0.7.4",)
TENSOR_CORE = "tensor-core"
CUDA_CORE = "cuda-core"

# Nominal device used to model plans on a CPU (H200: 132 SMs). On a GPU the values come from
# FlashInfer's own capture-time plan() instead.
NOMINAL_NUM_SMS = 132
NOMINAL_CUDA_CORE_BLOCKS_PER_SM = 9


class LayoutMismatch(RuntimeError):
    """FlashInfer's plan info differs from the layout graphrt knows: device planning refused."""


def min_chunk_pages(page_size: int) -> int:
    return max(128 // page_size, 1)


class _Aligned:
    """FlashInfer's AlignedAllocator offset arithmetic (offsets only, no memory)."""

    def __init__(self) -> None:
        self.used = 0

    def alloc(self, nbytes: int, align: int) -> int:
        off = -(-self.used // align) * align
        self.used = off + nbytes
        return off


def model_spec(kind: str, batch_size: int, page_size: int, padded_batch_size: int,
               split_kv: bool) -> PlanSpec:
    """Layout FlashInfer 0.7.4 uses in CUDA-graph mode, given the padded size and split flag."""
    a, i32 = _Aligned(), 4
    p, b = padded_batch_size, batch_size
    if kind == TENSOR_CORE:
        req = a.alloc(i32 * p, 16)
        qo = a.alloc(i32 * p, 16)
        kv = a.alloc(i32 * p, 16)
        o = a.alloc(i32 * (b + 1), 16)
        chunk = a.alloc(i32, 1)
        rows = a.alloc(4, 16)  # total_num_rows, CUDA-graph mode only
        merge = a.alloc(i32 * (b + 1), 16) if split_kv else ABSENT
        mask = a.alloc(p, 16)  # CUDA-graph mode: always
        empty_one, min_chunk = True, min_chunk_pages(page_size)
    elif kind == CUDA_CORE:
        req = a.alloc(i32 * p, 16)
        kv = a.alloc(i32 * p, 16)
        o = a.alloc(i32 * (p + 1), 16)
        chunk = a.alloc(i32, 1)
        mask = a.alloc(p, 16) if split_kv else ABSENT
        qo = rows = merge = ABSENT
        empty_one = False
        min_chunk = min_chunk_pages(page_size) if split_kv else 1
    else:
        raise ValueError(f"plan kind: {kind!r} is not one of {[TENSOR_CORE, CUDA_CORE]}")
    return PlanSpec(kind=kind, batch_size=b, page_size=page_size, padded_batch_size=p,
                    split_kv=split_kv, budget=p if split_kv else 0, min_chunk_pages=min_chunk,
                    empty_counts_one=empty_one, request_indices=req, qo_tile_indices=qo,
                    kv_tile_indices=kv, o_indptr=o, merge_indptr=merge, kv_chunk_size=chunk,
                    total_num_rows=rows, block_valid_mask=mask, int_workspace_bytes=a.used)


def nominal_spec(kind: str, batch_size: int, page_size: int, num_kv_heads: int,
                 num_sms: int = NOMINAL_NUM_SMS) -> PlanSpec:
    """The spec FlashInfer would produce on a device with `num_sms` SMs (CPU testing)."""
    if kind == TENSOR_CORE:
        budget = (2 * num_sms) // num_kv_heads
        split = batch_size <= budget
        padded = max(budget, batch_size)
    else:
        max_grid = NOMINAL_CUDA_CORE_BLOCKS_PER_SM * num_sms
        split = batch_size * num_kv_heads < max_grid
        padded = max_grid // num_kv_heads if split else batch_size
    return model_spec(kind, batch_size, page_size, padded, split)


def parse_plan_info(kind: str, info: list[int], batch_size: int, page_size: int,
                    group_size: int) -> PlanSpec:
    """Turn FlashInfer's plan-info vector into a PlanSpec, refusing layouts graphrt does not know."""
    info = [int(x) for x in info]
    if kind == TENSOR_CORE:
        if len(info) != 15:
            raise LayoutMismatch(f"tensor-core plan info has {len(info)} fields, expected 15")
        (padded, total_rows, rows_off, cta_tile_q, req, qo, kv, merge, o, chunk, _v, _s, mask,
         graph, split) = info
        if not graph:
            raise LayoutMismatch("tensor-core plan info: enable_cuda_graph is false")
        if total_rows != batch_size:
            raise LayoutMismatch(f"tensor-core total_num_rows {total_rows} != batch size {batch_size}")
        if cta_tile_q < group_size:
            raise LayoutMismatch(f"cta_tile_q {cta_tile_q} < GQA group {group_size}: several query "
                                 "tiles per request are not modelled")
        got = dict(request_indices=req, qo_tile_indices=qo, kv_tile_indices=kv, o_indptr=o,
                   merge_indptr=merge if split else ABSENT, kv_chunk_size=chunk,
                   total_num_rows=rows_off, block_valid_mask=mask)
    elif kind == CUDA_CORE:
        if len(info) != 10:
            raise LayoutMismatch(f"CUDA-core plan info has {len(info)} fields, expected 10")
        padded, _v, _s, req, kv, o, mask, chunk, graph, split = info
        if not graph:
            raise LayoutMismatch("CUDA-core plan info: enable_cuda_graph is false")
        got = dict(request_indices=req, qo_tile_indices=ABSENT, kv_tile_indices=kv, o_indptr=o,
                   merge_indptr=ABSENT, kv_chunk_size=chunk, total_num_rows=ABSENT,
                   block_valid_mask=mask if split else ABSENT)
    else:
        raise ValueError(f"plan kind: {kind!r}")
    spec = model_spec(kind, batch_size, page_size, padded, bool(split))
    want = {k: getattr(spec, k) for k in got}
    if got != want:
        diff = {k: (got[k], want[k]) for k in got if got[k] != want[k]}
        raise LayoutMismatch(f"{kind} plan-info offsets differ from the known layout "
                             f"(field: (flashinfer, graphrt)) {diff}")
    return spec


def read_plan(spec: PlanSpec, int_workspace: torch.Tensor) -> dict[str, torch.Tensor]:
    """The meaningful ranges of a planned int workspace, as CPU tensors (for parity and tests).

    Tile arrays are cut to the number of valid tiles (FlashInfer leaves stale bytes past it).
    """
    ws = int_workspace.detach().to("cpu")

    def i32(off: int, n: int) -> torch.Tensor:
        return ws[off: off + 4 * n].view(torch.int32).clone()

    b, p = spec.batch_size, spec.padded_batch_size
    out = {"o_indptr": i32(spec.o_indptr, b + 1), "kv_chunk_size": i32(spec.kv_chunk_size, 1)}
    n_tiles = min(int(out["o_indptr"][-1]), p)
    out["request_indices"] = i32(spec.request_indices, n_tiles)
    out["kv_tile_indices"] = i32(spec.kv_tile_indices, n_tiles)
    if spec.qo_tile_indices != ABSENT:
        out["qo_tile_indices"] = i32(spec.qo_tile_indices, n_tiles)
    if spec.merge_indptr != ABSENT:
        out["merge_indptr"] = i32(spec.merge_indptr, b + 1)
    if spec.total_num_rows != ABSENT:
        out["total_num_rows"] = i32(spec.total_num_rows, 1)
    if spec.block_valid_mask != ABSENT:
        out["block_valid_mask"] = ws[spec.block_valid_mask: spec.block_valid_mask + p].clone()
    return out


def host_plan_overflow(spec: PlanSpec, staged_int_workspace: torch.Tensor, num_rows: int) -> int:
    """Tiles of rows [0, num_rows) beyond the grid in a plan FlashInfer's plan() just staged.

    staged_int_workspace: the wrapper's pinned host copy of the int workspace (plan() writes the
    whole schedule there before one copy to the device), so this costs no device sync. Returns
    o_indptr[num_rows] - padded_batch_size when positive, else 0.
    """
    o_end = staged_int_workspace[spec.o_indptr + 4 * num_rows: spec.o_indptr + 4 * num_rows + 4]
    return max(int(o_end.view(torch.int32)[0]) - spec.padded_batch_size, 0)


def check_version(version: str) -> None:
    """Raise LayoutMismatch unless `version` is one whose plan layout graphrt knows."""
    base = version.split("+")[0]
    if base not in KNOWN_VERSIONS:
        raise LayoutMismatch(f"FlashInfer {version}: graphrt's device planner knows the plan layout "
                             f"of {list(KNOWN_VERSIONS)} only")
