"""engine/speculation.py's per-block bookkeeping on the host: a speculative block's emitted tokens
per column in round order, and the proposal / acceptance counts of its live rows only, against a
plain Python walk over the same tensors."""
from __future__ import annotations

import types

import torch

from graphrt.engine.speculation import observe, spec_columns


def _block(seed: int, r=4, cols=5, q=4):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1000, (r, cols, q), generator=g)
    emitted = torch.randint(0, q + 1, (r, cols), generator=g).to(torch.int32)
    proposed = torch.randint(0, q, (r, cols), generator=g).to(torch.int32)
    req = lambda s: types.SimpleNamespace(finish_reason=None, epoch=0, slot=s)  # noqa: E731
    rows = [(req(10 + c), c, 0, 1) for c in range(cols) if c != 2]            # column 2: not live
    return types.SimpleNamespace(tokens=tokens, emitted=emitted, proposed=proposed, rows=rows,
                                 spec_k=q - 1, kind="spec")


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
