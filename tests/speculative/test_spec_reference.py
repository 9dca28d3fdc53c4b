"""speculative/reference.py (the torch set's speculative kernels) against the Triton kernels, run by
the interpreter on the same inputs, element for element: n-gram lookup (repeats, no match, short
and empty slots, a row longer than its buffer), a round's inputs (capped counts, idle slots, full),
acceptance (greedy, seeded sampling, top-k / top-p: the same draws) and the advance (accepted
prefixes, limits, empty slots, the current token), a draft round's inputs; speculative/ops.py
picks the set by name; both refuse the same bad arguments."""
from __future__ import annotations

import pytest
import torch

from graphrt.speculative import accept as tri_acc, draft_prep as tri_dp, ngram as tri_ng, prologue as tri_pr
from graphrt.speculative import reference as ref
from graphrt.speculative.ops import spec_ops


def test_ngram_propose_equals_tritons():
    g = torch.Generator().manual_seed(0)
    s, w, k = 7, 40, 4
    tokens = torch.randint(0, 5, (s, w), generator=g, dtype=torch.int32)   # a small alphabet: many matches
    tokens[1] = torch.arange(w, dtype=torch.int32)                         # no repeat: no match
    lens = torch.tensor([40, 30, 3, 1, 0, 55, 17], dtype=torch.int32)      # 55: past the buffer
    for min_n, max_n in ((1, 4), (2, 3), (3, 3)):
        res = []
        for m in (tri_ng, ref):
            out, count = torch.full((s, k), -7, dtype=torch.int64), torch.full((s,), -7, dtype=torch.int32)
            m.ngram_propose(tokens, lens, out, count, min_n=min_n, max_n=max_n)
            res.append((out, count))
        assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
        for r in range(s):                                  # and the plain-Python rule
            n = min(int(lens[r]), w)
            want = tri_ng.ngram_propose_reference(tokens[r, :n].tolist(), k, min_n, max_n)
            assert res[1][0][r, :int(res[1][1][r])].tolist() == want


@pytest.mark.parametrize("full", [False, True])
def test_round_inputs_equal_tritons(full):
    g = torch.Generator().manual_seed(1)
    b, w, k = 6, 20, 3
    history = torch.randint(0, 100, (b, w), generator=g, dtype=torch.int32)
    num = torch.tensor([5, 0, 20, 7, 1, 3], dtype=torch.int32)
    limit = torch.tensor([10, 10, 20, 7, 9, 30], dtype=torch.int32)       # idle: empty, full, at limit
    cap = torch.tensor([3, 3, 2, 1, 3, 0], dtype=torch.int32)
    proposals = torch.randint(0, 100, (b, k), generator=g)
    res = []
    for m in (tri_pr, ref):
        count, proposed = torch.tensor([3, 1, 2, 3, 0, 2], dtype=torch.int32), torch.full((b,), -5, dtype=torch.int32)
        toks, cl = m.round_inputs(history, num, limit, cap, proposals, count, proposed, full=full)
        res.append((toks, cl, count, proposed))
    for a, x in zip(*res):
        assert a.dtype == x.dtype and torch.equal(a, x)


