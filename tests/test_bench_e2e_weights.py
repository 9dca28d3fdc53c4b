"""tools/bench_e2e.py --weights: the int4 kinds (RTN g128 asymmetric / symmetric / with the head),
their streamed-bytes floor (packed codes + scales + zeros + the float LM head), and a bad kind
as an argparse error (exit 2) naming the flag."""
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


def test_bad_weights_kind_exits_2():
    out = subprocess.run([sys.executable, str(TOOLS / "bench_e2e.py"), "--weights", "bf16,int3"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--weights: 'int3' is not one of" in out.stderr
