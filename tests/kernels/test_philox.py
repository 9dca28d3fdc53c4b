"""kernels/philox.py against Triton's own Philox (tl.randint / tl.rand, interpreted): the same words
and the same float32 uniforms bit for bit, over random and edge seeds (negative, 0, 2**32 + 1,
int64 extremes) and offsets (draw index << 32 | token id); and kernels/sample.py's gumbel_score
against its torch twin: the same scores, so the same token wins."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.philox import gumbel_score, randint, uniform
from graphrt.kernels.sample import gumbel_score as triton_gumbel_score

N = 2048


@triton.jit
def _words(seed_ptr, off_ptr, word_ptr, u_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    s = tl.load(seed_ptr + i)
    o = tl.load(off_ptr + i)
    tl.store(word_ptr + i, tl.randint(s, o).to(tl.int64) & 0xFFFFFFFF)
    tl.store(u_ptr + i, tl.rand(s, o))


@triton.jit
def _scores(v_ptr, seed_ptr, t_ptr, tok_ptr, out_ptr, top, safe_t, N: tl.constexpr):
    i = tl.arange(0, N)
    t = tl.load(t_ptr + i).to(tl.int64)
    tl.store(out_ptr + i, triton_gumbel_score(tl.load(v_ptr + i), top, safe_t, tl.load(seed_ptr + i), t << 32,
                                              tl.load(tok_ptr + i)))


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-2 ** 63, 2 ** 63 - 1, (N,), generator=g, dtype=torch.int64)
    seeds[:6] = torch.tensor([0, 1, -1, 2 ** 32 + 1, 2 ** 63 - 1, -2 ** 63])
    t = torch.randint(0, 2 ** 31 - 1, (N,), generator=g, dtype=torch.int64)
    tok = torch.randint(0, 2 ** 32, (N,), generator=g, dtype=torch.int64)
    t[:3], tok[:3] = 0, torch.tensor([0, 2 ** 32 - 1, 128255])
    return seeds, t, tok


def test_words_and_uniforms_are_tritons_bit_for_bit():
    seeds, t, tok = _inputs(0)
    off = (t << 32) | tok
    words, u = torch.empty(N, dtype=torch.int64), torch.empty(N)
    _words[(1,)](seeds, off, words, u, N=N)
    assert torch.equal(randint(seeds, off), words)
    assert torch.equal(uniform(seeds, off).view(torch.int32), u.view(torch.int32))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # broadcasting: one seed per row, offsets per column (the samplers' shapes)
    grid = uniform(seeds[:4, None], off[None, :8])
    assert torch.equal(grid[2], uniform(seeds[2].expand(8), off[:8]))


def test_gumbel_scores_match_and_pick_the_same_token():
    seeds, t, tok = _inputs(1)
    tok = tok % 50000
    v = torch.randn(N, generator=torch.Generator().manual_seed(2)) * 4
    top, temp = float(v.max()), 0.7
    want = torch.empty(N)
    _scores[(1,)](v, seeds, t, tok, want, top, temp, N=N)
    got = gumbel_score(v, torch.tensor(top), torch.tensor(temp), seeds, t, tok)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)    # log: numpy's vs torch's, an ulp apart
    for rows in (slice(0, 64), slice(64, 1000), slice(1000, N)):   # the argmax, as a sampler takes it
        assert int(got[rows].argmax()) == int(want[rows].argmax())
