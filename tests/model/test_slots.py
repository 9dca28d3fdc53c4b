"""model/slots.py: the slot rows' one writer. A row_update rewrites exactly one slot's row
(block table, lengths and sampling rows, seed, token history, current token), as direct tensor
writes would (the reference below), leaves every other slot alone, and keeps a device-drawn last
token on the device; a processing-rows update resets one slot's processing rows; bad updates are
refused by name."""
from __future__ import annotations

import pytest
import torch

from graphrt.model.processing import ProcessRows
from graphrt.model.slots import LIMIT, SEQ, SPEC_K, STEP, TEMPERATURE, TOP_K, TOP_P, SlotState, SlotUpdate

B, W, H, V = 4, 6, 16, 30


def _state(**kw):
    st = SlotState.allocate(B, W, torch.device("cpu"), history_width=H, **kw)
    st.ints.random_(0, 9)
    st.block_table.random_(0, 50)
    st.history.random_(0, V)
    return st


@pytest.mark.parametrize("append", [False, True])
def test_row_update_rewrites_one_row_as_direct_writes_do(append):
    st = _state()
    before = {n: t.clone() for n, t in (("bt", st.block_table), ("ints", st.ints), ("floats", st.floats),
                                          ("seed", st.seed), ("tokens", st.tokens), ("hist", st.history))}
    hist = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
    extra = torch.tensor([11]) if append else None
    st.apply(st.row_update(2, seq_len=5 if append else 4, limit=12, step=3, top_k=7, spec_k=2, temperature=0.5,
                           top_p=0.9, seed=99, block_table=torch.tensor([3, 4], dtype=torch.int32),
                           history=hist, append=extra))
    want_hist = hist.tolist() + ([11] if append else [])
    assert st.block_table[2].tolist() == [3, 4, 0, 0, 0, 0]
    assert [int(st.ints[r, 2]) for r in (SEQ, STEP, TOP_K, LIMIT, SPEC_K)] == [len(want_hist), 3, 7, 12, 2]
    assert float(st.floats[TEMPERATURE, 2]) == 0.5 and float(st.floats[TOP_P, 2]) == pytest.approx(0.9)
    assert int(st.seed[2]) == 99 and int(st.tokens[2]) == want_hist[-1]
    assert st.history[2, :len(want_hist)].tolist() == want_hist
    assert torch.equal(st.history[2, len(want_hist):], before["hist"][2, len(want_hist):])
    others = [0, 1, 3]
    for name, t in (("bt", st.block_table), ("seed", st.seed), ("tokens", st.tokens), ("hist", st.history)):
        assert torch.equal(t[others], before[name][others]), name
    assert torch.equal(st.ints[:, others], before["ints"][:, others])


def test_an_empty_row_update_clears_the_slot():
    st = _state()
    st.apply(st.row_update(1))
    assert int(st.seq_lens[1]) == 0 and int(st.limit[1]) == 0


def test_processing_rows_update_resets_one_slots_rows():
    st = _state(vocab=V)
    st.proc.counts[3, 4] = 5
    rows = ProcessRows.build([{"params": [0.5, 0.0, 1.0, 0.0], "rules": [(2, 1.0, 10)], "prompt": [1],
                               "output": [9, 9]}], V)
    st.apply(SlotUpdate.processing_rows([3], rows))
    assert int(st.proc.counts[3, 4]) == 0 and int(st.proc.counts[3, 9]) == 2 and bool(st.proc.prompt[3, 1])
    with pytest.raises(ValueError, match=r"^rows: 1 processing rows for 2 slots"):
        SlotUpdate.processing_rows([0, 1], rows)
    with pytest.raises(ValueError, match=r"^update: processing rows given, but this state keeps none"):
        _state().apply(SlotUpdate.processing_rows([3], rows))


def test_history_in_an_update_needs_a_history():
    st = SlotState.allocate(B, W, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"^update: history tokens given"):
        st.apply(st.row_update(0, seq_len=2, history=torch.tensor([1, 2], dtype=torch.int32)))
