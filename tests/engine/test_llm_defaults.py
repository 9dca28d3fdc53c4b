"""Defaults that work (graphrt/engine/device.py, llm.py): `LLM(path)` with no device and no
TRITON_INTERPRET in the environment runs on a CPU machine; `import graphrt` loads no kernel;
the progress bar; bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _checkpoints import write
from graphrt.engine.device import compiled_kernels_loaded, resolve_device, select_triton_mode

ROOT = Path(__file__).resolve().parents[2]
HAS_CUDA = torch.cuda.is_available()


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.mark.skipif(HAS_CUDA, reason="the CPU default: a machine without CUDA")
def test_llm_on_cpu_without_triton_interpret_in_env(tmp_path_factory):
    """A fresh process as a user starts it: no device argument, no TRITON_INTERPRET. The tokens
    equal HF transformers' greedy generate (the independent reference, in the same process)."""
    ckpt = write(tmp_path_factory, "defaults", arch="llama", dtype="float32", seed=3)
    script = f"""
import json, os, sys, torch, transformers
assert "TRITON_INTERPRET" not in os.environ
import graphrt
assert not [m for m in sys.modules if m.startswith("graphrt.kernels")], "import graphrt loaded kernels"
from graphrt import LLM, SamplingParams
llm = LLM({str(ckpt)!r})
outs = llm.generate(["Hello world", [5, 6, 7]], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
hf = transformers.AutoModelForCausalLM.from_pretrained({str(ckpt)!r}, dtype=torch.float32).eval()
ref = [hf.generate(torch.tensor([o.prompt_token_ids]), max_new_tokens=5, do_sample=False,
                   eos_token_id=None, pad_token_id=0)[0, len(o.prompt_token_ids):].tolist() for o in outs]
print(json.dumps({{"device": str(llm.runtime.caps.device),
                   "interp": os.environ.get("TRITON_INTERPRET"),
                   "tokens": [o.token_ids for o in outs], "ref": ref}}))
"""
    r = subprocess.run([sys.executable, "-c", script], env=_clean_env(), capture_output=True, text=True,
                       timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["interp"] == "1"
    assert res["device"] in (None, "cpu")
    assert res["tokens"] == res["ref"] and all(len(t) == 5 for t in res["tokens"])
    assert "generate: 100%" in r.stderr and "2/2" in r.stderr         # the progress bar (2 prompts)


def test_resolve_device():
    assert resolve_device(None).type == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("auto") == resolve_device(None)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="^device: 'tpu' is not 'cuda', 'cpu' or 'auto'"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="^device: 3 is not"):
        resolve_device(3)
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="^device: 'cuda' requested but CUDA is not available"):
            resolve_device("cuda")


def test_select_triton_mode_refuses_an_explicit_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="^device: 'cpu' .* TRITON_INTERPRET='0' is set: unset it"):
        select_triton_mode(torch.device("cpu"))
    select_triton_mode(torch.device("cuda")) if HAS_CUDA else None   # cuda: untouched


@pytest.mark.skipif(HAS_CUDA, reason="kernels bound to a GPU driver need a machine without CUDA to fail")
def test_kernels_imported_for_a_gpu_driver_first_stop_with_one_line(tmp_path):
    """Importing graphrt's kernels before anything selects the interpreter binds them to a GPU
    driver; LLM(device='cpu') then says what to do instead of failing deep in Triton."""
    script = """
import graphrt.kernels.sample
from graphrt.engine.device import compiled_kernels_loaded
from graphrt import LLM
print(compiled_kernels_loaded())
try:
    LLM("/nonexistent", device="cpu")
except ValueError as e:
    print("ValueError", e)
"""
    r = subprocess.run([sys.executable, "-c", script], env=_clean_env(), capture_output=True, text=True,
                       timeout=120, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert "graphrt.kernels.sample" in lines[0] and "triton.language.standard" in lines[0]
    assert lines[1].startswith("ValueError device: 'cpu' needs Triton's interpreter, but")
    assert "set TRITON_INTERPRET=1 in the environment" in lines[1]


def test_in_this_process_kernels_are_interpreted_on_cpu():
    """conftest.py set TRITON_INTERPRET=1 before import: nothing is bound to a GPU driver."""
    import graphrt.kernels.sample  # noqa: F401
    assert compiled_kernels_loaded() == [] or HAS_CUDA


def test_generate_use_tqdm(tmp_path_factory, capsys):
    ckpt = write(tmp_path_factory, "tqdm", arch="llama", dtype="float32", seed=4)
    from graphrt import LLM, SamplingParams
    llm = LLM(ckpt, device="cpu", max_batch=2, steps_per_graph=2)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with_bar = llm.generate(["a b", "c", [4, 5]], params)
    assert "generate: 100%" in capsys.readouterr().err
    without = llm.generate(["a b", "c", [4, 5]], params, use_tqdm=False)
    assert "generate" not in capsys.readouterr().err
    assert [o.token_ids for o in with_bar] == [o.token_ids for o in without]
    with pytest.raises(ValueError, match="^use_tqdm: expected a bool, got 'no'"):
        llm.generate("a", params, use_tqdm="no")


@pytest.mark.gpu
def test_default_device_is_cuda_on_a_gpu_machine(tmp_path_factory):
    """LLM(path) with no device on a GPU machine: CUDA, graphs captured, kernels compiled (not
    interpreted), and it generates."""
    ckpt = write(tmp_path_factory, "gpu_default", arch="llama", dtype="float32", seed=3)
    from graphrt import LLM, SamplingParams
    llm = LLM(ckpt, max_batch=2, steps_per_graph=2)      # bf16 on CUDA (float32 needs a torch backend)
    assert llm.checkpoint.spec is not None and resolve_device(None).type == "cuda"
    out = llm.generate("Hello world", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and os.environ.get("TRITON_INTERPRET") in (None, "0", "")
