"""steps_per_graph="auto" in the engine on CPU: the default; it resolves to K = 4 (nothing to time
without CUDA graphs) with the same greedy tokens as an explicit K = 4, shows in llm.config, the
runtime's plan and the start-up line; max_prefill_stall "auto" is 1.0 at K > 1 and None at K = 1
unless given (EngineConfig.resolved); the lookahead covers the largest K "auto" may choose and a
speculative k; speculation runs under "auto" with the plain engine's greedy tokens."""
from __future__ import annotations

import logging

import pytest

from _checkpoints import write
from graphrt import LLM, SamplingParams
from graphrt.engine.config import EngineConfig

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=48, max_batch=2)
GREEDY = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
PROMPTS = ["Hello world", [7, 8, 9, 10, 11, 7, 8, 9]]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "autok", arch="llama", dtype="float32", seed=5)


@pytest.fixture(scope="module")
def auto(path):
    return LLM(path, **CPU)


def _tokens(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_auto_is_the_default_and_resolves_to_4_on_cpu(auto, path, caplog):
    assert EngineConfig().steps_per_graph == "auto"
    assert auto.config.steps_per_graph == 4 and auto.runtime.caps.steps_per_graph == auto.engine.scheduler.k == 4
    assert (auto.runtime.runtime.steps.source, auto.runtime.runtime.steps.step_us) == ("default", None)
    assert auto.config.max_prefill_stall == 1.0 and auto.engine.scheduler.pacer.max_stall == 1.0
    d = auto.startup.as_dict()
    assert (d["steps_per_graph"], d["decode_step_us"]) == (4, None)
    assert auto.startup.line(pages=1, pool_bytes=0).endswith("; decode K=4 (auto: no CUDA graph to time, the default)")
    with caplog.at_level(logging.INFO, logger="graphrt.engine"):
        fixed = LLM(path, steps_per_graph=4, **CPU)
    assert "decode K=4 (steps_per_graph=4)" in caplog.text                 # the start-up line
    assert fixed.runtime.runtime.steps.source == "fixed" and _tokens(auto) == _tokens(fixed)


def test_prefill_stall_auto_follows_k(path):
    c = EngineConfig()
    assert (c.prefill_stall(1), c.prefill_stall(4)) == (None, 1.0)
    assert c.resolved(1) == EngineConfig(steps_per_graph=1, max_prefill_stall=None)
    assert EngineConfig(max_prefill_stall=0.5).resolved(1).max_prefill_stall == 0.5   # given: kept
    assert EngineConfig(max_prefill_stall=None).resolved(4).max_prefill_stall is None
    k1 = LLM(path, steps_per_graph=1, **CPU)                      # K = 1: a chunk between every two steps
    assert k1.config.max_prefill_stall is None and k1.engine.scheduler.pacer is None
    paced = LLM(path, steps_per_graph=1, max_prefill_stall=0.5, **CPU)
    assert paced.engine.scheduler.pacer.max_stall == 0.5


def test_lookahead_covers_auto_and_speculation():
    assert EngineConfig().lookahead == 4 and EngineConfig(steps_per_graph=1).lookahead == 1
    spec = EngineConfig(speculative={"method": "ngram", "num_tokens": 6})
    assert spec.lookahead == 6 and spec.resolved(1).lookahead == 6 and spec.resolved(1).speculative == spec.speculative


def test_speculation_under_auto_gives_the_plain_tokens(auto, path):
    spec = LLM(path, speculative={"method": "ngram", "num_tokens": 3}, **CPU)
    assert spec.config.steps_per_graph == 4 and spec.config.speculative.num_tokens == 3
    assert _tokens(spec) == _tokens(auto)
