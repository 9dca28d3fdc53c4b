"""graphrt/checkpoint/gguf_quants.py and GGUFTensors.tensor's torch path: every GGML type with a
torch dequantizer equals the `gguf` package's NumPy `dequantize` (the independent reference) bit for
bit on random raw blocks (fp16 scale fields finite), one block to many CPU steps; rows / columns
read through a GGUF file equal the reference's slices (llama q / k unpermuted), also written into
a destination (`out`, float32 directly or cast); a type without a torch dequantizer still goes
through the package; bad input is one ValueError naming it."""
from __future__ import annotations


import gguf
import numpy as np
import pytest
import torch

import graphrt.checkpoint.gguf_quants as gq
from _checkpoints import tool_module
from _real_model import smollm2_gguf  # noqa: F401 (a fixture)
from graphrt.checkpoint.gguf_file import GGUFFile, open_gguf
from graphrt.checkpoint.gguf_tensors import GGUFTensors, unpermute_rope_rows
from graphrt.checkpoint.hf_files import CheckpointError

KINDS = sorted(gq.BLOCKS)


def _random_blocks():
    return tool_module("bench_gguf_load").random_blocks


random_blocks = _random_blocks()


def _reference(raw: np.ndarray, kind: str) -> torch.Tensor:
    qt = gguf.GGMLQuantizationType[kind]
    typed = raw.view({"F32": np.float32, "F16": np.float16}.get(kind, np.uint8))
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(typed, qt), dtype=np.float32))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype == torch.float32 and \
        torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def test_blocks_are_ggml_sizes():
    for kind, size in gq.BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]] == size, kind


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows, blocks", [(1, 1), (3, 5), (64, 8)])
def test_equals_gguf_dequantize_bit_for_bit(kind, rows, blocks):
    raw = random_blocks(kind, rows, blocks * gq.BLOCKS[kind][0], seed=rows * 31 + blocks)
    got = gq.dequantize(torch.from_numpy(raw), kind)
    assert _same_bits(got, _reference(raw, kind).reshape(got.shape)), kind
    if kind not in ("F32", "BF16"):                                        # finite scales: real values compared
        assert bool(torch.isfinite(got).all()) and bool((got != 0).any()), kind
    flat = gq.dequantize(torch.from_numpy(raw.reshape(-1)), kind)          # 1-D: the same weights
    assert _same_bits(flat, got.reshape(-1))


