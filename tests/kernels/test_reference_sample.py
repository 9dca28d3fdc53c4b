"""kernels/reference_sample.py (the torch kernel set's drawing kernels) against the Triton kernels
they mirror, run by the interpreter on the same inputs: sample_tokens (sorted and unsorted draws,
top-k / top-p, greedy rows, several rows a slot, step advanced) and kept_lengths draw and keep
exactly what Triton does (the Philox noise is bit-equal); process_logits equals element for
element, process_draw draws the same tokens, counts them and gives the same log-probabilities
(float32 rounding of the normaliser), logprobs_into too; apply_token_mask writes the same -inf.
Fresh random rows with -inf entries, exact ties, duplicate and expired token rules; and both
implementations refuse the same bad arguments."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels import logits_process as tri_lp, reference_sample as ref, sample as tri_s
from graphrt.kernels import token_mask as tri_m
from graphrt.model.processing import FOREVER

W = 5


def _logits(r: int, v: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, v, generator=g) * 2
    x[0, 3:40] = -torch.inf
    x[1, 10] = x[1, 20] = x[1].max() + 1.0                   # an exact tie at the top
    return x.to(dtype)


def _sampling(s: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    temp = torch.tensor([0.8, 0.0, 1.3, 0.5, 1.0, 2.0, 0.0, 0.9])[:s]
    top_k = torch.tensor([0, 0, 5, 40, 0, 1, 3, 0], dtype=torch.int32)[:s]
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.6, 0.3, 1.0, 1.0, 1.0])[:s]
    seeds = torch.randint(0, 2 ** 62, (s,), generator=g, dtype=torch.int64)
    step = torch.randint(0, 1000, (s,), generator=g, dtype=torch.int32)
    return temp, top_k, top_p, seeds, step


@pytest.mark.parametrize("filtered,q,dtype", [(True, 1, torch.float32), (False, 1, torch.float32),
                                              (True, 3, torch.float32), (True, 1, torch.bfloat16)])
def test_sample_tokens_draws_what_triton_draws(filtered, q, dtype):
    s, v = 8, 1500
    logits = _logits(s * q, v, 3 + q, dtype)
    temp, top_k, top_p, seeds, step = _sampling(s, q)
    if not filtered:
        top_k, top_p = torch.zeros_like(top_k), torch.ones_like(top_p)
    outs = []
    for impl in (tri_s, ref):
        out, st = torch.full((s * q,), -1, dtype=torch.int64), step.clone()
        impl.sample_tokens(logits, temp, top_k, top_p, seeds, st, out, filtered=filtered, advance=q == 1,
                           rows_per_slot=q)
        outs.append((out, st))
    (a, sa), (b, sb) = outs
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert bool((a >= 0).all()) and torch.equal(sb, step + 1 if q == 1 else step)
    greedy = (temp.repeat_interleave(q) == 0) | (top_k.repeat_interleave(q) == 1)
    assert torch.equal(b[greedy], logits.float().argmax(-1)[greedy])


def test_kept_lengths_equal_tritons():
    logits = _logits(8, 700, 5)
    temp, top_k, top_p, _, _ = _sampling(8, 5)
    (order_t, kept_t), (order_r, kept_r) = (m.kept_lengths(logits, temp, top_k, top_p) for m in (tri_s, ref))
    assert torch.equal(order_t, order_r) and torch.equal(kept_t, kept_r)
    assert kept_r[1] == 700 and kept_r[2] <= 5 and kept_r[5] == 1           # greedy: V; top_k 5; top_k 1


def _state(r: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    counts = (torch.randint(1, 4, (r, v), generator=g) * (torch.rand(r, v, generator=g) < 0.1)).int()
    prompt = torch.rand(r, v, generator=g) < 0.05
    base = [[0.5, 0.3, 1.3, 0.1], [0.0, 0.0, 1.0, 0.0], [0.2, -0.1, 0.8, 0.05], [0.4, 0.2, 1.2, 0.0]]
    params = torch.tensor([base[i % 4] for i in range(r)]).t().contiguous()     # [4, R]
    ids = torch.full((r, 8), -1, dtype=torch.int64)
    vals, until = torch.zeros(r, 8), torch.zeros(r, 8, dtype=torch.int32)
    ids[0, :4] = torch.tensor([3, v - 1, 3, 100])                  # a duplicate id, a ban at the end
    vals[0, :4] = torch.tensor([1.5, -torch.inf, 2.0, 4.0])
    until[0, :4] = FOREVER
    ids[2, :2] = torch.tensor([7, v // 2])                         # the second one expired
    vals[2, :2] = torch.tensor([-torch.inf, 5.0])
    until[2, :2] = torch.tensor([5, 1], dtype=torch.int32)
    return counts, prompt, params, ids, vals, until


def test_process_logits_equals_tritons():
    r, v = 4, 900
    x = _logits(r, v, 7)
    counts, prompt, params, ids, vals, until = _state(r, v, 7)
    step, temp = torch.arange(r, dtype=torch.int32), torch.tensor([0.7, 0.0, 1.0, 1.3])
    got = [m.process_logits(x, counts, prompt, params, ids, vals, until, torch.zeros(r, v), step, temp, chunk=256)
           for m in (tri_lp, ref)]
    assert torch.equal(got[0], got[1])
    assert got[1][0, v - 1] == -torch.inf and bool(torch.isinf(got[1][2]).any())   # the ban; min_p cut
    sel = torch.tensor([3, 0])                                      # rows of a larger state (slots)
    got = [m.process_logits(x[:2], counts, prompt, params, ids, vals, until, torch.zeros(r, v), step[:2],
                            temp[:2], slots=sel) for m in (tri_lp, ref)]
    assert torch.equal(got[0], got[1])


@pytest.mark.parametrize("source", ["raw", "processed"])
def test_process_draw_equals_tritons(source):
    r, v = 4, 900
    x = _logits(r, v, 9)
    counts, prompt, params, ids, vals, until = _state(r, v, 9)
    temp = torch.tensor([0.7, 0.0, 1.0, 1.3])
    seeds, live = torch.tensor([5, 6, 7, 2 ** 40]), torch.tensor([True, True, False, True])
    res = []
    for m in (tri_lp, ref):
        step, c, out = torch.tensor([0, 3, 9, 200], dtype=torch.int32), counts.clone(), torch.zeros(r, dtype=torch.int64)
        lp = (torch.zeros(r), torch.zeros(r, dtype=torch.int32), torch.zeros(r, W, dtype=torch.int64), torch.zeros(r, W))
        xp = m.process_draw(x, c, prompt, params, ids, vals, until, torch.zeros(r, v), seeds, step, temp, live,
                            out, *lp, source=source, chunk=256)
        res.append((xp, out, step, c, lp))
    (xa, oa, sa, ca, la), (xb, ob, sb, cb, lb) = res
    written = temp > 0 if source == "raw" else torch.ones(r, dtype=torch.bool)   # raw: greedy rows unwritten
    assert torch.equal(xa[written], xb[written])
    assert torch.equal(oa, ob) and torch.equal(sa, sb) and torch.equal(ca, cb)
    assert int((cb - counts).sum()) == int(live.sum())
    torch.testing.assert_close(la[0], lb[0], rtol=0, atol=2e-6)
    assert torch.equal(la[1], lb[1]) and torch.equal(la[2], lb[2])
    torch.testing.assert_close(la[3], lb[3], rtol=0, atol=2e-6)


def test_logprobs_into_equals_tritons_with_ties_and_zero_width():
    src = (torch.randn(3, 1000, generator=torch.Generator().manual_seed(4)) * 2).to(torch.bfloat16)   # ties
    tok = torch.tensor([0, 500, 999])
    for w in (W, 0):
        res = []
        for m in (tri_lp, ref):
            lp = (torch.zeros(3), torch.zeros(3, dtype=torch.int32), torch.zeros(3, w, dtype=torch.int64),
                  torch.zeros(3, w))
            m.logprobs_into(src, tok, *lp, chunk=256)
            res.append(lp)
        torch.testing.assert_close(res[0][0], res[1][0], rtol=0, atol=2e-6)
        assert torch.equal(res[0][1], res[1][1]) and torch.equal(res[0][2], res[1][2])
        torch.testing.assert_close(res[0][3], res[1][3], rtol=0, atol=2e-6)


@pytest.mark.parametrize("use_slots", [False, True])
def test_apply_token_mask_equals_tritons(use_slots):
    g = torch.Generator().manual_seed(6)
    v, b = 1100, 5
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (b, ref.words(v)), generator=g, dtype=torch.int64).to(torch.int32)
    active = torch.tensor([1, 0, 1, 1, 0], dtype=torch.int32)
    slots = torch.tensor([4, 2, 0]) if use_slots else None
    logits = torch.randn(3 if use_slots else b, v, generator=g)
    got = [m.apply_token_mask(logits.clone(), bits, active, slots) for m in (tri_m, ref)]
    assert torch.equal(got[0], got[1]) and bool(torch.isinf(got[1]).any())


def test_bad_arguments_are_refused_alike():
    logits, ones = torch.zeros(4, 64), torch.ones(4)
    z32, z64 = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    for m in (tri_s, ref):
        with pytest.raises(ValueError, match="^rows_per_slot: must be an int >= 1"):
            m.sample_tokens(logits, ones, z32, ones, z64, z32, z64, rows_per_slot=0)
        with pytest.raises(ValueError, match="^rows_per_slot: a verify's draws"):
            m.sample_tokens(logits, ones[:2], z32[:2], ones[:2], z64[:2], z32[:2], z64, rows_per_slot=2)
        with pytest.raises(ValueError, match="^seed: expected a contiguous \\[4\\] tensor"):
            m.sample_tokens(logits, ones, z32, ones, torch.zeros(8, dtype=torch.int64)[::2], z32, z64)
    for m in (tri_lp, ref):
        with pytest.raises(ValueError, match="^source: "):
            m.process_draw(logits, z32.repeat(64, 1).t().contiguous(), torch.zeros(4, 64, dtype=torch.bool),
                           torch.zeros(4, 4), torch.full((4, 2), -1), torch.zeros(4, 2),
                           torch.zeros(4, 2, dtype=torch.int32), torch.zeros(4, 64), z64, z32, ones,
                           torch.ones(4, dtype=torch.bool), z64, ones, z32, torch.zeros(4, 1, dtype=torch.int64),
                           torch.zeros(4, 1), source="sorted")
        with pytest.raises(ValueError, match="^src: "):
            m.logprobs_into(logits.t(), z64, ones, z32, torch.zeros(4, 1, dtype=torch.int64), torch.zeros(4, 1))
    bits, active = torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    for m in (tri_m, ref):
        with pytest.raises(ValueError, match="^bits: "):
            m.apply_token_mask(torch.zeros(2, 64), bits[:, :1], active)
        with pytest.raises(ValueError, match="^slots: "):
            m.apply_token_mask(torch.zeros(2, 64), bits, active, torch.zeros(3, dtype=torch.long))
