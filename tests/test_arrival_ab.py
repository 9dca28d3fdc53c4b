"""tools/arrival_ab.py: medians of repeated arrival runs per source tree, bad input exits 2."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import arrival_ab  # noqa: E402


def _row(p99, ttft=400.0):
    return {"p99_over_steady_p50": p99, "gap_over_steady_gap": p99 + 0.1, "tpot_p50_ms": 1.5,
            "steady_tpot_p50_ms": 1.4, "long_ttft_ms": ttft}


def test_medians_and_ratio(tmp_path):
    for i, p in enumerate([1.3, 1.2, 2.0], 1):
        (tmp_path / f"arrival_before_{i}.json").write_text(json.dumps({"arrival": {"mixed_64": _row(p)}}))
    for i, p in enumerate([1.1, 1.2, 1.15], 1):
        (tmp_path / f"arrival_after_{i}.json").write_text(json.dumps({"arrival": {"mixed_64": _row(p, 390.0)}}))
    (tmp_path / "arrival_other_1.json").write_text("{}")                 # not a variant: ignored
    assert arrival_ab.main([str(tmp_path)]) == 0
    res = json.loads((tmp_path / "arrival_ab.json").read_text())
    assert res["before"]["p99_over_steady_p50"] == {"median": 1.3, "min": 1.2, "max": 2.0}
    assert res["after"]["runs"] == 3 and res["after"]["per_run"]["p99_over_steady_p50"] == [1.1, 1.2, 1.15]
    assert res["after_over_before"]["p99_over_steady_p50"] == pytest.approx(1.15 / 1.3)
    assert res["after_over_before"]["long_ttft_ms"] == pytest.approx(390 / 400)
    assert "| after | 3 | 1.15 (1.10-1.20) |" in (tmp_path / "arrival_ab.md").read_text()


def test_bad_folder_exits_2(tmp_path, capsys):
    for arg in (str(tmp_path / "missing"), str(tmp_path)):                # not a folder; no runs in it
        with pytest.raises(SystemExit) as e:
            arrival_ab.main([arg])
        assert e.value.code == 2
        assert "dir:" in capsys.readouterr().err
