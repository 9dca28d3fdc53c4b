"""model/draw.py on CPU: one draw rule for every phase. Greedy rows take torch's argmax; a
sampled draw of temperature-0 rows takes it too and advances each row's draw index; a processed
draw applies the rows' token rules (a banned argmax is never drawn), counts the drawn tokens and
returns the logits its log-probabilities are read from; the fused pass (processed, unfiltered,
log-prob rows given) draws what the unfused one draws. Draw's bad fields are refused by name."""
from __future__ import annotations

import pytest
import torch

from graphrt.model.draw import Draw, DrawRows, draw
from graphrt.model.logprobs import LogprobBuffers
from graphrt.model.processing import FOREVER, ProcessRows, ProcessState

V, B = 40, 3


def _rows(temperature=0.0, step=0):
    return DrawRows(torch.full((B,), temperature), torch.zeros(B, dtype=torch.int32), torch.ones(B),
                    torch.arange(B, dtype=torch.int64) + 11, torch.full((B,), step, dtype=torch.int32))


def _logits(seed=0):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_and_temperature_zero_draws_take_the_argmax():
    logits, out = _logits(), torch.empty(B, dtype=torch.int64)
    assert draw(logits, _rows(), Draw(), out) is None
    assert torch.equal(out, logits.argmax(-1))
    rows = _rows(step=5)
    draw(logits, rows, Draw(sampled=True), out)
    assert torch.equal(out, logits.argmax(-1)) and torch.equal(rows.step, torch.full((B,), 6, dtype=torch.int32))


def test_sampled_draws_are_reproducible_per_seed_and_step():
    logits, a, b = _logits(1), torch.empty(B, dtype=torch.int64), torch.empty(B, dtype=torch.int64)
    draw(logits, _rows(1.0, step=3), Draw(sampled=True), a)
    draw(logits, _rows(1.0, step=3), Draw(sampled=True), b)
    assert torch.equal(a, b) and ((a >= 0) & (a < V)).all()


def _state(banned: list[int]):
    st = ProcessState.allocate(B, V, "cpu", width=8)
    st.write_rows(torch.arange(B), ProcessRows.build(
        [{"params": [0.0, 0.0, 1.0, 0.0], "rules": [(t, float("-inf"), FOREVER)], "prompt": [], "output": []}
         for t in banned], V, width=8))
    return st


@pytest.mark.parametrize("filtered", [False, True])
def test_processed_draws_apply_the_rules_and_count(filtered):
    logits = _logits(2)
    best = logits.argmax(-1).tolist()
    st, out = _state(best), torch.empty(B, dtype=torch.int64)
    second = logits.scatter(1, torch.tensor(best)[:, None], float("-inf")).argmax(-1)
    src = draw(logits, _rows(), Draw(sampled=True, processed=True, filtered=filtered), out, proc=st, sel=B,
               live=torch.ones(B, dtype=torch.bool))
    assert torch.equal(out, second)                       # the banned argmax is never drawn
    assert src is logits                                  # "raw": log-probs of the model's logits
    assert torch.equal(st.counts[torch.arange(B), out], torch.ones(B, dtype=torch.int32))


def test_the_fused_pass_draws_what_the_unfused_one_draws():
    logits = _logits(3)
    lp = LogprobBuffers.allocate(steps=1, max_batch=B, width=4, device="cpu")
    unfused, fused = torch.empty(B, dtype=torch.int64), torch.empty(B, dtype=torch.int64)
    st = _state([0, 1, 2])
    draw(logits, _rows(0.7, 2), Draw(sampled=True, processed=True), unfused, proc=st, sel=B,
         live=torch.ones(B, dtype=torch.bool))
    st2 = _state([0, 1, 2])
    got = draw(logits, _rows(0.7, 2), Draw(sampled=True, processed=True), fused, proc=st2, sel=B,
               live=torch.ones(B, dtype=torch.bool), logprob_rows=lp.rows(0, B))
    assert got is None and torch.equal(fused, unfused) and torch.equal(st.counts, st2.counts)


def test_key_normalises_what_a_graph_is_captured_for():
    assert Draw(processed=True).key() == Draw(sampled=True, processed=True)
    assert Draw(sampled=True, filtered=True).key() == Draw(sampled=True)
    assert Draw(sampled=True, processed=True, filtered=True).key().filtered


@pytest.mark.parametrize("field", ["sampled", "processed", "filtered"])
def test_draw_refuses_non_bools(field):
    with pytest.raises(ValueError, match=rf"^draw.{field}: expected a bool"):
        Draw(**{field: 1})



@pytest.mark.parametrize("filtered", [False, True])
def test_processed_draws_apply_constrained_rows_masks_first(filtered):
    """mask (model/token_mask.py): an active row draws only its allowed tokens, an inactive row
    is untouched (its mask bits are not read)."""
    from graphrt.model.token_mask import TokenMask
    logits = _logits(4)
    mask = TokenMask.allocate(B, V, "cpu")
    bits = torch.zeros((2, mask.words), dtype=torch.int32)
    bits[0, 7 // 32] = 1 << (7 % 32)                       # row 1: only token 7
    bits[1, 30 // 32] = 1 << (30 % 32)                     # row 2: token 30, but not active
    mask.write([1, 2], bits, torch.tensor([1, 0], dtype=torch.int32))
    st, out = _state([V - 1] * B), torch.empty(B, dtype=torch.int64)
    ref = logits.clone()
    ref[:, V - 1] = float("-inf")
    draw(logits, _rows(), Draw(sampled=True, processed=True, filtered=filtered), out, proc=st, sel=B,
         live=torch.ones(B, dtype=torch.bool), mask=mask)
    assert out[1] == 7
    assert out[0] == ref[0].argmax() and out[2] == ref[2].argmax()
