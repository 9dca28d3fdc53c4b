"""graphrt.attention.verify: verification plans (full, explicit, CPU budget) and the length-sorted oracle."""
from __future__ import annotations

import pytest
import torch

from graphrt import PagedKVCache, RuntimeConfig
from graphrt.attention.flashinfer_layout import nominal_spec
from graphrt.attention.reference import reference_decode
from graphrt.attention.verify import (CPU_MAX_LEN, VerifyPlan, cpu_plan, cpu_step_cost, full_plan, make_plan,
                            reference_by_length, verify_lengths)


def _config(**kw) -> RuntimeConfig:
    base = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, max_context_len=32768,
                buckets={"max": 256}, dtype="bfloat16", backend="flashinfer", kv_pool_pages=64)
    return RuntimeConfig(**{**base, **kw})


def test_full_plan_is_every_bucket_at_the_standard_lengths():
    cfg = _config()
    plan = full_plan(cfg)
    assert plan.buckets == cfg.buckets and plan.lengths == (1, 16, 17, 32768)
    assert plan.is_full(cfg) and make_plan(cfg) == plan
    assert not make_plan(cfg, buckets=[1]).is_full(cfg)
    assert not make_plan(cfg, lengths=[1, 16, 17, 2048]).is_full(cfg)


def test_make_plan_sorts_and_refuses_what_the_config_cannot_hold():
    cfg = _config()
    assert make_plan(cfg, buckets=[8, 1, 8], lengths=[17, 1]) == VerifyPlan((1, 8), (1, 17))
    with pytest.raises(ValueError, match=r"^buckets: \[3\]: must be among"):
        make_plan(cfg, buckets=[1, 3])
    with pytest.raises(ValueError, match=r"^lengths: \[0, 32769\].*max_context_len=32768"):
        make_plan(cfg, lengths=[0, 5, 32769])
    with pytest.raises(ValueError, match="^buckets: none given"):
        make_plan(cfg, buckets=[])


def test_cpu_plan_covers_both_planner_shapes_within_budget():
    cfg = _config()  # tensor-core, 8 kv heads: the nominal H200 splits up to 33 rows
    plan = cpu_plan(cfg)
    split = [b for b in cfg.buckets if nominal_spec(cfg.decode_kernel, b, 16, 8).split_kv]
    assert split[-1] == 32 and 32 in plan.buckets and 40 in plan.buckets and 1 in plan.buckets
    assert 256 not in plan.buckets  # the largest does not fit: it is left out, not truncated
    assert plan.lengths == (1, 16, 17, CPU_MAX_LEN)
    assert sum(cpu_step_cost(cfg, b) for b in plan.buckets) <= 2500
    # a budget for the smallest bucket only; none when even that does not fit
    assert cpu_plan(cfg, budget=cpu_step_cost(cfg, 1)).buckets == (1,)
    assert cpu_plan(cfg, budget=cpu_step_cost(cfg, 1) - 1) is None


def test_cpu_plan_of_a_small_config_is_full():
    cfg = _config(num_qo_heads=4, num_kv_heads=2, head_dim=64, max_context_len=512,
                  buckets=[1, 2, 4, 8], dtype="float32", backend="torch-splitkv")
    assert cpu_plan(cfg).is_full(cfg) and verify_lengths(cfg) == [1, 16, 17, 512]


def test_cpu_step_cost_grows_with_table_width_and_rows():
    short, long = _config(max_context_len=4096), _config(max_context_len=65536)
    assert cpu_step_cost(long, 8) > cpu_step_cost(short, 8)
    assert cpu_step_cost(short, 64) > cpu_step_cost(short, 8)


def test_reference_by_length_equals_reference_in_row_order():
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, max_context_len=64,
                        buckets=[8], dtype="float32", backend="reference", kv_pool_pages=40)
    kv = PagedKVCache.allocate(cfg, 40, "cpu")
    g = torch.Generator().manual_seed(1)
    q = torch.randn((7, 4, 64), generator=g)
    table = torch.randint(0, 40, (7, 16), generator=g, dtype=torch.int32)
    lens = torch.tensor([64, 1, 0, 33, 4, 64, 5], dtype=torch.int32)
    want = reference_decode(q, kv.k, kv.v, table, lens)
    got = reference_by_length(q, kv.k, kv.v, table, lens, layout="NHD")
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
