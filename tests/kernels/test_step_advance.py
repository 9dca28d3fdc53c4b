"""The end of a decode step in one launch (kernels/step_advance.py) against the torch ops it
replaces: current tokens, token history at index seq_len (clipped to the last column), lengths."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels import reference as ref
from graphrt.kernels.step_advance import step_advance


def _reference(out, tokens, seq, history, limit=None):
    """The torch kernel set's step_advance (kernels/reference.py) on copies."""
    tokens, seq = tokens.clone(), seq.clone()
    history = None if history is None else history.clone()
    ref.step_advance(out, tokens, seq, history, limit)
    return tokens, seq, history


@pytest.mark.parametrize("b", [1, 5, 70])
@pytest.mark.parametrize("with_history", [False, True])
def test_step_advance_equals_the_torch_ops(b, with_history):
    g = torch.Generator().manual_seed(b)
    w = 12
    out = torch.randint(0, 9000, (b,), generator=g, dtype=torch.int64)
    tokens = torch.randint(0, 9000, (b,), generator=g, dtype=torch.int64)
    seq = torch.randint(0, w + 3, (b,), generator=g, dtype=torch.int32)   # past the last column too
    seq[0] = 0
    history = torch.randint(0, 9000, (b, w), generator=g, dtype=torch.int32) if with_history else None
    want = _reference(out, tokens, seq, history)
    step_advance(out, tokens, seq, history)
    assert torch.equal(tokens, want[0]) and torch.equal(seq, want[1])
    if with_history:
        assert torch.equal(history, want[2])


@pytest.mark.parametrize("with_history", [False, True])
def test_rows_at_their_limit_hold_their_token_and_length(with_history):
    """limit: a row holding limit[b] > 0 tokens keeps its current token, history and length (the
    next step rewrites its last K/V); limit 0 is none; empty rows are copied as without a limit."""
    b, w = 9, 12
    g = torch.Generator().manual_seed(3)
    out = torch.randint(0, 9000, (b,), generator=g, dtype=torch.int64)
    tokens = torch.randint(0, 9000, (b,), generator=g, dtype=torch.int64)
    seq = torch.tensor([0, 3, 5, 5, 7, 2, 9, 4, 6], dtype=torch.int32)
    limit = torch.tensor([4, 0, 5, 6, 7, 2, 8, 0, 9], dtype=torch.int32)
    held = torch.tensor([False, False, True, False, True, True, True, False, False])
    history = torch.randint(0, 9000, (b, w), generator=g, dtype=torch.int32) if with_history else None
    want = _reference(out, tokens, seq, history, limit)
    assert torch.equal(want[0], torch.where(held, tokens, out))
    assert torch.equal(want[1], torch.where(held | (seq == 0), seq, seq + 1))
    free = _reference(out, tokens, seq, history)                      # no limit: every live row moves
    assert torch.equal(free[1], torch.where(seq == 0, seq, seq + 1))
    t, s, h = tokens.clone(), seq.clone(), None if history is None else history.clone()
    step_advance(out, t, s, h, limit)
    assert torch.equal(t, want[0]) and torch.equal(s, want[1])
    if with_history:
        assert torch.equal(h, want[2]) and torch.equal(h[held], history[held])


def test_step_advance_names_the_bad_field():
    ok = dict(out=torch.zeros(3, dtype=torch.int64), tokens=torch.zeros(3, dtype=torch.int64),
              seq_lens=torch.zeros(3, dtype=torch.int32), history=torch.zeros((3, 4), dtype=torch.int32))
    step_advance(**ok)
    for name, bad in (("out", torch.zeros(3, dtype=torch.int32)), ("tokens", torch.zeros(4, dtype=torch.int64)),
                      ("seq_lens", torch.zeros(3, dtype=torch.int64)),
                      ("history", torch.zeros((3, 4), dtype=torch.int64)),
                      ("limit", torch.zeros(3, dtype=torch.int64))):
        with pytest.raises(ValueError, match=name):
            step_advance(**(ok | {name: bad}))
