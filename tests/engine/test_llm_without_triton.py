"""A CPU install carries no Triton: `LLM` on a CPU in a process where `import triton` fails runs
greedy, seeded sampling (top-k / top-p), log-probabilities (prompt ones too) and penalties, and
gives the tokens and log-probabilities of the same requests run here, where Triton is installed,
on the Triton kernel set (the interpreter: its sampler's Philox noise is what the torch set
reproduces bit for bit); n-gram speculation there emits the seeded run's tokens. The process never
imports Triton, and asking it for the Triton kernels is one ImportError naming the install line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _checkpoints import write

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Hello world", [3, 4, 5, 6, 7, 8, 9, 10]]
# SamplingParams of each run (vLLM's names), generated for both prompts
RUNS = {"greedy": dict(max_tokens=6, temperature=0.0, ignore_eos=True),
        "seeded": dict(max_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=3, ignore_eos=True),
        "logprobs": dict(max_tokens=4, temperature=1.0, seed=5, logprobs=3, prompt_logprobs=2, ignore_eos=True,
                         presence_penalty=0.5, repetition_penalty=1.2)}

_RUN = textwrap.dedent('''
    import json, sys
    from graphrt import LLM, SamplingParams

    def run(path, prompts, runs, **kw):
        llm = LLM(path, device="cpu", max_batch=2, steps_per_graph=2, max_model_len=64, **kw)
        out = {}
        for name, p in runs.items():
            res = llm.generate(prompts, SamplingParams(**p), use_tqdm=False)
            out[name] = [{"tokens": r.outputs[0].token_ids,
                          "logprobs": [{str(t): lp.logprob for t, lp in d.items()} for d in r.outputs[0].logprobs or []],
                          "prompt_logprobs": [{str(t): lp.logprob for t, lp in d.items()}
                                              for d in (r.prompt_logprobs or [])[1:]]} for r in res]
        llm.shutdown()
        return out
''')

_BLOCKED = textwrap.dedent('''
    import sys
    sys.modules["triton"] = None                       # `import triton` raises ImportError
    path, prompts, runs = sys.argv[1], __import__("json").loads(sys.argv[2]), __import__("json").loads(sys.argv[3])
''') + _RUN + textwrap.dedent('''
    out = run(path, prompts, runs)
    spec = run(path, prompts, {"seeded": runs["seeded"]}, speculative={"method": "ngram", "num_tokens": 2})
    try:
        LLM(path, device="cpu", kernels="triton", max_model_len=64)
        missing = None
    except ImportError as e:
        missing = str(e)
    print(json.dumps({"runs": out, "spec": spec, "missing": missing, "imported": sys.modules.get("triton") is not None}))
''')


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write(tmp_path_factory, "notriton", arch="llama", dtype="float32", seed=2)


def _close(a, b, atol=2e-4):
    assert a["tokens"] == b["tokens"]
    for key in ("logprobs", "prompt_logprobs"):
        assert len(a[key]) == len(b[key])
        for x, y in zip(a[key], b[key]):
            assert x.keys() == y.keys() and all(abs(x[t] - y[t]) <= atol for t in x), (key, x, y)


def test_llm_on_a_cpu_without_triton_equals_the_triton_kernels(ckpt):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _BLOCKED, str(ckpt), json.dumps(PROMPTS), json.dumps(RUNS)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    blocked = json.loads(r.stdout.strip().splitlines()[-1])
    assert blocked["imported"] is False
    assert blocked["missing"].startswith("kernels='triton' needs Triton, which is not installed: pip install "
                                         '"graphrt[gpu]"'), blocked["missing"]
    scope = {}
    exec(_RUN, scope)                                   # here: Triton installed, its kernels interpreted
    here = scope["run"](str(ckpt), PROMPTS, RUNS, kernels="triton")
    for name in RUNS:
        for a, b in zip(blocked["runs"][name], here[name]):
            _close(a, b)
    greedy, seeded = blocked["runs"]["greedy"], blocked["runs"]["seeded"]
    assert [x["tokens"] for x in blocked["spec"]["seeded"]] == [x["tokens"] for x in seeded]   # n-gram rounds
    assert all(len(x["tokens"]) == 6 for x in greedy + seeded) and greedy != seeded
    assert all(len(x["logprobs"]) == 4 and len(x["prompt_logprobs"]) > 0 for x in blocked["runs"]["logprobs"])
