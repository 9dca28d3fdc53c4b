"""Where a batch of query rows goes, in one launch: rows of Q tokens at positions cache_lens + j.

For B rows of Q query tokens each (a verify, a prefill piece, a draft head's step), row b holding
cache_lens[b] tokens' K/V already (-1: a padding row) and, optionally, q_lens[b] real tokens:

    positions[b * Q + j] = max(cache_lens[b], 0) + offset + j            [B * Q] int32
    rows[b * Q + j]      = b if the token is real, else -1               [B * Q] int32 (-1: no K/V written)
    kv_lens[b]           = cache_lens[b] + offset + (q_lens[b] or Q), 0 for a padding row   [B] int32

(a token is real when its row is not padding and j < q_lens[b]). `offset` (a host int >= 0,
default 0) shifts every live row: the EAGLE-3 head's chain steps read one base tensor per round
(the first chain position, -1 for an idle slot) with offsets 0 .. k - 2 instead of forming each
step's lengths with torch ops. As torch ops this is about ten
small launches (arange, clamp, add, compare, select, expand, casts), each a graph node that costs
the device a few microseconds at small models; the model's multi-query layer loop and the
EAGLE-3 head compute it for every call. One program per row on the GPU (many per program in the
CPU interpreter); capturable; runs on CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.mq_launch import check_query_layout


@triton.jit(do_not_specialize=["n_rows", "offset"])
def _query_layout_kernel(cache_lens_ptr, q_lens_ptr, positions_ptr, rows_ptr, kv_lens_ptr, n_rows, offset,
                         Q: tl.constexpr, QB: tl.constexpr, HAS_Q_LENS: tl.constexpr, ROWS: tl.constexpr):
    b1 = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    in_range = b1 < n_rows
    b1 = tl.where(in_range, b1, 0)
    c = tl.load(cache_lens_ptr + b1, mask=in_range, other=-1)
    live = in_range & (c >= 0)
    if HAS_Q_LENS:
        n = tl.load(q_lens_ptr + b1, mask=in_range, other=0)
    else:
        n = tl.full((ROWS,), Q, tl.int32)
    j = tl.arange(0, QB)[None, :]
    c = tl.where(live, c + offset, c)
    b, cc = b1[:, None], tl.maximum(c, 0)[:, None]
    real = live[:, None] & (j < n[:, None])
    out = (j < Q) & in_range[:, None]
    tl.store(positions_ptr + b * Q + j, (cc + j).to(tl.int32), mask=out)
    tl.store(rows_ptr + b * Q + j, tl.where(real, b, -1).to(tl.int32), mask=out)
    tl.store(kv_lens_ptr + b1, tl.where(live, c + n, 0).to(tl.int32), mask=in_range)


def query_layout(cache_lens: torch.Tensor, nq: int, q_lens: torch.Tensor | None = None, *, offset: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cache_lens [B] int32 (< 0: padding row), nq = Q >= 1, q_lens [B] int32 or None (every token
    real), offset: host int >= 0 added to every live row's cache length -> (positions [B * Q]
    int32, rows [B * Q] int32, kv_lens [B] int32), new tensors on cache_lens' device (see the
    module docstring)."""
    b = check_query_layout(cache_lens, nq, q_lens, offset)
    dev = cache_lens.device
    positions = torch.empty(b * nq, dtype=torch.int32, device=dev)
    rows = torch.empty(b * nq, dtype=torch.int32, device=dev)
    kv_lens = torch.empty(b, dtype=torch.int32, device=dev)
    if b == 0:
        return positions, rows, kv_lens
    per = 1 if dev.type == "cuda" else min(64, triton.next_power_of_2(b))
    _query_layout_kernel[(triton.cdiv(b, per),)](
        cache_lens, q_lens if q_lens is not None else cache_lens, positions, rows, kv_lens, b, offset,
        Q=nq, QB=triton.next_power_of_2(nq), HAS_Q_LENS=q_lens is not None, ROWS=per)
    return positions, rows, kv_lens


__all__ = ["query_layout"]
