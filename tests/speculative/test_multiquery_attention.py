"""Plan-free multi-query paged attention (kernels/multiquery_attention.py) vs float32 torch over
K/V gathered from the pages with an explicit causal mask; split-KV, GQA, both layouts, padding."""
from __future__ import annotations

import pytest
import torch

from _spec_helpers import PAGE, multiquery_reference
from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.multiquery_attention import multiquery_attention, piece_launch, query_tiles

@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits,nq,hq,hkv", [(1, 3, 4, 2), (2, 5, 4, 2), (3, 2, 2, 2), (1, 1, 8, 2)])
def test_matches_reference(layout, splits, nq, hq, hkv):
    gen = torch.Generator().manual_seed(splits * 100 + nq)
    d, pool = 32, 30
    shape = (pool, PAGE, hkv, d) if layout == "NHD" else (pool, hkv, PAGE, d)
    cache = PagedKVCache(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen), layout)
    lens = torch.tensor([nq, 0, 37, 16 + nq, 70][: 5], dtype=torch.int32)
    table = torch.randperm(pool, generator=gen)[:25].to(torch.int32).view(5, 5)
    q = torch.randn((5, nq, hq, d), generator=gen)
    got = multiquery_attention(q, cache, table, lens, splits=splits)
    torch.testing.assert_close(got, multiquery_reference(q, cache, table, lens), rtol=1e-4, atol=1e-4)
    assert got[1].eq(0).all()                              # padding row


@pytest.mark.parametrize("splits,nq,hq,hkv", [(1, 40, 8, 2), (2, 33, 4, 1), (1, 70, 6, 2)])
def test_query_tiles_and_row_lengths(splits, nq, hq, hkv):
    """A prefill chunk: Q * G above one tile (tokens split into tiles, each reading keys up to its
    last query), rows with fewer real tokens than Q (q_lens), a cached prefix before them."""
    gen = torch.Generator().manual_seed(7 * nq + splits)
    d, pool = 32, 40
    shape = (pool, PAGE, hkv, d)
    cache = PagedKVCache(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen), "NHD")
    q_lens = torch.tensor([nq, 5, 0, nq - 3], dtype=torch.int32)
    lens = torch.tensor([nq, 21 + 5, 0, 30 + nq - 3], dtype=torch.int32)    # cached prefixes 0, 21, -, 30
    table = torch.randperm(pool, generator=gen)[:36].to(torch.int32).view(4, 9)
    q = torch.randn((4, nq, hq, d), generator=gen)
    tile_t, _, tiles = query_tiles(nq, hq // hkv)
    assert tiles > 1 and tile_t * tiles >= nq
    got = multiquery_attention(q, cache, table, lens, q_lens=q_lens, splits=splits)
    for r in range(4):
        n = int(q_lens[r])
        if n == 0:
            assert got[r].eq(0).all()
            continue
        ref = multiquery_reference(q[r:r + 1, :n].contiguous(), cache, table[r:r + 1], lens[r:r + 1])
        torch.testing.assert_close(got[r:r + 1, :n], ref, rtol=1e-4, atol=1e-4)
        assert torch.isfinite(got[r]).all()                 # padding tokens: finite, unused
    same = multiquery_attention(q, cache, table, lens, splits=splits)        # q_lens = Q: the default
    full = multiquery_attention(q, cache, table, lens, q_lens=torch.full((4,), nq, dtype=torch.int32),
                                splits=splits)
    torch.testing.assert_close(same, full, rtol=0, atol=0)


@pytest.mark.parametrize("splits", [1, 3])
def test_a_tile_of_padding_tokens_reads_no_keys(splits):
    """A short last piece in a larger bucket: the tiles holding only padding tokens attend to no
    key (zeros; a captured chunk's cost follows its real tokens), the real ones are unchanged."""
    gen = torch.Generator().manual_seed(11 + splits)
    nq, hq, hkv, d, pool = 40, 8, 2, 32, 12
    cache = PagedKVCache(torch.randn((pool, PAGE, hkv, d), generator=gen),
                         torch.randn((pool, PAGE, hkv, d), generator=gen), "NHD")
    tile_t, _, tiles = query_tiles(nq, hq // hkv)
    assert (tile_t, tiles) == (32, 2)
    q_lens = torch.tensor([5], dtype=torch.int32)
    lens = torch.tensor([60 + 5], dtype=torch.int32)                  # 60 cached keys, then 5 new
    table = torch.randperm(pool, generator=gen)[:5].to(torch.int32).view(1, 5)
    q = torch.randn((1, nq, hq, d), generator=gen)
    got = multiquery_attention(q, cache, table, lens, q_lens=q_lens, splits=splits)
    ref = multiquery_reference(q[:, :5].contiguous(), cache, table, lens)
    torch.testing.assert_close(got[:, :5], ref, rtol=1e-4, atol=1e-4)
    assert got[0, tile_t:].eq(0).all()                     # the padding tile: no keys read
    assert got[0, 5:tile_t].abs().sum() > 0                # padding inside a real tile: attended, unused


def test_piece_launch():
    """One split on CPU; 128-key blocks from 64 tokens up, 64 below (the measured rule)."""
    cpu = torch.device("cpu")
    assert piece_launch(cpu, 64, 4, 8, 8192) == (1, 128)
    assert piece_launch(cpu, 512, 4, 8, 8192) == (1, 128)
    assert piece_launch(cpu, 32, 4, 8, 8192) == (1, 64)


def test_query_tiles():
    assert query_tiles(5, 4) == (5, 32, 1)              # a verify step: one tile
    assert query_tiles(32, 4) == (32, 128, 1)
    assert query_tiles(33, 4) == (32, 128, 2)
    assert query_tiles(512, 7) == (18, 128, 29)          # G not a power of two: 126 rows used
    with pytest.raises(ValueError, match="group"):
        query_tiles(4, 256)


def test_bad_input():
    cache = PagedKVCache(torch.zeros(4, PAGE, 2, 32), torch.zeros(4, PAGE, 2, 32), "NHD")
    q = torch.zeros(2, 3, 4, 32)
    table = torch.zeros((2, 2), dtype=torch.int32)
    lens = torch.full((2,), 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="q:"):
        multiquery_attention(q[..., :16].contiguous(), cache, table, lens)
    with pytest.raises(ValueError, match="block_table"):
        multiquery_attention(q, cache, table.long(), lens)
    with pytest.raises(ValueError, match="kv_lens"):
        multiquery_attention(q, cache, table, lens[:1])
    with pytest.raises(ValueError, match="splits"):
        multiquery_attention(q, cache, table, lens, splits=0)
    with pytest.raises(ValueError, match="q_lens"):
        multiquery_attention(q, cache, table, lens, q_lens=lens.long())
    for bad in (dict(block_n=48), dict(num_warps=3), dict(num_stages=0), dict(num_warps=True)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            multiquery_attention(q, cache, table, lens, **bad)
