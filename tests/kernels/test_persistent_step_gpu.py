"""GPU tests of the persistent decode step's kernel (graphrt/kernels/persistent/), random bf16
weights at Llama-3.2-1B / 3.1-8B layer shapes (2 layers, the full vocabulary): the grid of one
program per SM against one program (which runs the units in schedule order and never waits)
and against a grid of a third as many
programs: the same logits and tokens bit for bit (one compiled kernel, and each unit computes
the same values whichever program runs it, so any stale read or lost ordering shows), launch
after launch with changing lengths, eagerly and replayed 2000 times from a CUDA graph, every
counter back at zero and no watchdog flag; a step whose
wait can never be met sets ERR_STALL and returns (the watchdog) instead of hanging.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/kernels/test_persistent_step_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.persistent import ERR_STALL, PersistentStep
from graphrt.kernels.persistent.schedule import F_TARGET
from _persistent_models import SHAPES, geometry, random_model

pytestmark = pytest.mark.gpu
PAGE, MAX_LEN = 16, 2048


def _caches(model, rows):
    s = model.spec
    pages = rows * MAX_LEN // PAGE
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (pages, PAGE, s.num_kv_heads, s.head_dim)
    return [PagedKVCache(torch.randn(shape, generator=gen, device="cuda").bfloat16(),
                         torch.randn(shape, generator=gen, device="cuda").bfloat16()) for _ in range(s.num_layers)]


def _step(model, caches, rows, programs, **kw):
    return PersistentStep(model.weights, caches, model.cos_sin, geometry=geometry(model), rows=rows,
                          eps=model.spec.rms_norm_eps, programs=programs, max_context_len=MAX_LEN, **kw)


def _compare(model, rows, programs_a, programs_b, launches, prefetch):
    """Launch two steps of `programs_a` / `programs_b` programs on the same inputs: equal bit for bit."""
    caches_one, caches_grid = _caches(model, rows), _caches(model, rows)
    one = _step(model, caches_one, rows, programs_a, prefetch=prefetch)
    grid = _step(model, caches_grid, rows, programs_b, prefetch=prefetch)
    table = torch.arange(rows * MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(rows, -1)
    gen = torch.Generator(device="cuda").manual_seed(rows)
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    out1, out2 = (torch.zeros(rows, dtype=torch.int64, device="cuda") for _ in range(2))
    for it in range(launches):                            # changing lengths, some padding rows
        lens = torch.randint(0, MAX_LEN - 1, (rows,), generator=gen, device="cuda", dtype=torch.int32)
        if it % 5 == 0:
            lens[0] = 0
        tokens = torch.randint(0, model.spec.vocab_size, (rows,), generator=gen, device="cuda")
        one.launch(tokens, lens, table, out1, err)
        grid.launch(tokens, lens, table, out2, err)
        torch.cuda.synchronize()
        live = lens > 0
        assert torch.equal(one.logits[live], grid.logits[live]), f"launch {it}: logits differ"
        assert torch.equal(out1[live], out2[live]), f"launch {it}: tokens differ"
        assert int(grid.counters.abs().sum()) == 0 and int(one.counters.abs().sum()) == 0 and int(err) == 0
    for c1, c2 in zip(caches_one, caches_grid):            # the appended K/V too
        assert torch.equal(c1.k, c2.k) and torch.equal(c1.v, c2.v)


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def test_grid_equals_one_program():
    _compare(random_model("1b"), 4, 1, _sms(), 1, prefetch=1)       # one SM streams it all: seconds


# (kernels compile per rows / prefetch / geometry: these share them with the tests below)
@pytest.mark.parametrize("name,rows,prefetch", [("1b", 1, 1), ("1b", 16, 1), ("1b", 4, 0), ("8b", 1, 1),
                                                ("8b", 16, 1)])
def test_grids_agree(name, rows, prefetch):
    _compare(random_model(name), rows, _sms() // 3 + 1, _sms(), 20, prefetch)


def test_graph_replays_many_times():
    model = random_model("1b")
    rows = 4
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = _caches(model, rows)
    # ref reads the same pages: it writes the same new K/V where the replay just did
    step, ref = _step(model, caches, rows, sms), _step(model, caches, rows, sms // 3 + 1)
    table = torch.arange(rows * MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(rows, -1)
    lens = torch.full((rows,), 100, dtype=torch.int32, device="cuda")
    tokens = torch.zeros(rows, dtype=torch.int64, device="cuda")
    out = torch.zeros(rows, dtype=torch.int64, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    step.launch(tokens, lens, table, out, err)             # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.launch(tokens, lens, table, out, err)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for it in range(2000):
        lens.copy_(torch.randint(1, MAX_LEN - 1, (rows,), generator=gen, device="cuda", dtype=torch.int32))
        tokens.copy_(torch.randint(0, 128256, (rows,), generator=gen, device="cuda"))
        graph.replay()
        if it % 250 == 0:
            got = out.clone()
            torch.cuda.synchronize()
            assert int(step.counters.abs().sum()) == 0 and int(err) == 0, f"replay {it}"
            ref_out = torch.zeros_like(out)
            ref.launch(tokens, lens, table, ref_out, err)
            torch.cuda.synchronize()
            assert torch.equal(got, ref_out) and torch.equal(step.logits, ref.logits), f"replay {it}"
    torch.cuda.synchronize()
    assert int(step.counters.abs().sum()) == 0 and int(err) == 0


def test_watchdog_flags_a_stall():
    model = random_model("1b")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    step = _step(model, _caches(model, 1), 1, sms, spin_limit=1000)
    step.units[-1, F_TARGET] = 1 << 30                     # a wait no producer can meet
    table = torch.arange(MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(1, -1)
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    step.launch(torch.zeros(1, dtype=torch.int64, device="cuda"), torch.full((1,), 9, dtype=torch.int32, device="cuda"),
                table, out, err)
    torch.cuda.synchronize()
    assert int(err) & ERR_STALL
    assert int(step.counters.abs().sum()) == 0             # reset even after a stall


def test_timing_against_the_floor():
    """Prints device µs per persistent step (1B shape, 2 layers) at 1 / 16 rows (pytest -s)."""
    from graphrt.kernels.timing import graph_us
    model = random_model("1b")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows in (1, 16):
        step = _step(model, _caches(model, rows), rows, sms)
        table = torch.arange(rows * MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(rows, -1)
        lens = torch.full((rows,), 1024, dtype=torch.int32, device="cuda")
        tokens = torch.zeros(rows, dtype=torch.int64, device="cuda")
        out = torch.zeros(rows, dtype=torch.int64, device="cuda")
        err = torch.zeros(1, dtype=torch.int32, device="cuda")
        us = graph_us(lambda: step.launch(tokens, lens, table, out, err), 5, 3)
        w = model.weights
        nbytes = sum(t.numel() * 2 for layer in w.layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down))
        nbytes += w.lm_head.numel() * 2 + rows * 1024 * 2 * model.spec.num_layers * 2 * 8 * 64 * 2
        print(f"persistent step 1b-shape 2 layers rows {rows}: {us:.1f} us, {nbytes / us / 1e6:.2f} TB/s")
        assert int(err) == 0