@pytest.mark.parametrize("kind", KINDS)
def test_many_cpu_steps(kind, monkeypatch):
    """A tensor over several CPU steps (a step of 1 to 3 blocks, and the real step size)."""
    weights = gq.BLOCKS[kind][0]
    raw = random_blocks(kind, 7, 9 * weights, seed=5)
    want = _reference(raw, kind).reshape(7, 9 * weights)
    for step in (weights, 3 * weights - 1, gq.CPU_STEP):
        monkeypatch.setattr(gq, "CPU_STEP", step)
        assert _same_bits(gq.dequantize(torch.from_numpy(raw), kind), want), (kind, step)


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0", "Q5_0"])
def test_a_large_tensor_equals_gguf(kind):
    weights = gq.BLOCKS[kind][0]
    cols = 2048
    rows = -(-(gq.CPU_STEP * 2 + 3 * weights) // cols)                    # over two CPU steps and a tail
    raw = random_blocks(kind, rows, cols, seed=11)
    assert _same_bits(gq.dequantize(torch.from_numpy(raw), kind), _reference(raw, kind).reshape(rows, cols))


@pytest.mark.parametrize("kind", ["Q4_1", "Q6_K", "F16"])
def test_into_out(kind):
    raw = random_blocks(kind, 6, 2 * gq.BLOCKS[kind][0] * (16 if gq.BLOCKS[kind][0] == 1 else 1), seed=4)
    want = _reference(raw, kind).reshape(6, -1)
    out = torch.full_like(want, float("nan"))
    assert gq.dequantize(torch.from_numpy(raw), kind, out=out) is out and _same_bits(out, want)
    for bad in (torch.empty(6, want.shape[1], dtype=torch.float16), torch.empty(5, want.shape[1]),
                torch.empty(want.shape[1], 6).t()):
        with pytest.raises(ValueError, match="out: expected a contiguous float32 tensor of shape"):
            gq.dequantize(torch.from_numpy(raw), kind, out=bad)


def test_bad_input_is_one_value_error():
    raw = torch.zeros(2, 18, dtype=torch.uint8)
    with pytest.raises(ValueError, match="kind: 'IQ4_NL' has no torch dequantizer"):
        gq.dequantize(raw, "IQ4_NL")
    with pytest.raises(ValueError, match="raw: expected uint8 bytes, got torch.int8"):
        gq.dequantize(raw.view(torch.int8), "Q4_0")
    with pytest.raises(ValueError, match=r"raw: the last dimension \(17\) is not whole Q4_0 blocks of 18 bytes"):
        gq.dequantize(raw[:, :17], "Q4_0")
    with pytest.raises(ValueError, match="a scalar"):
        gq.dequantize(torch.tensor(1, dtype=torch.uint8), "Q8_0")


def _write(path, tensors: dict) -> GGUFTensors:
    """A GGUF of raw tensors {gguf name: (kind, raw uint8 [rows, bytes] or float array)}, read back."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (kind, raw) in tensors.items():
        if kind in ("F32", "F16"):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFTensors(GGUFFile(path), {"num_attention_heads": 4, "num_key_value_heads": 2})


@pytest.mark.parametrize("kind", [*KINDS, "IQ4_NL"])
def test_gguf_tensors_rows_and_columns(tmp_path, kind):
    """Through a GGUF file: whole tensors, rows (the raw blocks of those rows), columns at and off
    block boundaries, a 1-D tensor's elements; q / k rows unpermuted before the cut."""
    weights = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][0]
    cols = 3 * max(weights, 32)
    heads, kv, d = 4, 2, 8
    fp16_at = (0,) if kind == "IQ4_NL" else None                          # IQ4_NL: d, qs[16]
    raws = {n: random_blocks(kind, r, cols, seed=i, fp16_at=fp16_at) for i, (n, r) in
            enumerate((("attn_q", heads * d), ("attn_k", kv * d), ("ffn_up", 24)))}
    one_d = random_blocks(kind, 1, cols, seed=9, fp16_at=fp16_at).reshape(-1)
    typed = {"F32": np.float32, "F16": np.float16}.get(kind)
    as_file = (lambda r: r.view(typed)) if typed else (lambda r: r)
    tensors = _write(tmp_path / f"{kind}.gguf",
                     {**{f"blk.0.{n}.weight": (kind, as_file(r)) for n, r in raws.items()},
                      "blk.0.attn_q.bias": (kind, as_file(one_d))})
    for n, r in raws.items():
        hf = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "ffn_up": "mlp.up_proj"}[n]
        want = _reference(r, kind).reshape(r.shape[0], cols)
        if n != "ffn_up":
            want = unpermute_rope_rows(want, heads if n == "attn_q" else kv)
        name = f"model.layers.0.{hf}.weight"
        assert tensors.header(name)[1] == (r.shape[0], cols)
        assert _same_bits(tensors.tensor(name), want), name
        assert _same_bits(tensors.tensor(name, rows=(3, 11)), want[3:11]), name
        assert _same_bits(tensors.tensor(name, rows=(5, 5)), want[5:5]), name
        for a, b in ((0, cols), (weights, 2 * weights), (1, cols - 1), (weights + 3, weights + 4)):
            assert _same_bits(tensors.tensor(name, cols=(a, b)), want[:, a:b]), (name, a, b)
            out = torch.full((want.shape[0], b - a), float("nan"))             # into a destination
            assert tensors.tensor(name, cols=(a, b), out=out) is out and _same_bits(out, want[:, a:b])
        out = torch.empty(8, cols, dtype=torch.bfloat16)
        assert tensors.tensor(name, rows=(3, 11), out=out) is out
        assert torch.equal(out.view(torch.int16), want[3:11].bfloat16().view(torch.int16))   # the cast, bits
        with pytest.raises(CheckpointError, match=r"read shape \[8, \d+\], its destination has \[8, 1\]"):
            tensors.tensor(name, rows=(3, 11), out=torch.empty(8, 1))
    bias = _reference(one_d, kind).reshape(-1)
    assert _same_bits(tensors.tensor("model.layers.0.self_attn.q_proj.bias"), unpermute_rope_rows(bias, heads))
    assert _same_bits(tensors.tensor("model.layers.0.self_attn.q_proj.bias", rows=(5, 40)),
                      unpermute_rope_rows(bias, heads)[5:40])
    out = torch.empty(35)
    assert tensors.tensor("model.layers.0.self_attn.q_proj.bias", rows=(5, 40), out=out) is out
    assert _same_bits(out, unpermute_rope_rows(bias, heads)[5:40])


@pytest.mark.real_model
def test_real_file_equals_gguf(smollm2_gguf):
    """Every tensor of SmolLM2-135M-Instruct Q4_1 (Q4_1, Q8_0, F32) read through GGUFTensors equals
    the package's dequantization of the same bytes (q / k unpermuted), bit for bit; row halves too."""
    g = open_gguf(smollm2_gguf)
    raw, _ = g.config()
    tensors = GGUFTensors(g, raw)
    kinds = set()
    for name in sorted(tensors.names):
        t = g.tensors[tensors.files[name]]
        kinds.add(t.tensor_type.name)
        shape = tensors.header(name)[1]
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        want = torch.from_numpy(np.array(want, dtype=np.float32)).reshape(shape)
        for proj, heads in (("q_proj", raw["num_attention_heads"]), ("k_proj", raw["num_key_value_heads"])):
            if f"self_attn.{proj}." in name:
                want = unpermute_rope_rows(want, heads)
        assert _same_bits(tensors.tensor(name), want), name
        half = shape[0] // 2
        assert _same_bits(tensors.tensor(name, rows=(half, shape[0])), want[half:]), name
    assert {"Q4_1", "Q8_0", "F32"} <= kinds


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_equals_gguf_on_cuda(kind):
    raw = random_blocks(kind, 96, 4 * gq.BLOCKS[kind][0] * (8 if gq.BLOCKS[kind][0] == 1 else 1), seed=3)
    got = gq.dequantize(torch.from_numpy(raw).cuda(), kind)
    assert got.is_cuda and _same_bits(got.cpu(), _reference(raw, kind).reshape(got.shape)), kind
