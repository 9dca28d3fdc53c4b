"""tools/bench_host_checks.py: a smoke run against HEAD writes its table and JSON; bad counts exit 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_host_checks.py"


def test_smoke_against_head_writes_both_files(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), "--baseline", "HEAD", "--calls", "2", "--repeats", "1",
                        "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "bench_host_checks.json").read_text())
    assert len(res["rows"]) == 3 and all(row["current_us"] > 0 and row["baseline_us"] > 0 for row in res["rows"])
    assert "| case |" in (tmp_path / "bench_host_checks.md").read_text()


@pytest.mark.parametrize("bad", [["--calls", "0"], ["--repeats", "0"]])
def test_bad_counts_exit_2(tmp_path, bad):
    r = subprocess.run([sys.executable, str(TOOL), "--baseline", "HEAD", *bad, "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be >= 1" in r.stderr
