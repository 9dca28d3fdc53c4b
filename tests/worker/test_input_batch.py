"""worker/input_batch.py: the runtime's slot state (model/slots.py) equals a dense reference
after random admissions, growths, deactivations, history writes, proposal caps and device
advances (a cap rewrites its one cell, never the row's advanced seq_len / step); only what
changed is staged; the slot changes a launch carries (worker/changes.py), recorded, stage the same."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from graphrt.worker.input_batch import InputBatch
from graphrt.model.slots import SlotState, SlotUpdate


def test_device_rows_follow_random_updates():
    rng = random.Random(0)
    b, w, k = 6, 8, 3
    batch = InputBatch(max_batch=b, max_pages_per_seq=w, history_width=16)
    slots = SlotState.allocate(b, w, torch.device("cpu"), history_width=16)
    table = np.full((b, w), -1, dtype=np.int64)      # reference, independent of the batch
    hist = np.zeros((b, 16), dtype=np.int64)
    seq = [0] * b
    step = [0] * b
    adv = [0] * b
    samp = {}
    used = [0] * b
    cur = [0] * b                                     # each slot's current token
    cap = [0] * b                                     # each slot's SPEC_K
    for it in range(200):
        op = rng.random()
        slot = rng.randrange(b)
        if op < 0.3:
            pages = [rng.randrange(1, 100) for _ in range(rng.randint(1, 3))]
            pages = pages[:w - used[slot]]
            batch.set_pages(slot, used[slot], pages)
            table[slot, used[slot]:used[slot] + len(pages)] = pages
            used[slot] += len(pages)
        elif op < 0.5:
            s0, st = rng.randint(1, 50), rng.randint(0, 9)
            row = dict(temperature=rng.random(), top_k=rng.randint(0, 5), top_p=rng.random() * 0.9 + 0.1,
                       seed=rng.randrange(2**62))
            batch.activate(slot, seq_len=s0, step=st, limit=s0 + 9, spec_k=3, **row)
            toks = [rng.randrange(1000) for _ in range(rng.randint(1, 16))]
            batch.set_history(slot, toks)
            hist[slot, :len(toks)] = toks
            if rng.random() < 0.5:                      # a row joining from its last context token
                batch.set_token(slot, toks[-1])
                cur[slot] = toks[-1]
            seq[slot], step[slot], adv[slot], samp[slot], cap[slot] = s0, st, k, row, 3
            samp[slot]["limit"] = s0 + 9
            if rng.random() < 0.3:                      # capped in the same flush as its activation
                cap[slot] = rng.randint(0, 3)
                batch.set_spec_k(slot, cap[slot])
        elif op < 0.6:
            batch.deactivate(slot)
            seq[slot] = adv[slot] = 0
            samp.pop(slot, None)
        elif op < 0.65:
            batch.clear_pages(slot)
            used[slot] = 0
        elif op < 0.72 and seq[slot] > 0:                # a constrained row's proposal cap, after
            cap[slot] = rng.randint(0, 3)                 # the device advanced it: only that cell
            batch.set_spec_k(slot, cap[slot])
        else:
            batch.flush(slots.apply)
            n = rng.randint(1, b)
            live = slots.seq_lens[:n] > 0               # what a block does on the device
            slots.seq_lens[:n] += live.int() * k
            slots.step[:n] += k
            for r in range(n):
                seq[r] += adv[r]
                step[r] += k
            assert not batch.dirty
        if it % 10 == 0:
            batch.flush(slots.apply)
            live = [r for r in range(b) if seq[r] > 0]
            assert slots.seq_lens.tolist() == seq and slots.tokens.tolist() == cur
            for r in live:
                assert slots.block_table[r, :used[r]].tolist() == table[r, :used[r]].tolist()
                assert slots.history[r].tolist() == hist[r].tolist()
                assert slots.limit[r].item() == samp[r]["limit"] and slots.spec_k[r].item() == cap[r]
                s = slots.sampling(b)
                assert s.step[r].item() == step[r] and s.top_k[r].item() == samp[r]["top_k"]
                assert s.seed[r].item() == samp[r]["seed"]
                assert abs(s.temperature[r].item() - samp[r]["temperature"]) < 1e-6
                assert abs(s.top_p[r].item() - samp[r]["top_p"]) < 1e-6


def test_flush_without_changes_does_nothing_and_pages_past_the_row_are_refused():
    batch = InputBatch(max_batch=2, max_pages_per_seq=3)
    calls = []
    batch.flush(calls.append)
    assert calls == []
    try:
        batch.set_pages(0, 2, [5, 6])
    except ValueError as e:
        assert "max_pages_per_seq=3" in str(e)
    else:
        raise AssertionError("expected a ValueError")


def test_recorded_slot_changes_stage_what_the_calls_stage():
    """record(changes) (worker/changes.py: what a launch carries) leaves the slots as the
    InputBatch calls it stands for; a processing-row reset goes out as its own update first."""
    from graphrt.model.processing import ProcessRows
    from graphrt.worker.changes import Activate, Deactivate, SetHistory, SetPages, SetProcessing, SetToken
    b, w, v = 4, 5, 30
    rows = ProcessRows.build([{"params": [0.5, 0.0, 1.0, 0.0], "rules": [(2, 1.0, 10)], "prompt": [1],
                               "output": [9, 9]}], v)
    via_calls, via_changes = InputBatch(max_batch=b, max_pages_per_seq=w, history_width=8), \
        InputBatch(max_batch=b, max_pages_per_seq=w, history_width=8)
    states = [SlotState.allocate(b, w, torch.device("cpu"), history_width=8, vocab=v) for _ in range(2)]
    for st in states:
        st.proc.counts[2, 4] = 5
    via_calls.set_pages(1, 0, [7, 8])
    via_calls.set_pages(1, 2, [9])
    via_calls.set_pages(3, 0, [4])
    via_calls.activate(1, seq_len=6, step=2, temperature=0.7, top_k=3, top_p=0.9, seed=11, limit=20, spec_k=2)
    via_calls.activate(3, seq_len=2, step=0, temperature=0.0, top_k=0, top_p=1.0, seed=5)
    via_calls.set_history(1, [1, 2, 3, 4, 5])
    via_calls.set_token(2, 17)
    via_calls.deactivate(3)
    via_calls.clear_pages(3)
    via_calls.flush(states[0].apply)
    states[0].apply(SlotUpdate.processing_rows([2], rows))
    updates = []
    via_changes.record((SetPages(1, 0, (7, 8)), SetPages(1, 2, (9,)), SetPages(3, 0, (4,)),
                        Activate(1, 6, 2, 0.7, 3, 0.9, 11, 20, 2), Activate(3, 2, 0, 0.0, 0, 1.0, 5),
                        SetHistory(1, [1, 2, 3, 4, 5]), SetToken(2, 17), Deactivate(3, free=True),
                        SetProcessing(2, rows)))
    assert via_changes.dirty
    via_changes.flush(lambda u: (updates.append(u), states[1].apply(u)))
    assert len(updates) == 2 and updates[0].proc_slots == (2,)   # the processing reset first
    assert not via_changes.dirty
    a, c = states
    for name in ("block_table", "ints", "floats", "seed", "tokens", "history"):
        assert torch.equal(getattr(a, name), getattr(c, name)), name
    assert torch.equal(a.proc.counts, c.proc.counts) and int(c.proc.counts[2, 4]) == 0 and int(c.proc.counts[2, 9]) == 2
    assert np.array_equal(via_calls.block_table_host, via_changes.block_table_host)
    assert via_changes.block_table_host[3].tolist() == [-1] * w         # freed: the mirror's row cleared
    with pytest.raises(ValueError, match=r"^changes: tuple is not a slot change"):
        via_changes.record([(1, 0, [2])])
