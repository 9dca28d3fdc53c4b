"""A tensor-parallel rank's slice of one FP8 weight's scale (the data slice is the float one's).

    check_block_cut(name, (bn, bk), full, cut)        # ValueError if the shard boundary cuts a block
    s = shard_scale(s_disk, strategy, full, cut, rows, block=(bn, bk))

`cut` is the rank's block of the weight, as `graphrt.model.spec.owned_slice` gives it:
(0, a, b) rows [a, b) (column-parallel qkv / gate_up, vocab-parallel lm_head), (1, a, b)
columns [a, b) (row-parallel o / down), or None (replicated). `rows` is the rank's row count
in its fused layout: b - a, or more for a padded vocabulary shard (padding rows hold zero data;
their scale is 1).

    strategy   column-parallel (rows)                 row-parallel (columns)
    tensor     the one value, repeated over `rows`    the same
    channel    scale[a:b] (+ ones for padding rows)   the whole [N] (each output row keeps its scale)
    block      block rows a/bn .. ceil(b/bn)          block columns a/bk .. ceil(b/bk)

A block shard needs a and b on block boundaries (b may be the tensor's end): a rank cannot
hold part of a block whose single scale it shares with another rank's rows.
"""
from __future__ import annotations

import torch


def check_block_cut(name: str, block: tuple[int, int], full: tuple[int, ...], cut) -> None:
    """ValueError naming the tensor and the block size when the cut [a, b) along its dim does
    not start and end on a scale-block boundary (the end of the tensor counts as one)."""
    if cut is None:
        return
    dim, a, b = cut
    size, extent = block[dim], full[dim]
    if a % size or (b % size and b != extent):
        what = ("rows", "columns")[dim]
        raise ValueError(f"tensor {name!r}: the tensor-parallel shard {what} [{a}, {b}) of {extent} cut a "
                         f"scale block of {size} {what} (block {list(block)}); use a tensor_parallel "
                         f"size whose shards are multiples of {size} {what}")


def shard_scale(scale: torch.Tensor, strategy: str, full: tuple[int, int], cut, rows: int, *,
                block: tuple[int, int] | None = None, name: str = "weight") -> torch.Tensor:
    """scale: the on-disk scale (any of the shapes formats.py accepts, float, host) of a weight
    of shape `full` [N, K] (any device) -> float32 on its device [rows] (tensor, channel) or [ceil(rows/bn), ceil(k/bk)]
    (block; k the rank's columns), the rank's part (module docstring)."""
    s = scale.float()
    n, k = full
    if strategy == "tensor":
        return s.reshape(-1)[:1].expand(rows).contiguous()
    if strategy == "channel":
        s = s.reshape(n)
        if cut is not None and cut[0] == 0:
            s = s[cut[1]:cut[2]]
        return _pad_rows(s, rows)
    if strategy != "block" or block is None:
        raise ValueError(f"strategy: {strategy!r} (block={block}) is not an FP8 scale layout")
    check_block_cut(name, block, full, cut)
    bn, bk = block
    if cut is not None:
        dim, a, b = cut
        s = s[a // bn: -(-b // bn)] if dim == 0 else s[:, a // bk: -(-b // bk)]
    return _pad_rows(s, -(-rows // bn))


def _pad_rows(s: torch.Tensor, rows: int) -> torch.Tensor:
    """s with rows of ones appended up to `rows` (zero-data padding rows of a vocab shard)."""
    if s.shape[0] > rows:
        raise ValueError(f"scale: {s.shape[0]} rows for a shard of {rows}")
    if s.shape[0] == rows:
        return s.contiguous()
    pad = torch.ones((rows - s.shape[0], *s.shape[1:]), dtype=s.dtype, device=s.device)
    return torch.cat([s, pad]).contiguous()


__all__ = ["check_block_cut", "shard_scale"]
