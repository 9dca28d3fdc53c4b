"""Host-side validation of decode inputs: shapes, dtypes, devices, and CPU-resident values."""
from __future__ import annotations

import torch

from .buckets import pick_bucket


def check_inputs(config, device, num_pool_pages: int, q, block_table, seq_lens) -> int:
    """Validate one decode call's inputs; returns n. Raises naming the field and the limit."""
    c = config
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3 or tuple(q.shape[1:]) != (c.num_qo_heads, c.head_dim):
        raise ValueError(f"q: shape {tuple(q.shape)}, expected [n, {c.num_qo_heads}, {c.head_dim}]")
    if q.dtype != c.torch_dtype:
        raise ValueError(f"q: dtype {q.dtype}, config dtype is {c.torch_dtype}")
    if q.device != device:
        raise ValueError(f"q: on {q.device}, runtime device is {device}")
    n = q.shape[0]
    check_tables(c, device, num_pool_pages, n, block_table, seq_lens)
    return n


def check_tables(config, device, num_pool_pages: int, n: int, block_table, seq_lens) -> None:
    """Validate block_table [n, w] / seq_lens [n] (int32, runtime device or CPU) for n rows."""
    c = config
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    # raises BatchTooLargeError naming the largest bucket, ValueError for an empty batch
    pick_bucket(c.buckets, n)
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: dtype {t.dtype}, expected torch.int32")
        if t.device not in (device, torch.device("cpu")):
            raise ValueError(f"{name}: on {t.device}, expected {device} or cpu")
    if block_table.dim() != 2 or block_table.shape[0] != n or not 1 <= block_table.shape[1] <= c.max_pages_per_seq:
        raise ValueError(f"block_table: shape {tuple(block_table.shape)}, expected [{n}, w] with "
                         f"1 <= w <= max_pages_per_seq={c.max_pages_per_seq}")
    if tuple(seq_lens.shape) != (n,):
        raise ValueError(f"seq_lens: shape {tuple(seq_lens.shape)}, expected [{n}]")
    if seq_lens.device.type == "cpu":
        check_host_values(c, num_pool_pages, block_table, seq_lens)


def check_host_values(config, num_pool_pages: int, block_table, seq_lens) -> None:
    """Value checks for CPU-resident seq_lens (and block_table): lengths and page ids."""
    c = config
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
        if live.numel() and (int(live.min()) < 0 or int(live.max()) >= num_pool_pages):
            raise ValueError(f"block_table: page ids in [{int(live.min())}, {int(live.max())}], "
                             f"KV pool has {num_pool_pages} pages")
