"""engine/speculation.py's per-block bookkeeping on the host: a speculative block's emitted tokens
per column in round order, its log-probs in the same order (a plain block's layout), and the
proposal / acceptance counts of its live rows only, against a plain Python walk over the same
tensors."""
from __future__ import annotations

import types

import torch

from graphrt.engine.speculation import column_logprobs, observe, spec_columns


def _block(seed: int, r=4, cols=5, q=4):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1000, (r, cols, q), generator=g)
    emitted = torch.randint(0, q + 1, (r, cols), generator=g).to(torch.int32)
    proposed = torch.randint(0, q, (r, cols), generator=g).to(torch.int32)
    req = lambda s: types.SimpleNamespace(finish_reason=None, epoch=0, slot=s)  # noqa: E731
    rows = [(req(10 + c), c, 0, 1) for c in range(cols) if c != 2]            # column 2: not live
    return types.SimpleNamespace(tokens=tokens, emitted=emitted, proposed=proposed, rows=rows,
                                 spec_k=q - 1, kind="spec", logprobs=None)


def test_columns_and_counts_match_a_python_walk():
    for seed in range(5):
        b = _block(seed)
        counts = {"proposed": 0, "accepted": 0, "rounds": 0, "emitted": 0}
        cols = spec_columns(b, counts)
        t, e, p = b.tokens.tolist(), b.emitted.tolist(), b.proposed.tolist()
        assert cols == [[x for r in range(len(e)) for x in t[r][c][:e[r][c]]] for c in range(len(e[0]))]
        live = [c for _, c, _, _ in b.rows]
        assert counts == {"proposed": sum(p[r][c] for r in range(len(e)) for c in live),
                          "accepted": sum(max(e[r][c] - 1, 0) for r in range(len(e)) for c in live),
                          "rounds": sum(e[r][c] > 0 for r in range(len(e)) for c in live),
                          "emitted": sum(e[r][c] for r in range(len(e)) for c in live),
                          "by_k": {b.spec_k: 1}}


def test_policy_sees_each_live_slot_counts():
    b = _block(7)
    seen = {}

    class Policy:
        def observe(self, slot, *, proposed, accepted, rounds, k):
            seen[slot] = (proposed, accepted, rounds, k)
    observe(Policy(), b)
    e, p = b.emitted.tolist(), b.proposed.tolist()
    assert seen == {10 + c: (sum(p[r][c] for r in range(4)), sum(max(e[r][c] - 1, 0) for r in range(4)),
                             sum(e[r][c] > 0 for r in range(4)), b.spec_k) for c in (0, 1, 3, 4)}


def test_logprobs_follow_each_columns_tokens_in_a_plain_blocks_layout():
    """column_logprobs: [R, cols, Q(, N)] -> [R * Q, cols(, N)], column c's entries of its emitted
    tokens first, rounds in order (what logprob_dicts reads for the column's tokens); spec_columns
    rewrites block.logprobs so."""
    for seed in range(3):
        b = _block(seed)
        r, cols, q = b.tokens.shape
        g = torch.Generator().manual_seed(100 + seed)
        lp = (torch.randn(r, cols, q, generator=g), torch.randint(1, 50, (r, cols, q), generator=g).to(torch.int32),
              torch.randint(0, 1000, (r, cols, q, 3), generator=g), torch.randn(r, cols, q, 3, generator=g))
        tok, rank, ids, vals = column_logprobs(lp, b.emitted)
        assert tok.shape == (r * q, cols) and ids.shape == (r * q, cols, 3)
        e = b.emitted.tolist()
        for c in range(cols):
            at = [(i, j) for i in range(r) for j in range(e[i][c])]
            n = len(at)
            assert tok[:n, c].tolist() == [float(lp[0][i, c, j]) for i, j in at]
            assert rank[:n, c].tolist() == [int(lp[1][i, c, j]) for i, j in at]
            assert ids[:n, c].tolist() == [lp[2][i, c, j].tolist() for i, j in at]
            assert torch.equal(vals[:n, c], torch.stack([lp[3][i, c, j] for i, j in at]) if at else vals[:0, c])
        b.logprobs = lp
        spec_columns(b, {"proposed": 0, "accepted": 0, "rounds": 0, "emitted": 0})
        assert all(torch.equal(x, y) for x, y in zip(b.logprobs, (tok, rank, ids, vals)))