def _verify_rows(b: int, q: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((b, q, v), generator=g) * 2
    logits[1, 1, :] = logits[1, 1].max()                    # an exact tie
    target = logits.argmax(-1)
    props = torch.randint(0, v, (b, q - 1), generator=g)
    props[0] = target[0, :q - 1]                            # all accepted (greedy rows)
    props[2, :1] = target[2, :1]
    props[3] = target[3, :q - 1]                            # count 1: one accepted, then the bonus
    count = torch.tensor([q - 1, q - 1, q - 1, 1, q - 1, q - 1][:b], dtype=torch.int32)
    temp = torch.tensor([0.0, 0.0, 0.8, 0.0, 1.2, 0.7][:b])
    seeds = torch.randint(0, 2 ** 40, (b,), generator=g)
    step = torch.randint(0, 50, (b,), generator=g, dtype=torch.int32)
    return logits, props, count, temp, seeds, step


@pytest.mark.parametrize("filtered", [False, True])
def test_judge_and_advance_equal_tritons(filtered):
    b, q, v, w = 6, 4, 300, 16
    logits, props, count, temp, seeds, step = _verify_rows(b, q, v, 2)
    kept = dict(top_k=torch.tensor([0, 0, 20, 0, 5, 0], dtype=torch.int32),
                top_p=torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0, 0.5])) if filtered else {}
    num = torch.tensor([5, 5, 5, 5, 14, 0], dtype=torch.int32)             # rows 3, 4: limits clip; 5: empty
    limit = torch.tensor([15, 15, 15, 6, 16, 15], dtype=torch.int32)
    g = torch.Generator().manual_seed(3)
    buf0 = torch.randint(0, v, (b, w), generator=g, dtype=torch.int32)
    res = []
    for m in (tri_acc, ref):
        acc, fb = torch.full((b, q), -3, dtype=torch.int32), torch.full((b, q), -3, dtype=torch.int64)
        m.judge(logits.contiguous(), props, count, temp, seeds, step, acc, fb, **kept)
        buf, n, st = buf0.clone(), num.clone(), step.clone()
        out, emitted = torch.full((b, q), -9, dtype=torch.int64), torch.full((b,), -9, dtype=torch.int32)
        cur = torch.full((b,), -4, dtype=torch.int64)
        m.advance(acc, fb, props, buf, n, limit, st, out, emitted, current=cur)
        res.append((acc, fb, buf, n, st, out, emitted, cur))
    for a, x in zip(*res):
        assert torch.equal(a, x)
    acc, fb, _, _, _, _, emitted, cur = res[1]
    assert int(emitted[0]) == q and int(emitted[3]) == 1 and int(emitted[4]) <= 2
    assert int(emitted[5]) == 0 and int(cur[5]) == -4                     # an empty slot: untouched
    assert torch.equal(fb[temp == 0], logits.argmax(-1)[temp == 0])


def test_draft_prep_equals_tritons():
    g = torch.Generator().manual_seed(4)
    b, w = 5, 12
    history = torch.randint(0, 1000, (b, w), generator=g, dtype=torch.int32)
    num = torch.tensor([0, 1, 2, 12, 6], dtype=torch.int32)
    limit = torch.tensor([5, 5, 5, 12, 5], dtype=torch.int32)
    res = []
    for m in (tri_dp, ref):
        count = torch.full((b,), -1, dtype=torch.int32)
        res.append((*m.draft_prep(history, num, limit, 3, count), count))
    for a, x in zip(*res):
        assert a.dtype == x.dtype and torch.equal(a, x)


def test_spec_ops_pick_the_set():
    assert spec_ops("torch").judge is ref.judge and spec_ops("triton").judge is tri_acc.judge
    assert spec_ops("torch") is spec_ops("torch")
    for bad in ("cuda", ["torch"], None):
        with pytest.raises(ValueError, match="^kernels: "):
            spec_ops(bad)


def test_bad_arguments_are_refused_alike():
    tokens, lens = torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    out, count = torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)
    for m in (tri_ng, ref):
        with pytest.raises(ValueError, match="^min_n, max_n: "):
            m.ngram_propose(tokens, lens, out, count, min_n=3, max_n=2)
        with pytest.raises(ValueError, match="^tokens: "):
            m.ngram_propose(tokens.long(), lens, out, count, min_n=1, max_n=2)
    for m in (tri_pr, ref):
        with pytest.raises(ValueError, match="^proposals: "):
            m.round_inputs(tokens, lens, lens, lens, out.int(), count, count.clone())
    acc, fb = torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int64)
    for m in (tri_acc, ref):
        with pytest.raises(ValueError, match="^proposals: "):
            m.judge(torch.zeros(8, 10), out[:, :2], count, torch.zeros(2), torch.zeros(2, dtype=torch.int64),
                    count, acc, fb)
        with pytest.raises(ValueError, match="^token_buf: "):
            m.advance(acc, fb, out, tokens.long(), lens, lens, lens, fb.clone(), lens.clone())
    for m in (tri_dp, ref):
        with pytest.raises(ValueError, match="^k: "):
            m.draft_prep(tokens, lens, lens, 0, count)
