"""The end of a decode step in one launch (kernels/step_advance.py) against the torch ops it
replaces: current tokens, token history at index seq_len (clipped to the last column), lengths."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels import reference as ref
from graphrt.kernels.step_advance import step_advance


def _reference(out, tokens, seq, history):
    """The torch kernel set's step_advance (kernels/reference.py) on copies."""
    tokens, seq = tokens.clone(), seq.clone()
    history = None if history is None else history.clone()
    ref.step_advance(out, tokens, seq, history)
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


def test_step_advance_names_the_bad_field():
    ok = dict(out=torch.zeros(3, dtype=torch.int64), tokens=torch.zeros(3, dtype=torch.int64),
              seq_lens=torch.zeros(3, dtype=torch.int32), history=torch.zeros((3, 4), dtype=torch.int32))
    step_advance(**ok)
    for name, bad in (("out", torch.zeros(3, dtype=torch.int32)), ("tokens", torch.zeros(4, dtype=torch.int64)),
                      ("seq_lens", torch.zeros(3, dtype=torch.int64)),
                      ("history", torch.zeros((3, 4), dtype=torch.int64))):
        with pytest.raises(ValueError, match=name):
            step_advance(**(ok | {name: bad}))
