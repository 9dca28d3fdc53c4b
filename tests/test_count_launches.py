"""tools/count_launches.py: the launches a speculative round holds (the graph's nodes on a GPU),
counted on CPU. A guard on their number: the round's bookkeeping around the verify forward is a
handful of launches (round 17: 71 -> 37 per n-gram round of the 2-layer tiny model, of which the
model's own layers are most), and each of the one-launch kernels runs once a round."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
pytest.importorskip("transformers")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts under the Triton interpreter")
def test_round_launches_stay_few(tmp_path):
    import count_launches
    from make_checkpoint import write_checkpoint
    ckpt = str(write_checkpoint(tmp_path / "tiny", shape="tiny", dtype="float32", seed=3))
    row = count_launches.measure(ckpt, spec={"method": "ngram", "num_tokens": 4}, tokens=8, steps=1)
    per = row["by_op_per_unit"]
    assert row["units"] >= 2 and row["per"] == "round"
    for kernel in ("triton::_round_inputs_kernel", "triton::_query_layout_kernel", "triton::_accept_kernel",
                   "triton::_advance_kernel", "triton::_ngram_kernel"):
        assert per.get(kernel) == 1.0, (kernel, per)
    assert row["launches_per_unit"] <= 40, per
