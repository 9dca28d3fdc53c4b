"""model/steps.py and ModelRuntime's steps_per_graph="auto" on CPU: the rule (measured step µs ->
K, at the boundary), the setting's check (bad values name steps_per_graph), "auto" without graphs
(K = 4, deterministic), and the capture-time measurement driven through a stand-in graph runner
(the probe graph captured at K = 1, timed, dropped; K fixed before any graph is kept; the
outputs resized; the tokens those K-step blocks give equal an explicit K's)."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.attention.graphs import GraphKey
from graphrt.config import check_steps, max_steps
from graphrt.model import LlamaDecoder
from graphrt.model.runtime import ModelRuntime
from graphrt.model.steps import AUTO_STEPS, ONE_STEP_FROM_US, StepsPlan, steps_for_step_us

transformers = pytest.importorskip("transformers")


def test_rule_at_the_boundary():
    assert (AUTO_STEPS, ONE_STEP_FROM_US) == (4, 2000.0)
    assert steps_for_step_us(4800.0) == 1                        # 8B bf16 on an H200
    assert steps_for_step_us(2000.0) == 1 and steps_for_step_us(1999.9) == 4
    assert steps_for_step_us(200.0) == steps_for_step_us(1200.0) == 4   # tiny, 1B
    for bad in (0, -1.0, float("nan"), float("inf"), None, "2000", True):
        with pytest.raises(ValueError, match="step_us"):
            steps_for_step_us(bad)


@pytest.mark.parametrize("bad", [0, -1, "fast", True, 2.5, "4", None, "AUTO"])
def test_bad_settings_name_the_field(bad):
    with pytest.raises(ValueError, match="^steps_per_graph: must be 'auto' or an int"):
        check_steps(bad)
    with pytest.raises(ValueError, match="^steps_per_graph: "):
        StepsPlan(bad)


def test_setting_bounds_and_plan_text():
    assert check_steps("auto") == "auto" and check_steps(7) == 7 and max_steps("auto") == 4 and max_steps(7) == 7
    with pytest.raises(ValueError, match=r"an int in \[1, 8\] .*, got 9"):
        check_steps(9, most=8)
    assert StepsPlan(1, "measured", 4812.0, 0.25).describe() == \
        "K=1 (auto: bucket-1 decode step 4812 us >= 2000 us, measured in 0.25 s)"
    assert "812 us < 2000 us" in StepsPlan(4, "measured", 812.0).describe()
    assert StepsPlan(4, "default").describe() == "K=4 (auto: no CUDA graph to time, the default)"
    with pytest.raises(ValueError, match="source"):
        StepsPlan(4, "guessed")


def _runtime(k, buckets=(1, 2)):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=224, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    model = LlamaDecoder.from_hf(transformers.LlamaForCausalLM(cfg).eval())
    rc = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                       buckets=list(buckets), dtype="float32", backend="torch", kv_pool_pages=16)
    return ModelRuntime(model, rc, "cpu", steps_per_graph=k, processing=True)


class _Runner:
    """A graph runner without CUDA: records captures, reports a fixed replay time, runs eagerly."""

    def __init__(self, replay_us: float):
        self.replay_us, self.graphs, self.log, self.stats = replay_us, {}, [], {}

    def __contains__(self, key):
        return key in self.graphs

    def capture(self, key, step, **kw):
        self.log.append(("capture", key))
        self.graphs[key] = step

    def time_us(self, key, **kw):
        self.log.append(("time", key))
        return self.replay_us

    def drop(self, key):
        self.log.append(("drop", key))
        del self.graphs[key]

    def run(self, key, step, prepare=None):
        step()


@pytest.mark.parametrize("replay_us,k", [(4812.0, 1), (900.0, 4)])
def test_capture_measures_then_fixes_k(monkeypatch, replay_us, k):
    monkeypatch.setattr(ModelRuntime, "uses_graphs", property(lambda self: True))
    mrt = _runtime("auto")
    assert (mrt.k, mrt.steps) == (4, StepsPlan(4, "default"))      # until the capture measures
    mrt.graphs = _Runner(replay_us)
    mrt.capture()
    probe = GraphKey("decode", 1, steps=1)
    assert mrt.graphs.log[:3] == [("capture", probe), ("time", probe), ("drop", probe)]
    kept = [key for what, key in mrt.graphs.log[3:] if what == "capture"]
    assert kept and kept[0].bucket == 2                                # largest first
    # every decode graph runs K steps; per bucket a split step (constrained rows) adds its
    # forward and its two processed draws (model/runtime.py)
    assert all(key.steps == k for key in kept if key.phase == "decode")
    split = sorted((key.phase, key.filtered) for key in kept if key.phase != "decode" and key.bucket == 2)
    assert split == [("decode_draw", False), ("decode_draw", True), ("decode_forward", False)]
    assert mrt.k == k and mrt.steps.source == "measured" and mrt.steps.step_us == replay_us
    assert mrt.out_tokens.shape == (k, 2) and mrt.logprobs.token.shape[0] == k
    mrt.capture()                                                     # measured once
    assert sum(what == "time" for what, _ in mrt.graphs.log) == 1


def test_measured_k_decodes_as_the_explicit_k(monkeypatch):
    monkeypatch.setattr(ModelRuntime, "uses_graphs", property(lambda self: True))
    auto = _runtime("auto")
    auto.graphs = _Runner(5000.0)
    auto.capture()
    fixed = _runtime(1)
    prompts = [torch.arange(3, 12), torch.arange(20, 25)]
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    got = []
    for mrt in (auto, fixed):
        first = mrt.prefill(prompts, table).argmax(-1)
        lens = torch.tensor([10, 6], dtype=torch.int32)
        toks = [mrt.decode(first, table, lens).clone()]
        toks.append(mrt.decode(toks[-1][-1], table, lens + 1).clone())
        got.append(torch.cat(toks))
    assert auto.k == 1 and torch.equal(got[0], got[1])


def test_auto_without_graphs_is_4_and_host_planning_is_1(monkeypatch):
    mrt = _runtime("auto")                                            # CPU: nothing to time
    assert mrt.capture() == {} and (mrt.k, mrt.steps.source, mrt.steps.step_us) == (4, "default", None)
    assert mrt.out_tokens.shape == (4, 2)
    with pytest.raises(ValueError, match="^steps_per_graph: "):
        _runtime("fast")
    import graphrt.model.runtime as runtime_mod
    real = runtime_mod.make_backend

    def host_planned(*a, **kw):                       # a FlashInfer version the device planner does not know
        backend = real(*a, **kw)
        backend.needs_host_inputs = True
        return backend
    monkeypatch.setattr(runtime_mod, "make_backend", host_planned)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # "auto" asked for no K: no warning
        mrt = _runtime("auto")
    assert (mrt.k, mrt.steps) == (1, StepsPlan(1, "host planning")) and mrt.out_tokens.shape == (1, 2)
