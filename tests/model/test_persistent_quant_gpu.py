"""GPU tests of the persistent decode step inside ModelRuntime with quantized weights: random bf16
weights at the Llama-3.2-1B shape (2 layers) quantized to FP8 per channel or int4 group 128,
buckets 1 / 4 / 16, captured graphs; decode_backend="persistent" against "sequence" on the same
prompts, block after block, teacher-forced (both read the sequence's tokens). int4: both paths
compute the dequantized model in bf16, so the logits agree within a few bf16 steps. FP8: the
sequence is W8A8 (activations rounded to e4m3 per row), the persistent step W8A16, so the logits
differ by the activations' rounding (printed, bounded at 10% of the row's largest logit) and
the greedy tokens agree wherever the sequence's top-2 margin exceeds twice the difference (the
count printed). Counters back at zero, no device flag.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/model/test_persistent_quant_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from graphrt.model import LlamaDecoder
from graphrt.model.fp8_weights import quantize_weights
from graphrt.model.int4_weights import quantize_weights_int4
from _persistent_models import assert_logits_close, random_model, runtime, teacher_forced

pytestmark = pytest.mark.gpu


def _model(kind):
    m = random_model("1b", layers=2)
    w = quantize_weights(m.weights, m.spec, "channel") if kind == "fp8" else \
        quantize_weights_int4(m.weights, group_size=128)
    return LlamaDecoder(m.spec, w)


@pytest.mark.parametrize("kind,rows", [("fp8", 1), ("fp8", 16), ("int4", 1), ("int4", 16)])
def test_persistent_matches_the_sequence(kind, rows):
    model = _model(kind)
    seq, per = runtime(model, "sequence", 1), runtime(model, "persistent", 1)
    assert per.persistent.get(rows) is not None, per.persistent.skipped
    worst, checked = 0.0, 0
    for block, a, b, la, lb in teacher_forced(seq, per, rows, 32):
        diff = (la - lb).abs().max(dim=-1).values
        worst = max(worst, float(diff.max()))
        if kind == "fp8":
            assert bool((diff <= 0.1 * la.abs().amax(dim=-1)).all()), f"block {block}: {diff.tolist()}"
        else:
            assert_logits_close(lb, la)
        top2 = la.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * diff + 1e-3
        checked += int(clear.sum())
        assert torch.equal(a[0][clear], b[0][clear]), f"block {block}: tokens differ at a clear margin"
    per.check_device_errors()
    assert all(int(p.counters.abs().sum()) == 0 for p in per.persistent.table.values())
    print(f"{kind} rows {rows}: max |logit diff| {worst:.4f}, {checked} of {32 * rows} tokens at a clear margin, "
          f"equal")
