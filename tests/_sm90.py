"""Compile Triton kernels for sm_90 (H100 / H200) without a GPU: a script of `triton.compile` calls,
run in a subprocess without TRITON_INTERPRET (so the kernels are real JITFunctions, ptxas included),
each successful build printing a line that starts with "ok "."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compile_for_sm90(script: str, builds: int, *, timeout: int = 600, argv: list[str] = ()) -> str:
    """Run `script` (Python source, with `argv` as sys.argv[1:]) as above; it must exit 0 and print
    exactly `builds` "ok " lines; returns its stdout. Skips where Triton has no NVIDIA backend."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.count("ok ") == builds, run.stdout
    return run.stdout
