"""tools/bench_e2e.py --weights: the int4 kinds (RTN g128 asymmetric / symmetric / with the head),
their streamed-bytes floor (packed codes + scales + zeros + the float LM head), and a bad kind
as an argparse error (exit 2) naming the flag, as is an unknown --variants name (the persistent
variants with FP8 / int4 weights parse); the --int4-kernels grid (one line per config, one
column per shape and batch, the default and the fastest marked)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import bench_e2e  # noqa: E402
from graphrt.model.quant.int4 import Int4Weight  # noqa: E402


def test_int4_weights_and_their_floor_bytes():
    from graphrt.model import LlamaDecoder, LlamaSpec
    from graphrt.model.weights import LayerWeights, ModelWeights
    h, inter, v = 128, 256, 64
    spec = LlamaSpec(vocab_size=v, hidden_size=h, intermediate_size=inter, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e4,
                     tie_word_embeddings=False, attention_bias=False, max_position_embeddings=64)
    r = lambda *s: torch.randn(s).bfloat16()  # noqa: E731
    layer = LayerWeights(input_norm=r(h), post_attn_norm=r(h), qkv=r(256, h), qkv_bias=None, q_norm=None,
                         k_norm=None, o=r(h, 128), gate_up=r(2 * inter, h), down=r(h, inter))
    model = LlamaDecoder(spec, ModelWeights(embed=r(v, h), final_norm=r(h), lm_head=r(v, h), layers=(layer,)))
    params = 256 * h + h * 128 + 2 * inter * h + h * inter
    groups = params // 128
    for kind, zeros, head in (("int4", 1, False), ("int4-sym", 0, False), ("int4-head", 1, True)):
        m4, nbytes = bench_e2e.with_weights(model, kind, torch)
        assert isinstance(m4.weights.layers[0].down, Int4Weight)
        assert isinstance(m4.weights.lm_head, Int4Weight) == head
        head_bytes = (v * h // 2 + v * (h // 128) * (2 + zeros)) if head else v * h * 2
        assert nbytes == params // 2 + groups * (2 + zeros) + head_bytes
    assert bench_e2e.parse_args(["--weights", "bf16,fp8,int4"]).weights == "bf16,fp8,int4"


def test_persistent_variants_with_quantized_weights_parse():
    a = bench_e2e.parse_args(["--weights", "fp8,int4", "--variants", "graphrt,graphrt-persistent"])
    assert a.weights == "fp8,int4" and a.variants == "graphrt,graphrt-persistent"


def test_bad_variant_exits_2():
    out = subprocess.run([sys.executable, str(TOOLS / "bench_e2e.py"), "--variants", "graphrt,graphrt-fused"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--variants: 'graphrt-fused' is not one of" in out.stderr


def test_bad_weights_kind_exits_2():
    out = subprocess.run([sys.executable, str(TOOLS / "bench_e2e.py"), "--weights", "bf16,int3"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--weights: 'int3' is not one of" in out.stderr


def test_int4_kernel_grid_marks_default_and_fastest(capsys):
    rows = []
    for shape in ("o", "down"):
        for kind in ("bf16", "int4"):
            times = {"cublas": 9.0, "triton-gemv-n16": 8.0} if kind == "bf16" else \
                {"cublas": 30.0, "cfg-a": 3.5, "cfg-b": 3.0 if shape == "o" else 4.0}
            best = min(times, key=times.get)
            rows.append(dict(model="llama-3.1-8b", shape=shape, n=4096, k=4096, weights=kind, batch=1, best=best,
                             best_us=times[best], floor_us=2.0, best_over_floor=times[best] / 2, times_us=times,
                             default=None if kind == "bf16" else "cfg-a",
                             default_us=None if kind == "bf16" else times["cfg-a"]))
    bench_e2e.print_int4_grid(rows)
    out = capsys.readouterr().out.splitlines()
    grid = {line.split()[0]: line.split()[1:] for line in out if line.startswith(("cfg-", "dequantize"))}
    assert grid["cfg-a"] == ["3.5*", "3.5!*"] and grid["cfg-b"] == ["3.0!", "4.0"]
    assert grid["dequantize"] == ["+", "cublas", "30.0", "30.0"]
    assert any(line.startswith("bf16 best / int4 default") and "2.29" in line for line in out)
