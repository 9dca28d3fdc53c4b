"""sample_tokens(rows_per_slot=Q): a verify's S * Q rows read their slot's sampling row at draw
index step + j, and draw exactly what the same call over rows expanded to S * Q draws (greedy,
sampled, top-k / top-p); bad rows_per_slot is refused naming the field."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.sample import sample_tokens


@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize("s, q", [(1, 2), (3, 5), (5, 4)])
def test_rows_per_slot_equals_expanded_rows(s, q, filtered):
    g = torch.Generator().manual_seed(s * 7 + q)
    v = 300
    logits = torch.randn(s * q, v, generator=g) * 3
    temperature = torch.tensor([0.0, 0.7, 1.3, 1.0, 0.5][:s], dtype=torch.float32)
    top_k = torch.tensor([0, 5, 40, 0, 2][:s], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.8, 1.0][:s], dtype=torch.float32)
    seed = torch.randint(0, 2 ** 40, (s,), generator=g, dtype=torch.int64)
    step = torch.randint(0, 1000, (s,), generator=g, dtype=torch.int32)
    if not filtered:
        top_k, top_p = torch.zeros_like(top_k), torch.ones_like(top_p)

    def rows(t):
        return t[:, None].expand(s, q).contiguous().view(s * q)

    draw = (step[:, None] + torch.arange(q, dtype=torch.int32)[None, :]).reshape(s * q)
    want = torch.empty(s * q, dtype=torch.int64)
    sample_tokens(logits, rows(temperature), rows(top_k), rows(top_p), rows(seed), draw.clone(), want,
                  advance=False, filtered=filtered)
    got = torch.empty(s * q, dtype=torch.int64)
    before = step.clone()
    sample_tokens(logits, temperature, top_k, top_p, seed, step, got, advance=False, filtered=filtered,
                  rows_per_slot=q)
    assert torch.equal(got, want) and torch.equal(step, before)
    assert torch.equal(got[:q], logits[:q].argmax(-1))       # slot 0 is greedy


def test_rows_per_slot_refused():
    logits = torch.randn(6, 10)
    one = dict(temperature=torch.zeros(3), top_k=torch.zeros(3, dtype=torch.int32), top_p=torch.ones(3),
               seed=torch.zeros(3, dtype=torch.int64), step=torch.zeros(3, dtype=torch.int32),
               out=torch.empty(6, dtype=torch.int64))
    sample_tokens(logits, **one, advance=False, rows_per_slot=2)
    for bad, match in ((0, "rows_per_slot"), (4, "rows_per_slot"), (True, "rows_per_slot")):
        with pytest.raises(ValueError, match=match):
            sample_tokens(logits, **one, advance=False, rows_per_slot=bad)
    with pytest.raises(ValueError, match="rows_per_slot"):
        sample_tokens(logits, **one, rows_per_slot=2)                  # advance with Q > 1
    with pytest.raises(ValueError, match="seed"):
        sample_tokens(logits, **(one | {"seed": torch.zeros(6, dtype=torch.int64)}), advance=False, rows_per_slot=2)
