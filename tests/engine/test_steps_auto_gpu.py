"""GPU: LLM(steps_per_graph="auto") on the 2-layer 8B-shaped checkpoint (ckpt_8b): K is the rule's
for the measured step, shown in llm.config, llm.runtime.runtime.steps and the start-up line; with the
rule's threshold lowered so that K = 1, the config is resolved to K = 1 with unpaced prefill and
the greedy tokens equal an explicit K = 1 engine's.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/engine/test_steps_auto_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from graphrt import LLM, SamplingParams
from graphrt.model import steps as steps_mod

pytestmark = pytest.mark.gpu
KW = dict(device="cuda", max_batch=2, max_model_len=1020)
PROMPTS = [list(range(10, 40)), list(range(100, 107))]
GREEDY = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def path(ckpt_8b):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return ckpt_8b


def _tokens(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_auto_resolves_from_the_measured_step(path):
    llm = LLM(path, **KW)
    plan = llm.runtime.runtime.steps
    print(f"\n2-layer 8B: {plan.describe()}")
    assert plan.source == "measured" and plan.step_us > 0
    assert llm.config.steps_per_graph == llm.runtime.caps.steps_per_graph == steps_mod.steps_for_step_us(plan.step_us)
    assert llm.startup.decode_step_us == plan.step_us and "auto: bucket-1 decode step" in llm.startup.steps
    assert all(len(t) == 9 for t in _tokens(llm))


def test_auto_at_k1_runs_as_explicit_k1(path, monkeypatch):
    monkeypatch.setattr(steps_mod, "ONE_STEP_FROM_US", 1.0)          # every step is "long": K = 1
    monkeypatch.setenv("GRAPHRT_SPLITK", "1")      # one split-K plan for both engines (not re-measured)
    auto = LLM(path, **KW)
    assert auto.config.steps_per_graph == auto.runtime.caps.steps_per_graph == 1 and auto.runtime.runtime.steps.source == "measured"
    assert auto.config.max_prefill_stall is None and auto.engine.scheduler.pacer is None
    got = _tokens(auto)
    auto.shutdown()
    del auto
    fixed = LLM(path, steps_per_graph=1, **KW)
    assert fixed.runtime.runtime.steps.source == "fixed" and _tokens(fixed) == got
