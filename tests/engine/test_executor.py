"""engine/executor.py: a single-GPU (here: CPU) LLM runs through the LocalExecutor and imports
nothing from graphrt/parallel/ (checked in a fresh interpreter); the executor's calls are the
tensor-parallel driver's list."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _checkpoints import write

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "exe", arch="llama", dtype="float32", seed=3)


def test_single_process_llm_imports_nothing_from_parallel(path):
    code = f"""
import json, sys
from graphrt import LLM, SamplingParams
llm = LLM({str(path)!r}, device="cpu", backend="reference", max_batch=2, max_model_len=32)
out = llm.generate(["hi"], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)[0]
print(json.dumps({{"parallel": sorted(m for m in sys.modules if m.startswith("graphrt.parallel")),
                   "executor": type(llm.runtime).__name__, "tokens": len(out.token_ids)}}))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=600, cwd=str(ROOT))
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"parallel": [], "executor": "LocalExecutor", "tokens": 3}


def test_the_driver_forwards_every_executor_call():
    from graphrt.engine.executor import LocalExecutor
    from graphrt.parallel.driver import CALLS, TPDriver
    calls = [n for n in ("prefill", "capture", "prefill_slots", "apply", "decode_block", "spec_block")
             if callable(getattr(LocalExecutor, n, None))]
    assert set(calls) <= set(CALLS)
    assert all(callable(getattr(TPDriver, n, None)) for n in calls)
