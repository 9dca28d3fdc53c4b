"""Host-side validation of decode and prefill inputs: shapes, dtypes, devices, CPU-resident values,
and (for host-known tables) that no row writes a page another row uses."""
from __future__ import annotations

import numpy as np
import torch

from graphrt.attention.buckets import pick_bucket


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
    _check_table_layout(c, device, n, block_table, seq_lens)
    if seq_lens.device.type == "cpu":
        check_host_values(c, num_pool_pages, block_table, seq_lens)


def _check_table_layout(c, device, n: int, block_table, seq_lens) -> None:
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


def check_host_values(config, num_pool_pages: int, block_table, seq_lens, *,
                      lens_name: str = "seq_lens") -> None:
    """Value checks for CPU-resident seq_lens (and block_table): lengths and page ids (numpy:
    a few microseconds on the small arrays of a call)."""
    c = config
    lens = _host_ints(seq_lens)
    lo, hi = int(lens.min()), int(lens.max())
    if lo < 0 or hi > c.max_context_len:
        raise ValueError(f"{lens_name}: values in [{lo}, {hi}], allowed [0, max_context_len="
                         f"{c.max_context_len}]")
    need = -(-hi // c.page_size)
    if need > block_table.shape[1]:
        raise ValueError(f"block_table: {block_table.shape[1]} columns, {lens_name} needs {need} pages")
    if block_table.device.type == "cpu" and need:
        used = block_table.numpy()[:, :need]
        pages = (lens + c.page_size - 1) // c.page_size
        live = used[np.arange(need)[None, :] < pages[:, None]]
        if live.size and (int(live.min()) < 0 or int(live.max()) >= num_pool_pages):
            raise ValueError(f"block_table: page ids in [{int(live.min())}, {int(live.max())}], "
                             f"KV pool has {num_pool_pages} pages")


def _host_ints(x) -> np.ndarray:
    """A CPU torch tensor, numpy array or list of ints -> int64 numpy (no copy where possible)."""
    if isinstance(x, torch.Tensor):
        x = x.numpy()
    return np.asarray(x, dtype=np.int64)


def check_prefill(config, device, num_pool_pages: int, vocab_size: int, prompts, block_table,
                  starts=None) -> None:
    """Validate a prefill: prompts, a list of n [T_i] int64 token tensors (1 <= T_i <=
    max_context_len, ids < vocab_size), row i of block_table [n, w] int32 holding their pages
    (every page id in the pool, no page written by two rows). starts: n ints >= 0 (default 0),
    the position of each prompt's first token (earlier positions are read, not written).
    Runtime device or CPU."""
    c = config
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts: expected a non-empty list of [T] int64 tensors, got {prompts!r:.80}")
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"prompts[{i}]: expected a torch.Tensor, got {type(p).__name__}")
        if p.dim() != 1 or p.dtype != torch.int64 or p.device not in (device, torch.device("cpu")):
            raise ValueError(f"prompts[{i}]: {tuple(p.shape)} {p.dtype} on {p.device}, expected "
                             f"[T] torch.int64 on {device} or cpu")
        if not 1 <= p.shape[0] <= c.max_context_len:
            raise ValueError(f"prompts[{i}]: length {p.shape[0]}, allowed [1, max_context_len="
                             f"{c.max_context_len}]")
        if p.device.type == "cpu":                   # numpy: a microsecond, not torch's dispatch
            a = p.numpy()
            lo, hi = int(a.min()), int(a.max())
        else:
            lo, hi = int(p.min()), int(p.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompts[{i}]: ids in [{lo}, {hi}], vocabulary has {vocab_size}")
    try:
        first = np.zeros(len(prompts), dtype=np.int64) if starts is None else \
            np.array([int(x) for x in starts], dtype=np.int64)
    except (TypeError, ValueError):
        first = None
    if first is None or first.shape != (len(prompts),) or (first.size and int(first.min()) < 0):
        raise ValueError(f"starts: expected {len(prompts)} ints >= 0, got {list(starts)}")
    lens = first + np.array([p.shape[0] for p in prompts], dtype=np.int64)   # end positions
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table: expected a torch.Tensor, got {type(block_table).__name__}")
    _check_table_layout(c, device, len(prompts), block_table, torch.from_numpy(lens.astype(np.int32)))
    table = block_table.cpu()  # prefill is eager: one small copy to check every page id
    check_host_values(c, num_pool_pages, table, lens, lens_name="prompt lengths")
    check_exclusive_writes(c, table, first, lens)


def check_exclusive_writes(config, block_table, first, end) -> None:
    """Refuse rows that write a page another row uses (forked requests without copy-on-write).

    block_table [n, w] int32 (CPU, page ids of the used columns already checked); row r reads
    positions [0, end[r]) and writes positions [first[r], end[r]) (first, end: [n] int, CPU;
    end 0 = padding). A page may be shared by several rows only where none of them writes it:
    the page holding a row's newest token must be the row's own. Vectorised (no batch loop).
    """
    if block_table.shape[0] < 2:
        return                                                          # one row shares with none
    p = config.page_size
    first, end = _host_ints(first), _host_ints(end)
    table = block_table.numpy() if isinstance(block_table, torch.Tensor) else np.asarray(block_table)
    w = min(table.shape[1], int((end.max() + p - 1) // p) if end.size else 0)
    table = table[:, :w].astype(np.int64)                               # only the columns read
    n = table.shape[0]
    cols = np.arange(w)[None, :]
    live = cols < ((end + p - 1) // p)[:, None]                         # [n, w] pages read
    writes = live & (end > first)[:, None] & (cols >= (first // p)[:, None])
    written = table[writes]
    rows, pages = np.nonzero(live)[0], table[live]
    hit = np.isin(pages, written)                                       # reads of a written page
    pairs = np.unique(pages[hit] * n + rows[hit])                       # (page, row), deduplicated
    used, count = np.unique(pairs // n, return_counts=True)
    shared = used[count > 1]                                            # written pages in 2+ rows
    if not shared.size:
        return
    clash = np.isin(written, shared)
    page = int(written[clash][0])
    writer = int(np.nonzero(writes)[0][np.nonzero(clash)[0][0]])
    users = sorted(set(rows[pages == page].tolist()))
    raise ValueError(f"block_table: rows {users} share page {page}, which row {writer} writes "
                     f"(positions [{int(first[writer])}, {int(end[writer])})); a page a row writes "
                     f"must be its own: copy a forked request's partly filled page first "
                     f"(copy-on-write). Read-only prefix pages may be shared.")
