"""tools/bench_prefix_host.py on CPU: each case reports the cached tokens it is meant to (the
shared prefix found, nothing else), bad arguments exit 2 (no timing is checked: speed is the
tool's to show)."""
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


@pytest.mark.parametrize("name,bad", [("bench_prefix_host.py", ["--rounds", "0"]),
                                      ("bench_prefix_host.py", ["--cases", "new,warm"])])
def test_bad_arguments_exit_2(name, bad):
    r = _tool(name, *bad, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
