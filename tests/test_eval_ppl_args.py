"""tools/eval_ppl.py --quantization: fp8 / int4 accepted, anything else an argparse error (exit 2)
naming the flag."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "eval_ppl.py"


def test_bad_quantization_exits_2():
    out = subprocess.run([sys.executable, str(TOOL), "ckpt", "--quantization", "int3"], capture_output=True, text=True)
    assert out.returncode == 2 and "--quantization: invalid choice: 'int3'" in out.stderr


def test_int4_is_accepted(tmp_path):
    # a directory without config.json: the flag parses, the checkpoint is what is refused
    out = subprocess.run([sys.executable, str(TOOL), str(tmp_path), "--quantization", "int4", "--device", "cpu"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "not a checkpoint directory" in out.stderr
