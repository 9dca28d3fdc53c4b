"""N-gram proposer kernel vs the plain-Python rule, on random and repetitive token buffers."""
from __future__ import annotations

import pytest
import torch

from graphrt.speculative.ngram import NgramIndex, ngram_propose, ngram_propose_reference


def _run(rows: list[list[int]], width: int, k: int, min_n: int, max_n: int):
    buf = torch.full((len(rows), width), 7777, dtype=torch.int32)   # junk past each length
    for s, r in enumerate(rows):
        buf[s, : len(r)] = torch.tensor(r, dtype=torch.int32)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    out = torch.full((len(rows), k), -5, dtype=torch.int64)
    count = torch.full((len(rows),), -5, dtype=torch.int32)
    ngram_propose(buf, lens, out, count, min_n=min_n, max_n=max_n)
    return out, count


@pytest.mark.parametrize("k,min_n,max_n", [(4, 1, 3), (3, 2, 4), (5, 1, 1)])
def test_matches_reference(k, min_n, max_n):
    gen = torch.Generator().manual_seed(k * 10 + max_n)
    rows = []
    for s in range(12):
        n = int(torch.randint(0, 60, (1,), generator=gen))
        vocab = [3, 5, 50][s % 3]                       # small vocabularies: many matches
        rows.append(torch.randint(0, vocab, (n,), generator=gen).tolist())
    rows += [[], [1], [1, 1], [1, 2, 3, 1, 2, 3, 1, 2], [9, 8, 7, 6]]
    out, count = _run(rows, 64, k, min_n, max_n)
    found = 0
    for s, r in enumerate(rows):
        want = ngram_propose_reference(r, k, min_n, max_n)
        assert int(count[s]) == len(want), (s, r)
        assert out[s, : len(want)].tolist() == want, (s, r)
        assert out[s, len(want):].eq(0).all()
        found += bool(want)
    assert 0 < found < len(rows)                        # both outcomes exercised


def test_prefers_longest_then_latest():
    # suffix [1, 2]: "1 2" occurs at ends 1 and 6 (followed by 9 and 4); "x 1 2" (n=3) only at end 6
    toks = [1, 2, 9, 9, 5, 1, 2, 4, 4, 5, 1, 2]
    out, count = _run([toks], 16, 3, 1, 3)
    assert int(count[0]) == 3 and out[0].tolist() == [4, 4, 5]
    assert ngram_propose_reference(toks, 3, 1, 3) == [4, 4, 5]
    # clipped at the end of the buffer: [1 2 1 2] -> latest earlier "1 2" ends at 1, continuation [1, 2]
    out, count = _run([[1, 2, 1, 2]], 8, 4, 1, 2)
    assert int(count[0]) == 2 and out[0, :2].tolist() == [1, 2]


def test_bad_input():
    buf = torch.zeros((2, 8), dtype=torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    out = torch.zeros((2, 3), dtype=torch.int64)
    count = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="tokens"):
        ngram_propose(buf.long(), lens, out, count, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="lens"):
        ngram_propose(buf, lens[:1], out, count, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="out"):
        ngram_propose(buf, lens, out.int(), count, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="min_n"):
        ngram_propose(buf, lens, out, count, min_n=3, max_n=2)


@pytest.mark.parametrize("min_n,max_n", [(1, 3), (2, 4), (1, 1)])
def test_host_index_follows_the_rule_as_its_list_grows(min_n, max_n):
    """NgramIndex (the engine's host prediction of a slot's proposal) equals the rule after every
    extension of a growing list, and refuses bad n-gram bounds."""
    gen = torch.Generator().manual_seed(min_n * 7 + max_n)
    for vocab in (2, 4, 30):
        index, toks = NgramIndex(min_n, max_n), []
        for _ in range(25):
            new = torch.randint(0, vocab, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen).tolist()
            index.extend(new)
            toks += new
            for k in (1, 3, 6):
                assert index.propose(k) == ngram_propose_reference(toks, k, min_n, max_n), (toks, k)
        assert len(index) == len(toks)
    with pytest.raises(ValueError, match="min_n, max_n"):
        NgramIndex(3, 2)
