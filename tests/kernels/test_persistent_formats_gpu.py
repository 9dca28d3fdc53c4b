"""GPU tests of the persistent decode step with quantized weights (graphrt/kernels/persistent/
formats.py; gemv_tile.py's FP8 and int4 variants), random bf16 models at Llama-3.2-1B / 3.1-8B
layer shapes (2 layers, the full vocabulary) quantized on the GPU: FP8 per-channel (the LM head
FP8 where it is untied, 8B) and int4 group 128 (asymmetric, bf16 LM head; symmetric with an int4
LM head, 8B, against the reference). The kernel builds are shared between the tests (one split
count, the default prefetch) to keep the compile time down.
Against a float32 torch reference of the step over the dequantized weights (short contexts: the
reference walks the cache per position) within two bf16 steps of the logits; the full grid
against a third as many programs at the same KV split count, bit for bit, launch after launch
with changing lengths; the shared-memory ring against the registers; a CUDA graph replayed 500
times, counters back at zero; and the step's time against its bytes (pytest -s prints
µs per step beside the bf16 model's, and TB/s over weight + KV bytes).

Run on the GPU machine: python -m pytest -m gpu -q -s tests/kernels/test_persistent_formats_gpu.py
"""
from __future__ import annotations

import types

import pytest
import torch

from graphrt.kernels.persistent import Tiles
from graphrt.model import LlamaDecoder
from graphrt.model.fp8_weights import dequantize_weights, quantize_weights
from graphrt.model.int4_weights import quantize_weights_int4
from _persistent_models import (MAX_LEN, PAGE, assert_logits_close, compare_grids, gpu_caches, make_step, random_model,
                                sms)
from _persistent_reference import reference_step

pytestmark = pytest.mark.gpu
TILES = Tiles(splits=4)                   # one split count: the builds below are shared


def quantized(name: str, kind: str) -> LlamaDecoder:
    m = random_model(name)
    w = {"bf16": lambda: m.weights,
         "fp8": lambda: quantize_weights(m.weights, m.spec, "channel", lm_head=True),
         "int4": lambda: quantize_weights_int4(m.weights, group_size=128),
         "int4-sym": lambda: quantize_weights_int4(m.weights, group_size=128, symmetric=True, lm_head=True)}[kind]()
    return LlamaDecoder(m.spec, w)


def _inputs(rows, lens, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    table = torch.arange(rows * MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(rows, -1)
    tokens = torch.randint(0, 128256, (rows,), generator=gen, device="cuda")
    return table, torch.tensor(lens, dtype=torch.int32, device="cuda"), tokens


@pytest.mark.parametrize("name,kind", [("1b", "fp8"), ("1b", "int4"), ("8b", "int4-sym")])
def test_against_float32_reference(name, kind):
    model = quantized(name, kind)
    rows = 4
    caches = gpu_caches(model, rows)
    before = [c.__class__(c.k.clone(), c.v.clone()) for c in caches]
    step = make_step(model, caches, rows, sms(), tiles=TILES)
    table, lens, tokens = _inputs(rows, [40, 1, 17, 33])
    out = torch.zeros(rows, dtype=torch.int64, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    step.launch(tokens, lens, table, out, err)
    torch.cuda.synchronize()
    ref = types.SimpleNamespace(spec=model.spec, weights=dequantize_weights(model.weights), cos_sin=model.cos_sin)
    logits, _ = reference_step(ref, before, table.cpu(), lens.cpu(), tokens.cpu())
    want = torch.stack(logits)
    d = assert_logits_close(step.logits, want)
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * d
    assert torch.equal(out[clear], want.argmax(dim=-1)[clear]) and int(err) == 0
    assert int(step.counters.abs().sum()) == 0
    print(f"{name} {kind}: max |logit diff| per row {[round(x, 3) for x in d.tolist()]}")


@pytest.mark.parametrize("name,kind,rows", [("1b", "fp8", 1), ("1b", "int4", 1), ("8b", "fp8", 16), ("8b", "int4", 16)])
def test_grids_agree(name, kind, rows):
    compare_grids(quantized(name, kind), rows, sms() // 3 + 1, sms(), 20, prefetch=1)


@pytest.mark.parametrize("kind", ["fp8", "int4"])
def test_ring_equals_registers(kind):
    compare_grids(quantized("1b", kind), 4, sms(), sms(), 10, prefetch=1, stages=(0, 8))


@pytest.mark.parametrize("kind", ["fp8", "int4"])
def test_graph_replays(kind):
    model = quantized("1b", kind)
    rows = 4
    caches = gpu_caches(model, rows)
    step = make_step(model, caches, rows, sms(), tiles=TILES)
    ref = make_step(model, caches, rows, sms() // 3 + 1, tiles=TILES)
    table, lens, tokens = _inputs(rows, [100] * rows)
    out = torch.zeros(rows, dtype=torch.int64, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    step.launch(tokens, lens, table, out, err)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.launch(tokens, lens, table, out, err)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for it in range(500):
        lens.copy_(torch.randint(1, MAX_LEN - 1, (rows,), generator=gen, device="cuda", dtype=torch.int32))
        tokens.copy_(torch.randint(0, 128256, (rows,), generator=gen, device="cuda"))
        graph.replay()
        if it % 100 == 0:
            got = out.clone()
            ref_out = torch.zeros_like(out)
            ref.launch(tokens, lens, table, ref_out, err)
            torch.cuda.synchronize()
            assert torch.equal(got, ref_out) and torch.equal(step.logits, ref.logits), f"replay {it}"
            assert int(step.counters.abs().sum()) == 0 and int(err) == 0, f"replay {it}"


def _streamed(model) -> int:
    """Weight bytes a step streams (data + scales + zeros; the model dtype's 2 bytes an element)."""
    def nbytes(t):
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else t.nbytes
    w = model.weights
    return sum(nbytes(getattr(x, f)) for x in w.layers for f in ("qkv", "o", "gate_up", "down")) + nbytes(w.lm_head)


@pytest.mark.parametrize("name", ["1b", "8b"])
def test_timing(name):
    """Device µs per persistent step, bf16 / FP8 / int4 at 1 and 16 rows (2 layers, context
    1024), with TB/s over the weight and KV bytes (pytest -s)."""
    from graphrt.kernels.timing import graph_us
    for kind in ("bf16", "fp8", "int4"):
        model = quantized(name, kind)
        for rows in (1, 16):
            step = make_step(model, gpu_caches(model, rows), rows, sms(), tiles=TILES)
            table, lens, tokens = _inputs(rows, [1024] * rows)
            out = torch.zeros(rows, dtype=torch.int64, device="cuda")
            err = torch.zeros(1, dtype=torch.int32, device="cuda")
            us = graph_us(lambda: step.launch(tokens, lens, table, out, err), 5, 3)
            s = model.spec
            kv = rows * 1024 * 2 * s.num_layers * s.num_kv_heads * s.head_dim * 2
            nbytes = _streamed(model) + kv
            print(f"persistent step {name}-shape 2 layers {kind} rows {rows}: {us:.1f} us, "
                  f"{nbytes / us / 1e6:.2f} TB/s over {nbytes / 1e6:.1f} MB")
            assert int(err) == 0
