"""tools/count_launches.py: the launches a speculative round holds (the graph's nodes on a GPU),
counted on CPU. A guard on their number: the round's bookkeeping around the verify forward is a
handful of launches, and each of the one-launch kernels runs once a round. The 2-layer tiny model
at k = 4 (docs/results/count_launches_cpu.json, after the cuts): an n-gram round 71 -> 37 -> 28 launches; a
self-draft round 166 -> 120; an EAGLE-3 round (a random head) 217 -> 149 -> 91."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
pytest.importorskip("transformers")

ONE_EACH = ("triton::_round_inputs_kernel", "triton::_accept_kernel", "triton::_advance_kernel")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts under the Triton interpreter")
def test_round_launches_stay_few(tmp_path):
    import count_launches
    from make_checkpoint import write_checkpoint
    ckpt = str(write_checkpoint(tmp_path / "tiny", shape="tiny", dtype="float32", seed=3))
    rows = {
        "ngram": ({"method": "ngram", "num_tokens": 4}, ("triton::_ngram_kernel", "triton::_query_layout_kernel"), 30),
        "draft": ({"method": "draft", "model": ckpt, "num_tokens": 4}, ("triton::_draft_prep_kernel",), 124),
        "eagle3": ({"method": "eagle3", "model": str(count_launches.tiny_head(Path(ckpt), tmp_path / "head")),
                    "num_tokens": 4}, ("triton::_round_prep_kernel",), 96),
    }
    for name, (spec, once, most) in rows.items():
        row = count_launches.measure(ckpt, spec=spec, tokens=8, steps=1)
        per = row["by_op_per_unit"]
        assert row["units"] >= 2 and row["per"] == "round", name
        for kernel in ONE_EACH + once:
            assert per.get(kernel) == 1.0, (name, kernel, per)
        assert row["launches_per_unit"] <= most, (name, per)
