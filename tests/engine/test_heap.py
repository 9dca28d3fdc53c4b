"""LLM() leaves its start-up objects out of the garbage collector's way (graphrt/engine/heap.py):
once it is ready, the objects alive are frozen, so a full collection inside a step walks only
what serving creates."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _checkpoints import write

ROOT = Path(__file__).resolve().parents[2]


def test_llm_freezes_the_start_up_heap(tmp_path_factory):
    path = write(tmp_path_factory, "heap", shape="tiny", dtype="float32")
    code = ("import gc, json, sys; from graphrt import LLM; before = gc.get_freeze_count(); "
            f"llm = LLM({str(path)!r}, device='cpu', max_batch=2, max_model_len=64); "
            "print(json.dumps([before, gc.get_freeze_count(), len(gc.get_objects())]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    before, frozen, walked = json.loads(out.stdout.splitlines()[-1])
    assert before == 0
    assert frozen > 50_000                     # torch's modules and graphrt's runtime, at least
    assert walked < frozen / 10                # what a full collection still walks
