"""Bad arguments of GPU-only benchmark tools are refused on any machine: one line naming the flag,
exit 2, before a GPU is asked for (tools/bench_eagle3_step.py --profile, tools/bench_step_parts.py
--attn-q, tools/bench_prefill_attention.py --layers, tools/profile_persistent.py --batch /
--num-warps / --prefetch / --stages / --weights)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.parametrize("tool, args, flag", [
    ("bench_eagle3_step.py", ["--profile", "chain step,nope"], "--profile"),
    ("bench_step_parts.py", ["--parts", "attention", "--attn-q", "0"], "--attn-q"),
    ("bench_step_parts.py", ["--parts", "attention", "--attn-q", "five"], "--attn-q"),
    ("bench_prefill_attention.py", ["--sweep", "--layers", "0"], "--layers"),
    ("profile_persistent.py", ["--batch", "17"], "--batch"),
    ("profile_persistent.py", ["--num-warps", "8,x"], "--num-warps"),
    ("profile_persistent.py", ["--prefetch", "-1"], "--prefetch"),
    ("profile_persistent.py", ["--stages", "4,-2"], "--stages"),
    ("profile_persistent.py", ["--programs-per-sm", "0"], "--programs-per-sm"),
    ("profile_persistent.py", ["--weights", "bf16,int3"], "--weights"),
])
def test_bad_flag_exits_2_naming_it(tool, args, flag, tmp_path):
    r = subprocess.run([sys.executable, str(TOOLS / tool), *args], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-1000:]
    assert flag in r.stderr and "Traceback" not in r.stderr
