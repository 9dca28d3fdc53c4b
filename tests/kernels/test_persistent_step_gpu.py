"""GPU tests of the persistent decode step's kernel (graphrt/kernels/persistent/), random bf16
weights at Llama-3.2-1B / 3.1-8B layer shapes (2 layers, the full vocabulary): the grid of one
program per SM against one program (which runs the units in schedule order and never waits)
and against a grid of a third as many programs, at the same KV split count S: the same logits,
tokens and appended K/V bit for bit (each unit computes the same values in the same order
whichever program runs it, so any stale read or lost ordering shows), launch after launch with
changing lengths, eagerly and replayed 2000 times from a CUDA graph, every counter back at zero
and no watchdog flag. The default S follows the grid (schedule.default_splits): grids at their
own default S agree within bf16 rounding of the attention merge, tokens equal at a clear margin.
A step whose wait can never be met sets ERR_STALL and returns (the watchdog) instead of hanging;
the timeline (timeline=True) stamps every unit in order and gives the same logits. The
shared-memory weight ring (stages > 0: the wait inside the GEMV loop, after the ring's first
chunks) on the full grid gives the register form's bits, and its spin has the same watchdog.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/kernels/test_persistent_step_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.persistent import ERR_STALL, Tiles
from graphrt.kernels.persistent.schedule import F_TARGET
from graphrt.kernels.persistent.timeline import summarize, unit_bytes
from _persistent_models import (MAX_LEN, PAGE, assert_logits_close, compare_grids as _compare, gpu_caches as _caches,
                                make_step as _step, random_model, sms as _sms)

pytestmark = pytest.mark.gpu

def test_grid_equals_one_program():
    _compare(random_model("1b"), 4, 1, _sms(), 1, prefetch=1)       # one SM streams it all: seconds


# (kernels compile per rows / prefetch / geometry: these share them with the tests below)
@pytest.mark.parametrize("name,rows,prefetch", [("1b", 1, 1), ("1b", 16, 1), ("8b", 1, 1), ("8b", 16, 1)])
def test_grids_agree(name, rows, prefetch):
    _compare(random_model(name), rows, _sms() // 3 + 1, _sms(), 20, prefetch)


@pytest.mark.parametrize("rows,stages", [(1, 8), (4, 4), (16, 8)])
def test_ring_equals_registers(rows, stages):
    """The shared-memory ring on the full grid: the same float32 operations as the register form,
    so the same bits; a read before its wait (a weight-stream prologue that took an activation
    with it) would differ."""
    _compare(random_model("1b"), rows, _sms(), _sms(), 20, prefetch=1, stages=(0, stages))


def test_split_counts_agree_closely():
    """S = 4 and S = 1 (what the default gives a 132- and a 1-program grid): logits within bf16
    rounding, tokens equal at a clear margin."""
    model = random_model("1b")
    rows = 4
    sms = _sms()
    a = _step(model, _caches(model, rows), rows, sms, tiles=Tiles(splits=4))
    b = _step(model, _caches(model, rows), rows, sms, tiles=Tiles(splits=1))
    table = torch.arange(rows * MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(rows, -1)
    lens = torch.tensor([1500, 700, 33, 1900], dtype=torch.int32, device="cuda")
    tokens = torch.tensor([5, 77, 1000, 128000], device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    out1, out2 = (torch.zeros(rows, dtype=torch.int64, device="cuda") for _ in range(2))
    a.launch(tokens, lens, table, out1, err)
    b.launch(tokens, lens, table, out2, err)
    torch.cuda.synchronize()
    la, lb = a.logits.float(), b.logits.float()
    diff = (la - lb).abs().max(dim=-1).values
    print(f"S {a.schedule.splits} vs {b.schedule.splits}: max |logit diff| per row {diff.tolist()}")
    assert_logits_close(lb, la)
    top2 = la.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * diff
    assert torch.equal(out1[clear], out2[clear]) and int(err) == 0


def test_timeline():
    """timeline=True: every unit stamped start <= waited <= end, in program order, the same logits."""
    model = random_model("1b")
    rows, sms = 1, _sms()
    caches = _caches(model, rows)
    plain = _step(model, caches, rows, sms, tiles=Tiles(splits=4))
    timed = _step(model, caches, rows, sms, tiles=Tiles(splits=4), timeline=True)
    table = torch.arange(MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(1, -1)
    lens = torch.tensor([1024], dtype=torch.int32, device="cuda")
    tokens = torch.tensor([9], device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    plain.launch(tokens, lens, table, out, err)
    timed.launch(tokens, lens, table, out, err)            # same pages, same new K/V
    torch.cuda.synchronize()
    assert torch.equal(plain.logits, timed.logits) and int(err) == 0
    tl = timed.timeline.cpu()
    s = timed.schedule
    n = len(s.units)
    assert bool((tl[:n, 0] > 0).all()) and bool((tl[:n, 0] <= tl[:n, 1]).all()) and bool((tl[:n, 1] <= tl[:n, 2]).all())
    for p in range(s.programs):
        seg = tl[s.starts[p]:s.starts[p + 1]]
        assert bool((seg[:, 3] == p).all()) and bool((seg[1:, 0] >= seg[:-1, 2]).all())
    r = summarize(s, tl, unit_bytes(s, [1024], kv_bytes=2))
    print({k: round(v["us_per_unit"], 2) for k, v in r["kinds"].items()}, "span", round(r["span_us"], 1),
          "timer step ns", r["timer_step_ns"])
    assert r["span_us"] > 0


def test_graph_replays_many_times():
    model = random_model("1b")
    rows = 4
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    caches = _caches(model, rows)
    # ref reads the same pages: it writes the same new K/V where the replay just did; both S = 4
    step = _step(model, caches, rows, sms, tiles=Tiles(splits=4))
    ref = _step(model, caches, rows, sms // 3 + 1, tiles=Tiles(splits=4))
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


@pytest.mark.parametrize("stages", [0, 8])
def test_watchdog_flags_a_stall(stages):
    model = random_model("1b")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    step = _step(model, _caches(model, 1), 1, sms, spin_limit=1000, tiles=Tiles(splits=4),   # a build shared above
                 stages=stages)
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
        step = _step(model, _caches(model, rows), rows, sms, tiles=Tiles(splits=4))
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
