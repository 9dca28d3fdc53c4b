"""worker/local.py: a single-GPU (here: CPU) LLM runs through the LocalExecutor and imports
nothing from graphrt/parallel/ (checked in a fresh interpreter); the local and the
tensor-parallel executors both implement every call of the Executor protocol, and every call
that changes device state is one the driver broadcasts."""
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


def test_both_executors_implement_the_protocol_and_the_driver_broadcasts_their_calls():
    from graphrt.parallel.driver import CALLS, TPDriver
    from graphrt.parallel.executor import TPExecutor
    from graphrt.worker.local import LocalExecutor
    from graphrt.worker.protocol import Executor
    calls = [n for n in dir(Executor) if not n.startswith("_") and callable(getattr(Executor, n))]
    assert set(calls) == {"capture", "stage_chunk", "prefill", "run", "write_token_mask",
                          "prefill_graphed", "measure_costs", "check_device_errors"}
    for cls in (LocalExecutor, TPExecutor):
        assert all(callable(getattr(cls, n, None)) for n in calls), cls
        assert isinstance(getattr(cls, "caps"), property) and isinstance(getattr(cls, "error_flag"), property)
    assert {"capture", "prefill", "run"} <= set(CALLS)
    assert not hasattr(LocalExecutor, "apply") and not hasattr(TPExecutor, "apply")   # changes ride the launches
    assert "__getattr__" not in vars(TPDriver) and "__getattr__" not in vars(TPExecutor)
