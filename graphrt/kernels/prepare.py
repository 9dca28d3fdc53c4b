"""One Triton launch per decode step: paged-KV metadata + (optionally) FlashInfer's split-KV plan.

From the bucket's block_table and seq_lens (device), it writes
- paged_kv_indptr (exclusive prefix sum of pages), paged_kv_indices (block-table rows packed),
  paged_kv_last_page_len;
- with a PlanSpec: the arrays FlashInfer's host plan() would write into the int workspace
  (request_indices, qo_tile_indices, kv_tile_indices, o_indptr, merge_indptr, kv_chunk_size,
  total_num_rows, block_valid_mask), with the same chunk-size binary search.
- device_error flags: 1 = a seq_len outside [0, max_context_len] (the row is rewritten to 0 in
  place: an empty request for every later kernel), 2 = a page id outside the KV pool (read as
  page 0 through indices / block_table_checked; block_table itself is left alone, so the K/V
  append kernel sees the bad id and skips the write), 4 = a non-empty request's work tiles did
  not fit the captured grid (unreachable by construction, see below: kept as a guard). No
  backend reads out of bounds; the runtime raises on the flag when it checks
  (`DecodeRuntime.check_device_errors`).

Chunk-size search: it counts each row as the tiles it will get, max(pages, 1), also for empty
rows (FlashInfer's CUDA-core planner counts them as 0 but still gives them one tile, so its plan
can overflow the grid and drop a real request's tiles: wrong attention). The search therefore
finds the smallest chunk whose tile list fits the grid; where FlashInfer's plan fits, it finds
the same chunk (byte parity), see `planner.graphrt_plan` and `flashinfer_layout`.

Grid: (B + tile blocks, page blocks). Row programs pack BLOCK_P page ids each, in parallel;
tile programs each repeat the (register-only) chunk search and write BLOCK_T work tiles; the
first of them also writes indptr, last_page_len and the plan scalars. No host reads; capturable in a CUDA graph. Runs on CPU
tensors under TRITON_INTERPRET=1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from graphrt.kernels.flags import ERR_GRID, ERR_PAGE_ID, ERR_SEQ_LEN  # noqa: F401 (re-exported)
from graphrt.kernels.plan_layout import ABSENT, PlanSpec

BLOCK_P = 256  # page ids per packing program
BLOCK_T = 8    # work tiles per planning program


@triton.jit(do_not_specialize=["B", "page_size", "max_context_len", "num_pool_pages", "padded",
                               "budget", "min_chunk", "off_req", "off_qo", "off_kv", "off_o",
                               "off_merge", "off_chunk", "off_rows", "off_mask", "bt_stride"])
def _prepare_kernel(
    block_table_ptr, bt_stride, seq_lens_ptr, checked_table_ptr,
    indptr_ptr, indices_ptr, last_page_len_ptr, error_ptr,
    ws_i32_ptr, ws_u8_ptr,
    B, page_size, max_context_len, num_pool_pages,
    padded, budget, min_chunk,
    off_req, off_qo, off_kv, off_o, off_merge, off_chunk, off_rows, off_mask,
    BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
    PLAN: tl.constexpr, HAS_QO: tl.constexpr,
    HAS_MERGE: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_MASK: tl.constexpr,
    CHECKED_TABLE: tl.constexpr,
):
    # grid (B + n_tile_blocks, n_page_blocks): program (r < B, c) packs page block c of row r;
    # program (B + k, 0) writes tile block k of the plan, and (B, 0) also indptr/last_page_len.
    pid = tl.program_id(0)
    pcol = tl.program_id(1)
    rb = tl.arange(0, BLOCK_B)
    in_b = rb < B
    seq = tl.load(seq_lens_ptr + rb, mask=in_b, other=0)
    bad_seq = in_b & ((seq < 0) | (seq > max_context_len))
    seq = tl.where(bad_seq, 0, seq)
    pages = (seq + page_size - 1) // page_size          # [BLOCK_B], 0 for padding rows
    page_end = tl.cumsum(pages, 0)

    if pid < B:
        mine = rb == pid
        if pcol == 0:
            # sanitise in place so every backend (xqa reads seq_lens directly) is safe; flag from
            # the row's owner (another program may already see the rewritten 0)
            tl.store(seq_lens_ptr + rb, rb * 0, mask=mine & bad_seq)
            if tl.sum((mine & bad_seq).to(tl.int32), 0) > 0:
                tl.atomic_or(error_ptr, 1)
        my_pages = tl.sum(tl.where(mine, pages, 0), 0)
        my_start = tl.sum(tl.where(mine, page_end - pages, 0), 0)
        rp = pcol * BLOCK_P + tl.arange(0, BLOCK_P)
        m = rp < my_pages
        ids = tl.load(block_table_ptr + pid * bt_stride + rp, mask=m, other=0)
        oob = m & ((ids < 0) | (ids >= num_pool_pages))
        safe_ids = tl.where(oob, 0, ids)
        tl.store(indices_ptr + my_start + rp, safe_ids, mask=m)
        if CHECKED_TABLE:  # a sanitised dense copy for backends that read the table (xqa)
            tl.store(checked_table_ptr + pid * bt_stride + rp, safe_ids, mask=m)
        if tl.sum(oob.to(tl.int32), 0) > 0:
            tl.atomic_or(error_ptr, 2)
    elif pcol == 0:
        tile_block = pid - B
        if tile_block == 0:
            tl.store(indptr_ptr + rb * 0, rb * 0, mask=rb == 0)
            tl.store(indptr_ptr + 1 + rb, page_end, mask=in_b)
            last = tl.where(pages == 0, 0, seq - (pages - 1) * page_size)
            tl.store(last_page_len_ptr + rb, last, mask=in_b)
        if PLAN:
            # chunk-size binary search (FlashInfer: PrefillBinarySearchKVChunkSize for the
            # tensor-core path, PartitionPagedKVCacheBinarySearchMinNumPagePerBatch for CUDA-core),
            # counting every row as the tiles it gets (empty rows too: the grid always holds the
            # work); every tile program repeats it (registers only) instead of waiting
            count_pages = tl.where(in_b, tl.maximum(pages, 1), 0)
            hi = tl.max(count_pages, 0)
            lo = hi * 0 + min_chunk
            while lo < hi:
                mid = (lo + hi) // 2
                n_tiles = tl.sum((count_pages + mid - 1) // mid, 0)
                if n_tiles > budget:
                    lo = mid + 1
                else:
                    hi = mid
            chunk = lo
            tiles = tl.where(in_b, (tl.maximum(pages, 1) + chunk - 1) // chunk, 0)
            tile_end = tl.cumsum(tiles, 0)
            n_valid = tl.sum(tiles, 0)
            if tile_block == 0:
                tl.store(ws_i32_ptr + off_o + rb * 0, rb * 0, mask=rb == 0)
                tl.store(ws_i32_ptr + off_o + 1 + rb, tile_end, mask=in_b)
                if HAS_MERGE:
                    tl.store(ws_i32_ptr + off_merge + rb * 0, rb * 0, mask=rb == 0)
                    tl.store(ws_i32_ptr + off_merge + 1 + rb, tile_end, mask=in_b)
                tl.store(ws_i32_ptr + off_chunk + rb * 0, rb * 0 + chunk * page_size, mask=rb == 0)
                if HAS_ROWS:
                    tl.store(ws_i32_ptr + off_rows + rb * 0, rb * 0 + B, mask=rb == 0)
                last_real_end = tl.max(tl.where(in_b & (pages > 0), tile_end, 0), 0)
                if last_real_end > padded:
                    tl.atomic_or(error_ptr, 4)
            t = tile_block * BLOCK_T + tl.arange(0, BLOCK_T)
            inside = t < padded
            before = (tile_end[None, :] <= t[:, None]) & in_b[None, :]   # [BLOCK_T, BLOCK_B]
            req = tl.sum(before.to(tl.int32), 1)
            first_tile = tl.sum(tl.where(before, tiles[None, :], 0), 1)
            live = t < n_valid
            tl.store(ws_i32_ptr + off_req + t, tl.where(live, req, 0), mask=inside)
            tl.store(ws_i32_ptr + off_kv + t, tl.where(live, t - first_tile, 0), mask=inside)
            if HAS_QO:
                tl.store(ws_i32_ptr + off_qo + t, t * 0, mask=inside)
            if HAS_MASK:
                tl.store(ws_u8_ptr + off_mask + t, live.to(tl.uint8), mask=inside)


@dataclass(frozen=True)
class PrepareLaunch:
    """A prepared launch for one bucket: call it (inside or outside a graph) once per step.

    view: the bucket's BucketView; spec/int_workspace: the plan to write (None = metadata only);
    int_workspace is FlashInfer's uint8 int workspace on the same device as the view;
    checked_table=True also writes view.block_table_checked (for backends reading the table).
    """

    view: object
    page_size: int
    max_context_len: int
    num_pool_pages: int
    spec: PlanSpec | None = None
    int_workspace: torch.Tensor | None = None
    checked_table: bool = False

    def __call__(self) -> None:
        v, spec = self.view, self.spec
        b = v.size
        block_b = max(16, triton.next_power_of_2(b))
        if spec is None:
            ws_i32 = ws_u8 = v.paged_kv_indptr  # unused pointers
            plan_args = (0, 0, 1) + (0,) * 8
            flags = dict(PLAN=False, HAS_QO=False, HAS_MERGE=False,
                         HAS_ROWS=False, HAS_MASK=False)
        else:
            ws_i32, ws_u8 = self.int_workspace.view(torch.int32), self.int_workspace
            o = spec

            def el(off: int) -> int:  # byte offset -> int32 element offset (0 when absent)
                return 0 if off == ABSENT else off // 4
            plan_args = (o.padded_batch_size, o.budget, o.min_chunk_pages,
                         el(o.request_indices), el(o.qo_tile_indices), el(o.kv_tile_indices),
                         el(o.o_indptr), el(o.merge_indptr), el(o.kv_chunk_size),
                         el(o.total_num_rows), max(o.block_valid_mask, 0))
            flags = dict(PLAN=True, HAS_QO=o.qo_tile_indices != ABSENT,
                         HAS_MERGE=o.merge_indptr != ABSENT, HAS_ROWS=o.total_num_rows != ABSENT,
                         HAS_MASK=o.block_valid_mask != ABSENT)
        n_tile_blocks = triton.cdiv(plan_args[0], BLOCK_T) if spec is not None else 1
        n_page_blocks = triton.cdiv(v.block_table.shape[1], BLOCK_P)
        _prepare_kernel[(b + n_tile_blocks, n_page_blocks)](
            v.block_table, v.block_table.stride(0), v.seq_lens, v.block_table_checked,
            v.paged_kv_indptr, v.paged_kv_indices, v.paged_kv_last_page_len, v.device_error,
            ws_i32, ws_u8,
            b, self.page_size, self.max_context_len, self.num_pool_pages,
            *plan_args,
            BLOCK_B=block_b, BLOCK_P=BLOCK_P, BLOCK_T=BLOCK_T, num_warps=1,
            CHECKED_TABLE=self.checked_table, **flags,
        )
