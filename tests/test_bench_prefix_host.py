"""tools/bench_prefix_host.py and tools/compare_prefix_host.py on CPU: each case reports the cached
tokens it is meant to (the shared prefix found, nothing else), the comparison writes its table
and JSON, bad arguments exit 2 (no timing is checked: speed is the tools' to show)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
pytest.importorskip("transformers")


def _tool(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOLS / name), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cases_find_only_the_shared_prefix(tmp_path):
    r = _tool("bench_prefix_host.py", "--prefix-len", "48", "--suffix-len", "8", "--rounds", "3", "--warmup", "1",
              "--out", str(tmp_path / "out.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["case"]: row for row in json.loads((tmp_path / "out.json").read_text())["rows"]}
    assert rows["cached"]["cached_tokens"] == [48]          # three full pages of 16
    assert all(rows[c]["cached_tokens"] == [0] for c in ("new", "cold", "cold_nocache"))
    assert all(row["first_us"] > 0 for row in rows.values())


def test_compare_against_head_writes_both_files(tmp_path):
    r = _tool("compare_prefix_host.py", "--baseline", "HEAD", "--runs", "1", "--rounds", "2", "--shapes", "32+4",
              "--out-dir", str(tmp_path), "--name", "cmp")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "cmp.json").read_text())
    assert len(res["table"]) == 4 and len(res["runs"]) == 2
    assert all(row["baseline_us"] > 0 and row["current_us"] > 0 for row in res["table"])
    assert "| 32+4 | cached | [32] |" in (tmp_path / "cmp.md").read_text()


@pytest.mark.parametrize("name,bad", [("bench_prefix_host.py", ["--rounds", "0"]),
                                      ("bench_prefix_host.py", ["--cases", "new,warm"]),
                                      ("compare_prefix_host.py", ["--baseline", "HEAD", "--shapes", "4096"]),
                                      ("compare_prefix_host.py", ["--baseline", "HEAD", "--runs", "0"])])
def test_bad_arguments_exit_2(name, bad):
    r = _tool(name, *bad, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
