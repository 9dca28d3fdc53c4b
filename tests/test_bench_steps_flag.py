"""--steps-per-graph of tools/bench_serve.py and tools/bench_prefix.py (benchlib.k_or_auto): "auto"
or an int >= 1; anything else is an argparse error (exit 2) naming the flag."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

from benchlib import k_or_auto  # noqa: E402


def test_k_or_auto_accepts_auto_and_positive_ints():
    assert k_or_auto("auto") == "auto" and k_or_auto("1") == 1 and k_or_auto("8") == 8


@pytest.mark.parametrize("bad", ["0", "-1", "2.5", "fast", "", "Auto"])
def test_k_or_auto_refuses_the_rest(bad):
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="expected auto or an int >= 1"):
        k_or_auto(bad)


@pytest.mark.parametrize("tool", ["bench_serve.py", "bench_prefix.py"])
def test_bad_steps_per_graph_exits_2_naming_the_flag(tool):
    out = subprocess.run([sys.executable, str(TOOLS / tool), "--steps-per-graph", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--steps-per-graph" in out.stderr, out.stderr
