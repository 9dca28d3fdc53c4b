"""tools/trace_arrival.py --workload reuse on CPU (tiny checkpoint): the repeated request finds the
cached prefix, and its traced steps show the prefill and the first token's step (no timing is
checked: the split is the tool's to show on a GPU)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
pytest.importorskip("transformers")      # the tiny checkpoint's tokenizer (tools/make_checkpoint.py)


def test_reuse_workload_traces_the_repeated_request(tmp_path):
    out = tmp_path / "reuse.json"
    r = subprocess.run([sys.executable, str(TOOLS / "trace_arrival.py"), "--make", "tiny", "--device", "cpu",
                        "--workload", "reuse", "--long-len", "16", "--streams", "0", "--max-model-len", "128",
                        "--chunk", "64", "--max-batch", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())["overlapped"]
    assert res["cached_tokens"] == 16                      # the 16-token prefix: one full page, reused
    assert res["long_ttft_ms"] > 0 and res["steps"]
    steps = res["steps"]
    first = next((i for i, s in enumerate(steps) if s["deltas"]), len(steps) - 1)   # its first token's step
    assert any(s.get("runtime.prefill", 0) > 0 and s.get("engine._prefill", 0) > 0 for s in steps[:first + 1])
    assert "## overlapped" in r.stdout


def test_bad_workload_exits_2(tmp_path):
    r = subprocess.run([sys.executable, str(TOOLS / "trace_arrival.py"), "--workload", "nope"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "--workload" in r.stderr
