"""model/plans.py: decode plans kept across starts. check_plans validates a plan naming the
field, plans_dict and check_plans round-trip through JSON, a ModelRuntime refuses a malformed
plan at construction, a CPU runtime measures nothing (so keeps no plan), and a graph cache's
manifest carries the plans its capture measured. (The CUDA path, where a later start takes
them instead of measuring: tests/model/test_steps_gpu.py.)"""
from __future__ import annotations

import json

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model.plans import check_plans, plans_dict


def test_round_trip_through_json():
    plans = plans_dict({1: (1, 2), 16: (2, 4)}, (4, 812.34))
    assert plans == {"splitk": {"1": [1, 2], "16": [2, 4]}, "steps": {"k": 4, "step_us": 812.3}}
    assert check_plans(json.loads(json.dumps(plans))) == {"splitk": {1: (1, 2), 16: (2, 4)}, "steps": (4, 812.3)}
    assert check_plans(None) == {"splitk": None, "steps": None}
    assert check_plans({}) == {"splitk": None, "steps": None} and plans_dict(None, None) == {}


@pytest.mark.parametrize("plans,field", [
    ({"splitk": {"1": [1, 3]}}, r"plans.splitk\['1'\]"),
    ({"splitk": {"x": [1, 1]}}, r"plans.splitk\['x'\]"),
    ({"splitk": {"0": [1, 1]}}, r"plans.splitk\['0'\]"),
    ({"splitk": {"1": [1, True]}}, r"plans.splitk\['1'\]"),
    ({"splitk": {}}, "plans.splitk"),
    ({"steps": {"k": 0, "step_us": 5.0}}, "plans.steps"),
    ({"steps": {"k": 4, "step_us": float("nan")}}, "plans.steps"),
    ({"steps": {"k": 4}}, "plans.steps"),
    ({"steps": {"k": 4, "step_us": 9.0, "x": 1}}, "plans.steps"),
    ({"splitk": {"1": [1, 2.0]}}, r"plans.splitk\['1'\]"),
    ({"fuse": {}}, "plans"),
    ([1], "plans"),
])
def test_malformed_plans_name_the_field(plans, field):
    with pytest.raises(ValueError, match=field):
        check_plans(plans)


def _runtime(plans, intermediate: int = 64):
    from graphrt.model import LlamaDecoder, LlamaSpec
    from graphrt.model.runtime import ModelRuntime
    from graphrt.parallel.random_weights import random_weights
    spec = LlamaSpec(vocab_size=64, hidden_size=64, intermediate_size=intermediate, num_layers=1, num_heads=1,
                     num_kv_heads=1, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                     tie_word_embeddings=True, attention_bias=False, max_position_embeddings=128)
    cfg = RuntimeConfig(num_qo_heads=1, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                        buckets=[1], dtype="float32", backend="reference", kv_pool_pages=8)
    model = LlamaDecoder(spec, random_weights(spec, dtype=torch.float32, device="cpu"))
    return ModelRuntime(model, cfg, "cpu", steps_per_graph="auto", plans=plans)


def test_a_runtime_refuses_a_malformed_plan_and_keeps_none_on_cpu():
    with pytest.raises(ValueError, match="plans.steps"):
        _runtime({"steps": {"k": -1, "step_us": 3.0}})
    mrt = _runtime({"splitk": {"1": [2, 2]}, "steps": {"k": 1, "step_us": 3000.0}})
    mrt.capture()                                   # CPU: no graphs, nothing measured or taken
    assert mrt.measured_plans() == {} and mrt.steps.source == "default"


def test_the_manifest_keeps_the_plans():
    from graphrt.cache.manifest import build_manifest
    cfg = RuntimeConfig(num_qo_heads=1, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                        buckets=[1], dtype="float32", backend="reference")
    plans = plans_dict({1: (1, 2)}, (4, 900.0))
    assert build_manifest(cfg, [], {}, mode="eager", plans=plans).data["plans"] == plans
    assert "plans" not in build_manifest(cfg, [], {}, mode="eager", plans={}).data



@pytest.mark.parametrize("plans,want", [
    ({"splitk": {"1": [2, 1]}}, {1: (2, 1)}),            # o: K = 64 splits by 2 (32, a multiple of 16)
    ({"splitk": {"1": [1, 1], "2": [1, 1]}}, None),      # another bucket set
    ({"splitk": {"1": [1, 2]}}, None),                   # down: K = 48 by 2 is 24, not a multiple of 16
])
def test_a_cached_split_k_plan_is_taken_only_where_it_fits(monkeypatch, plans, want):
    """_cached_splitk (the CUDA path's choice; host only, so the device is pretended here) takes a
    table of exactly this runtime's buckets whose factors fit its o / down weights; anything else
    is measured instead (None here)."""
    mrt = _runtime(plans, intermediate=48)
    monkeypatch.setattr(mrt, "device", torch.device("cuda"))
    got = mrt._cached_splitk()
    assert (None if got is None else dict(got.table)) == want
    assert got is None or got.source == "cached"
