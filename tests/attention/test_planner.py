"""Device planner (prepare kernel, PLAN branch) under TRITON_INTERPRET=1 on CPU.

- plan-info layout model vs FlashInfer 0.7.4 plan infos recorded on an H200;
- Triton planner == numpy model of FlashInfer's host planner, over random lengths and buckets;
- every KV token covered exactly once; the torch split-KV executor over the planner's arrays
  equals float32 reference attention.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.attention import flashinfer_layout as fl
from graphrt.attention.backends.torch_splitkv import int_workspace_nbytes
from graphrt.attention.buffers import StaticBuffers
from graphrt.config import RuntimeConfig
from graphrt.kernels import PrepareLaunch
from graphrt.attention.kvcache import PagedKVCache
from graphrt.attention.planner import compare_plans, graphrt_plan, host_plan, plan_fits
from graphrt.attention.reference import reference_decode, split_kv_decode

# FlashInfer 0.7.4 on an H200 (bf16, 32 q / 8 kv heads, head_dim 128, page 16, graph mode)
H200_TC = {1: [33, 1, 448, 16, 0, 144, 288, 464, 432, 440, 0, 2162688, 480, 1, 1],
           16: [33, 16, 512, 16, 0, 144, 288, 528, 432, 500, 0, 2162688, 608, 1, 1],
           64: [64, 64, 1040, 16, 0, 256, 512, 0, 768, 1028, 0, 0, 1056, 1, 0],
           128: [128, 128, 2064, 16, 0, 512, 1024, 0, 1536, 2052, 0, 0, 2080, 1, 0]}
H200_CC = [148, 0, 2424832, 0, 592, 1184, 1792, 1780, 1, 1]


@pytest.mark.parametrize("bs", sorted(H200_TC))
def test_layout_model_matches_recorded_tensor_core_plan_info(bs):
    spec = fl.parse_plan_info(fl.TENSOR_CORE, H200_TC[bs], bs, 16, 4)
    assert spec.split_kv == (bs <= 33) and spec.padded_batch_size == max(33, bs)
    assert spec == fl.nominal_spec(fl.TENSOR_CORE, bs, 16, 8)  # 132 SMs, 8 kv heads


@pytest.mark.parametrize("bs", [1, 4, 16, 64, 128])
def test_layout_model_matches_recorded_cuda_core_plan_info(bs):
    spec = fl.parse_plan_info(fl.CUDA_CORE, H200_CC, bs, 16, 4)
    assert spec.split_kv and spec.padded_batch_size == 148 and spec.budget == 148


@pytest.mark.parametrize("field", [4, 8, 12])
def test_unknown_layout_is_refused(field):
    info = list(H200_TC[16])
    info[field] += 16
    with pytest.raises(fl.LayoutMismatch, match="differ"):
        fl.parse_plan_info(fl.TENSOR_CORE, info, 16, 16, 4)
    with pytest.raises(fl.LayoutMismatch, match="fields"):
        fl.parse_plan_info(fl.CUDA_CORE, H200_CC[:9], 16, 16, 4)


def test_unknown_version_is_refused():
    fl.check_version("0.7.4")
    with pytest.raises(fl.LayoutMismatch, match="0.8.0"):
        fl.check_version("0.8.0")


def test_host_model_hand_computed_case():
    # bs 1, 32k tokens, page 16: 2048 pages over a 33-tile budget -> 63-page chunks, 33 tiles
    spec = fl.nominal_spec(fl.TENSOR_CORE, 1, 16, 8)
    plan = host_plan(spec, [32768])
    assert int(plan["kv_chunk_size"]) == 63 * 16
    assert plan["o_indptr"].tolist() == [0, 33]
    assert plan["kv_tile_indices"].tolist() == list(range(33))
    assert plan["block_valid_mask"].tolist() == [1] * 33
    # no split past the budget: one tile per request, chunk = longest request
    spec = fl.nominal_spec(fl.TENSOR_CORE, 64, 16, 8)
    plan = host_plan(spec, [100] * 63 + [4096])
    assert int(plan["kv_chunk_size"]) == 4096 and plan["o_indptr"].tolist() == list(range(65))


def _device_plan(kind, size, lens, page_size, max_pages, num_kv_heads=2, seed=0):
    cfg = RuntimeConfig(num_qo_heads=4 * num_kv_heads, num_kv_heads=num_kv_heads, head_dim=64,
                        page_size=page_size, max_pages_per_seq=max_pages,
                        buckets=sorted({1, size}), dtype="float32", backend="reference")
    view = StaticBuffers(cfg, torch.device("cpu")).view(size)
    spec = fl.nominal_spec(kind, size, page_size, num_kv_heads, num_sms=8)
    ws = torch.full((int_workspace_nbytes(spec),), 0xAB, dtype=torch.uint8)  # poison
    g = torch.Generator().manual_seed(seed)
    pool = 64
    view.block_table.copy_(torch.randint(0, pool, view.block_table.shape, generator=g, dtype=torch.int32))
    view.seq_lens.zero_()
    view.seq_lens[: len(lens)] = torch.tensor(lens, dtype=torch.int32)
    PrepareLaunch(view, page_size, cfg.max_context_len, pool, spec, ws)()
    return cfg, view, spec, fl.read_plan(spec, ws)


@st.composite
def plan_cases(draw):
    """Random buckets and lengths; empty rows (idle slots) may sit anywhere, also before long rows."""
    kind = draw(st.sampled_from([fl.TENSOR_CORE, fl.CUDA_CORE]))
    page_size = draw(st.sampled_from([1, 4, 16]))
    max_pages = draw(st.integers(1, 300))
    size = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 40]))
    n_real = draw(st.integers(1, size))
    max_len = page_size * max_pages
    len_st = st.one_of(st.sampled_from([0, 1, page_size, max_len]), st.integers(0, max_len))
    lens = draw(st.lists(len_st, min_size=n_real, max_size=n_real))
    return kind, size, lens, page_size, max_pages


def _assert_covers_every_token(spec, plan, lens):
    """Every tile inside the grid; every KV token of every row covered exactly once."""
    chunk = int(plan["kv_chunk_size"])
    o = plan["o_indptr"].tolist()
    assert o[-1] <= spec.padded_batch_size, "tiles past the captured grid"
    for r, length in enumerate(lens):
        covered = []
        for t in range(o[r], o[r + 1]):
            assert int(plan["request_indices"][t]) == r
            lo = int(plan["kv_tile_indices"][t]) * chunk
            covered += list(range(lo, min(lo + chunk, length)))
        assert covered == list(range(length))


@settings(max_examples=80, deadline=None)
@given(plan_cases())
def test_triton_planner_matches_model_and_always_fits(case):
    kind, size, lens, page_size, max_pages = case
    _, view, spec, got = _device_plan(kind, size, lens, page_size, max_pages)
    all_lens = view.seq_lens.tolist()
    assert compare_plans(got, graphrt_plan(spec, all_lens)) == []
    _assert_covers_every_token(spec, got, all_lens)
    assert int(view.device_error) == 0
    # byte parity with FlashInfer's host plan wherever that plan fits the grid
    theirs = host_plan(spec, all_lens)
    if plan_fits(spec, theirs):
        assert compare_plans(got, theirs) == []


@settings(max_examples=30, deadline=None)
@given(plan_cases(), st.sampled_from(["NHD", "HND"]))
def test_split_kv_executor_over_device_plan_equals_reference(case, layout):
    kind, size, lens, page_size, max_pages = case
    max_pages = min(max_pages, 40)
    lens = [min(x, page_size * max_pages) for x in lens]
    cfg, view, spec, plan = _device_plan(kind, size, lens, page_size, max_pages)
    cfg = cfg.replace(kv_layout=layout)
    kv = PagedKVCache.allocate(cfg, 64, "cpu", seed=len(lens))
    view.query.copy_(torch.randn(view.query.shape))
    out = split_kv_decode(view.query, kv.k, kv.v, indptr=view.paged_kv_indptr,
                          indices=view.paged_kv_indices, last_page_len=view.paged_kv_last_page_len,
                          request_indices=plan["request_indices"], kv_tile_indices=plan["kv_tile_indices"],
                          o_indptr=plan["o_indptr"], kv_chunk_size=int(plan["kv_chunk_size"]), layout=layout)
    ref = reference_decode(view.query, kv.k, kv.v, view.block_table, view.seq_lens, layout=layout)
    n = len(lens)
    torch.testing.assert_close(out[:n], ref[:n], rtol=1e-4, atol=1e-5)


# Length sets measured wrong on the H200 with FlashInfer's CUDA-core plan; on the nominal
# H200 spec (132 SMs) with 8 kv heads the CUDA-core grid holds 148 tiles.
EMPTY_FIRST = [[0] * 15 + [32768], [0] * 15 + [18944], [0, 32768, 0, 0, 20000, 0, 1, 0] * 2,
               [0] * 63 + [32768], [0, 32768] * 32]


@pytest.mark.parametrize("lens", EMPTY_FIRST, ids=lambda x: f"n{len(x)}")
@pytest.mark.parametrize("kind", [fl.TENSOR_CORE, fl.CUDA_CORE])
def test_empty_rows_before_long_ones_fit_the_grid(kind, lens):
    size = 16 if len(lens) <= 16 else 64
    spec = fl.nominal_spec(kind, size, 16, 8)
    all_lens = lens + [0] * (size - len(lens))
    theirs, ours = host_plan(spec, all_lens), graphrt_plan(spec, all_lens)
    if kind == fl.CUDA_CORE:  # FlashInfer's own plan drops real tiles: the bug graphrt avoids
        last_real = max(i for i, x in enumerate(all_lens) if x) + 1
        assert not plan_fits(spec, theirs, last_real)
    else:
        assert compare_plans(theirs, ours) == []
    _assert_covers_every_token(spec, ours, all_lens)


def test_cuda_core_empty_rows_before_a_long_one_are_planned_to_fit():
    # budget 36 (8 SMs x 9 blocks / 2 kv heads). FlashInfer counts the 15 empty rows as 0 tiles but
    # gives each one: 32 + 15 = 47 tiles overflow the grid and the long row's tiles fall off it.
    spec = fl.nominal_spec(fl.CUDA_CORE, 16, 16, 2, num_sms=8)
    assert not plan_fits(spec, host_plan(spec, [0] * 15 + [4096]))
    _, view, spec, plan = _device_plan(fl.CUDA_CORE, 16, [0] * 15 + [4096], 16, 300)
    assert int(plan["o_indptr"][-1]) <= 36 and int(view.device_error) == 0
    _assert_covers_every_token(spec, plan, view.seq_lens.tolist())
    # a long row first then padding: FlashInfer's plan loses only padding tiles; graphrt fits all
    _, view, spec, plan = _device_plan(fl.CUDA_CORE, 16, [4096], 16, 300)
    _assert_covers_every_token(spec, plan, view.seq_lens.tolist())
