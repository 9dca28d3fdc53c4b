"""tools/bench_prefix.py on CPU (a tiny random checkpoint, interpreted kernels): the shared-prefix
and chat rows under speculation (--speculative, here n-gram) find the shared prefix with the cache
on and nothing with it off, and record acceptance per row; a bad --speculative exits 2. (No
timing is checked: speed is the tool's to show, on a GPU.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
pytest.importorskip("transformers")


def _tool(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(TOOLS / "bench_prefix.py"), *args], capture_output=True, text=True,
                          timeout=900, env=env)


def test_speculative_rows_record_acceptance_and_cached_tokens(tmp_path):
    r = _tool("--make", "tiny", "--device", "cpu", "--prefix-len", "24", "--suffix-len", "4", "--turns", "2",
              "--repeats", "2", "--max-model-len", "128", "--answer-tokens", "8", "--workloads", "prefix,chat",
              "--speculative", '{"method": "ngram", "num_tokens": 3}', "--out-dir", str(tmp_path), "--name", "b")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "b.json").read_text())
    on, off = res["shared_prefix"]["on"], res["shared_prefix"]["off"]
    assert on["cached_tokens"][0] == 0 and min(on["cached_tokens"][1:]) == 16 and set(off["cached_tokens"]) == {0}
    for row in (on, off, *res["chat"].values()):
        assert row["spec"]["rounds"] > 0 and row["spec"]["tokens_per_round"] >= 1.0
    assert "| speculation | row |" in (tmp_path / "b.md").read_text()


def test_bad_speculative_exits_2():
    r = _tool("--make", "tiny", "--speculative", "[1]")
    assert r.returncode == 2 and "--speculative" in r.stderr


def test_arrival_rows_repeat_and_name_the_join_gap(tmp_path):
    """--arrival-repeats 2: every arrival row twice (ROW, ROW_run2), each with the gap of the block
    the long prompt joins in and the largest other gap."""
    r = _tool("--make", "tiny", "--device", "cpu", "--streams", "2", "--long-len", "24", "--decode-tokens", "16",
              "--steady-tokens", "2", "--max-model-len", "64", "--workloads", "arrival", "--chunk", "16",
              "--arrival-repeats", "2", "--out-dir", str(tmp_path), "--name", "a")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "a.json").read_text())["arrival"]
    assert set(rows) == {f"{k}{s}" for k in ("paced_1_cap_16", "chunk_16", "chunk_None") for s in ("", "_run2")}
    for row in rows.values():
        assert row["join_gap_ms"] > 0 and row["join_gap_ms"] <= row["largest_gap_ms"]
    assert "| join gap ms |" in (tmp_path / "a.md").read_text()


def test_bad_arrival_repeats_exits_2():
    r = _tool("--make", "tiny", "--arrival-repeats", "0")
    assert r.returncode == 2 and "--arrival-repeats" in r.stderr
