"""Metadata half of the prepare kernel, and its torch reference (kernels/reference.py: the torch
backend's prepare), vs a numpy reference (TRITON_INTERPRET=1 on CPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.attention.buffers import StaticBuffers
from graphrt.config import RuntimeConfig
from graphrt.kernels import ERR_PAGE_ID, ERR_SEQ_LEN, PrepareLaunch
from graphrt.kernels.reference import prepare_metadata


def _prepare(impl: str, view, page_size, max_context_len, pool, checked_table=False) -> None:
    """One metadata-only prepare of `view` by the Triton kernel or its torch reference."""
    if impl == "triton":
        PrepareLaunch(view, page_size, max_context_len, pool, checked_table=checked_table)()
    else:
        prepare_metadata(view, page_size=page_size, max_context_len=max_context_len, num_pool_pages=pool,
                         checked_table=checked_table)


def numpy_csr(seq_lens: np.ndarray, table: np.ndarray, page_size: int):
    pages = -(-seq_lens // page_size)
    indptr = np.concatenate([[0], np.cumsum(pages)])
    indices = np.concatenate([table[i, :p] for i, p in enumerate(pages)] + [np.zeros(0, np.int64)])
    last = np.where(pages > 0, seq_lens - (pages - 1) * page_size, 0)
    return indptr, indices, last


def _config(page_size, max_pages, buckets):
    return RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=page_size,
                         max_pages_per_seq=max_pages, buckets=buckets, dtype="float32",
                         backend="reference")


@st.composite
def cases(draw):
    page_size = draw(st.sampled_from([1, 4, 16, 32]))
    max_pages = draw(st.integers(1, 40))
    buckets = draw(st.sampled_from([[1], [1, 3], [2, 8], [1, 2, 4, 8, 16]]))
    size = draw(st.sampled_from(buckets))
    n_real = draw(st.integers(1, size))
    max_len = page_size * max_pages
    special = st.sampled_from([1, page_size, max_len, max(1, max_len - 1), min(page_size + 1, max_len)])
    lens = draw(st.lists(st.one_of(special, st.integers(1, max_len)), min_size=n_real, max_size=n_real))
    seed = draw(st.integers(0, 2**16))
    return page_size, max_pages, buckets, size, lens, seed


@pytest.mark.parametrize("impl", ["triton", "torch"])
@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_metadata_matches_numpy(impl, case):
    page_size, max_pages, buckets, size, lens, seed = case
    cfg = _config(page_size, max_pages, buckets)
    bufs = StaticBuffers(cfg, torch.device("cpu"))
    view = bufs.view(size)
    g = torch.Generator().manual_seed(seed)
    pool = 97
    view.block_table.copy_(torch.randint(0, pool, view.block_table.shape, generator=g, dtype=torch.int32))
    view.seq_lens.zero_()                           # padding rows: seq_len 0
    view.seq_lens[: len(lens)] = torch.tensor(lens, dtype=torch.int32)
    view.paged_kv_indices.fill_(-7)                 # poison
    view.paged_kv_last_page_len.fill_(-7)
    _prepare(impl, view, page_size, cfg.max_context_len, pool)
    indptr, indices, last = numpy_csr(view.seq_lens.numpy().astype(np.int64),
                                      view.block_table.numpy(), page_size)
    assert view.paged_kv_indptr.tolist() == indptr.tolist()
    assert view.paged_kv_indices[: indptr[-1]].tolist() == indices.tolist()
    assert view.paged_kv_last_page_len.tolist() == last.tolist()
    assert int(view.device_error) == 0
    # padding rows are valid empty requests: zero pages, last_page_len 0
    n = len(lens)
    assert (np.diff(indptr)[n:] == 0).all() and (last[n:] == 0).all()


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_guard_rewrites_bad_rows_and_flags(impl):
    cfg = _config(16, 8, [4])
    view = StaticBuffers(cfg, torch.device("cpu")).view(4)
    view.block_table.copy_(torch.arange(32, dtype=torch.int32).view(4, 8))
    view.seq_lens.copy_(torch.tensor([5, cfg.max_context_len + 1, -3, 40], dtype=torch.int32))
    view.block_table[3, 1] = 1000                   # page id outside a 64-page pool
    view.block_table_checked.fill_(-5)
    _prepare(impl, view, 16, cfg.max_context_len, 64, checked_table=True)
    assert int(view.device_error) == ERR_SEQ_LEN | ERR_PAGE_ID
    assert view.seq_lens.tolist() == [5, 0, 0, 40]  # bad rows neutralised in place
    assert int(view.block_table[3, 1]) == 1000      # the input keeps the bad id (K/V append skips it)
    assert view.block_table_checked[3, :3].tolist() == [24, 0, 26]  # the copy xqa reads: page 0
    assert view.block_table_checked[0, 0].tolist() == 0 and int(view.block_table_checked[0, 1]) == -5
    assert view.paged_kv_indptr.tolist() == [0, 1, 1, 1, 4]
    assert view.paged_kv_indices[:4].tolist() == [0, 24, 0, 26]
