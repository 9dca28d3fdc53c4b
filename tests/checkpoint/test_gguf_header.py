"""graphrt/checkpoint/gguf_header.py against the `gguf` package's own GGUFReader (an independent
reading of the format): every metadata value, every tensor's name, type, shape, offset, length and
bytes, on files the package writes (every value type, arrays of strings, numbers and bools, F32 /
F16 / BF16 / quantized tensors, a non-default alignment) and on the real model's file; malformed
headers are one-line ValueErrors."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from _real_model import smollm2_gguf  # noqa: F401 (a fixture)
from graphrt.checkpoint.gguf_header import read_header

gguf = pytest.importorskip("gguf")


def _same_as_reader(path):
    h, r = read_header(path), gguf.GGUFReader(str(path))
    assert list(h.fields) == list(r.fields)
    for key, f in r.fields.items():
        assert h.fields[key] == f.contents(), key
        assert type(h.fields[key]) is type(f.contents()), key
    assert [t.name for t in h.tensors] == [t.name for t in r.tensors]
    for a, b in zip(h.tensors, r.tensors):
        assert (a.tensor_type, a.shape, a.n_elements, a.n_bytes, a.data_offset) == \
            (b.tensor_type, tuple(int(d) for d in b.shape), int(b.n_elements), int(b.n_bytes), int(b.data_offset)), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data.view(np.uint8), b.data.view(np.uint8)), a.name
    return h


def _write(path, alignment=None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_uint32("general.alignment", alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -3000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2 ** 63 + 5)
    w.add_int64("t.i64", -(2 ** 62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.strs", ["", "a", "Ġthe", "<|im_end|>", "日本"] * 50)
    w.add_array("t.ints", list(range(-3, 300)))
    w.add_array("t.floats", [0.5, -1.25, 3.0])
    w.add_array("t.bools", [True, False, True])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((64,)).astype(np.float16))
    w.add_tensor("bf16", rng.integers(0, 255, (2, 128), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.BF16)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K]
    w.add_tensor("q4k", rng.integers(0, 255, (4, 512 // block * size), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_and_tensor_equals_the_gguf_reader(tmp_path, alignment):
    h = _same_as_reader(_write(tmp_path / "x.gguf", alignment))
    assert h.version == 3 and h.fields["t.strs"][3] == "<|im_end|>" and h.fields["t.u64"] == 2 ** 63 + 5
    assert all(t.data_offset % (alignment or 32) == 0 for t in h.tensors)


@pytest.mark.real_model
def test_the_real_models_header_equals_the_gguf_reader(smollm2_gguf):
    h = _same_as_reader(smollm2_gguf)
    assert len(h.fields["tokenizer.ggml.tokens"]) == 49152 and h.fields["general.architecture"] == "llama"


def test_malformed_headers_are_one_line(tmp_path):
    good = _write(tmp_path / "x.gguf").read_bytes()

    def bad(data: bytes, needle: str):
        p = tmp_path / "bad.gguf"
        p.write_bytes(data)
        with pytest.raises(ValueError, match=needle) as e:
            read_header(p)
        assert "\n" not in str(e.value)

    bad(b"GGML" + good[4:], "not a GGUF file")
    bad(good[:4] + struct.pack("<I", 1) + good[8:], "version 1")
    bad(good[:10], "truncated")
    start = good.index(b"t.strs")                        # inside the array of strings
    bad(good[:start + 200], "truncated: metadata 't.strs'")
    at = good.index(b"t.u8") + 4                         # t.u8's value type -> 99
    bad(good[:at] + struct.pack("<I", 99) + good[at + 4:], "unknown value type 99")
