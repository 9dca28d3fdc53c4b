"""GPU: steps_per_graph="auto" measures the bucket-1 decode step at capture and picks K from it, on
random bf16 models of the two shapes model/steps.py's rule was drawn from: Llama-3.1-8B (32 layers,
one step about 4.8 ms on an H200: K = 1) and Llama-3.2-1B (16 layers, about 1 ms: K = 4). The
weights are drawn on the device (no checkpoint written); one bucket, greedy graphs only.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/model/test_steps_gpu.py
"""
from __future__ import annotations

import gc

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model.steps import ONE_STEP_FROM_US

pytestmark = pytest.mark.gpu
# name: hidden, intermediate, layers, kv heads, head_dim, tied (32 query heads, vocab 128256)
SHAPES = {"llama-3.1-8b": (4096, 14336, 32, 8, 128, False), "llama-3.2-1b": (2048, 8192, 16, 8, 64, True)}


def _runtime(shape: str, *, plans=None, buckets=(1,)):
    from graphrt.model import LlamaDecoder, LlamaSpec
    from graphrt.model.runtime import ModelRuntime
    from graphrt.parallel.random_weights import random_weights
    h, inter, layers, kv, d, tied = SHAPES[shape]
    spec = LlamaSpec(vocab_size=128256, hidden_size=h, intermediate_size=inter, num_layers=layers, num_heads=32,
                     num_kv_heads=kv, head_dim=d, rms_norm_eps=1e-5, rope_theta=500000.0,
                     tie_word_embeddings=tied, attention_bias=False, max_position_embeddings=4096)
    cfg = RuntimeConfig(num_qo_heads=32, num_kv_heads=kv, head_dim=d, page_size=16, max_context_len=256,
                        buckets=list(buckets), dtype="bfloat16", backend="flashinfer", kv_pool_pages=17)
    model = LlamaDecoder(spec, random_weights(spec, dtype=torch.bfloat16, device="cuda"))
    return ModelRuntime(model, cfg, "cuda", steps_per_graph="auto", graphed_prefill=False, plans=plans)


@pytest.mark.parametrize("shape,k", [("llama-3.1-8b", 1), ("llama-3.2-1b", 4)])
def test_auto_measures_the_step_and_picks_k(shape, k):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    mrt = _runtime(shape)
    assert mrt.k == 4 and mrt.steps.source == "default"
    stats = mrt.capture()
    plan = mrt.steps
    print(f"\n{shape}: {plan.describe()}")
    assert plan.source == "measured" and 50.0 < plan.step_us < 50_000.0 and plan.seconds < 30.0
    assert (plan.step_us >= ONE_STEP_FROM_US) == (k == 1) and mrt.k == plan.k == k
    assert [key.steps for key in stats if key.phase == "decode"] == [k]   # the probe graph was dropped
    table = torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16)
    first = mrt.prefill([torch.arange(3, 40, device="cuda")], table).argmax(-1)
    out = mrt.decode(first, table, torch.tensor([38], dtype=torch.int32, device="cuda"))
    assert out.shape == (k, 1)                                  # K steps a replay
    mrt.check_device_errors()                                   # the timed replays flagged nothing
    del mrt, out
    gc.collect()
    torch.cuda.empty_cache()


def test_a_later_start_takes_the_measured_plans():
    """measured_plans() of a captured runtime (split-K per bucket, K) given to the next runtime's
    `plans`: both taken as "cached" (nothing measured: no plan seconds), the same table and K;
    a split-K table for other buckets is measured instead."""
    mrt = _runtime("llama-3.2-1b")
    mrt.capture()
    plans = mrt.measured_plans()
    print(f"\nplans: {plans}; measured in {mrt.plan_seconds}")
    assert set(plans) == {"splitk", "steps"} and plans["steps"]["k"] == mrt.k
    table, k = dict(mrt.splitk.table), mrt.k
    del mrt
    gc.collect()
    again = _runtime("llama-3.2-1b", plans=plans)
    again.capture()
    assert again.splitk.source == "cached" and dict(again.splitk.table) == table
    assert again.steps.source == "cached" and again.k == k and again.plan_seconds == {}
    assert again.measured_plans() == plans
    del again
    gc.collect()
    other = _runtime("llama-3.2-1b", plans={"splitk": {"4": [1, 2]}}, buckets=(1, 2))
    other.capture()
    assert other.splitk.source == "measured" and other.steps.source == "measured"
    del other
    gc.collect()
    torch.cuda.empty_cache()
