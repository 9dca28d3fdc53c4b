"""GPU tests of the persistent decode step inside ModelRuntime (graphrt/model/persistent.py):
random bf16 weights at the Llama-3.2-1B shape (2 layers), buckets 1 / 4 / 16, captured graphs;
decode_backend="persistent" against "sequence" on the same prompts, block after block with
changing lengths (teacher-forced: both read the sequence's tokens): logits within a few bf16
steps, greedy tokens equal wherever the top-2 margin exceeds the logits' difference (the
margins printed), counters back at zero, no device flag; K = 4 steps a block runs; "auto"
measures both and prints its timings.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/model/test_persistent_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from _persistent_models import assert_logits_close, random_model, runtime as _runtime, teacher_forced

pytestmark = pytest.mark.gpu


def _model():
    return random_model("1b", layers=2)


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_persistent_matches_the_sequence(rows):
    model = _model()
    seq, per = _runtime(model, "sequence", 1), _runtime(model, "persistent", 1)
    assert per.persistent.get({1: 1, 3: 4, 16: 16}[rows]) is not None
    worst, checked = 0.0, 0
    for block, a, b, la, lb in teacher_forced(seq, per, rows, 64):
        diff = (la - lb).abs().max(dim=-1).values                     # [rows]
        worst = max(worst, float(diff.max()))
        top2 = la.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * diff + 1e-3
        checked += int(clear.sum())
        assert torch.equal(a[0][clear], b[0][clear]), f"block {block}: tokens differ at a clear margin"
    d = assert_logits_close(lb, la)                                # bf16 steps at the row scale
    per.check_device_errors()
    assert all(int(p.counters.abs().sum()) == 0 for p in per.persistent.table.values())
    print(f"rows {rows}: max |logit diff| {worst:.4f} (last block, first rows: {[round(x, 3) for x in d.tolist()][:4]}), "
          f"{checked} of {64 * rows} tokens at a clear margin, equal")


def test_k4_blocks_and_auto():
    model = _model()
    per = _runtime(model, "persistent", 4)
    table = torch.arange(4 * 128, dtype=torch.int32).view(4, 128)
    per.prefill([torch.arange(n) % 1000 for n in (5, 300, 900, 17)], table)
    lens = torch.tensor([5, 300, 900, 17], dtype=torch.int32)
    tok = torch.tensor([1, 2, 3, 4])
    for _ in range(32):
        out = per.decode(tok, table, lens + 1)                      # [4, 4]
        tok, lens = out[-1].cpu(), lens + 4
    per.check_device_errors()
    auto = _runtime(model, "auto", 4)
    print("auto:", auto.persistent.timings_us, "kept", sorted(auto.persistent.table))
    assert set(auto.persistent.timings_us) == {(n, w) for n in (1, 4, 16) for w in ("sequence", "persistent")}
