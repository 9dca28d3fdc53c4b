"""GPU tests of FP8 weights (H200, CUDA graphs, FlashInfer): an 8B-shaped 2-layer checkpoint
written as compressed-tensors per-channel and as transformers fp8 with 128 x 128 blocks, and
`quantization="fp8"` on the bf16 original; greedy tokens vs HF float32 with the dequantized
weights (up to bf16 ties), batch 8 and batch 1. Per-channel weights run W8A8 (activations
quantized per row at every GEMM input): the reference is then HF in float32 made to round where
graphrt's bf16 W8A8 step rounds (`_mirror_w8a8`: each linear layer's input quantized per row to
e4m3, the GEMM outputs, the attention output, the residual stream and the final norm stored in
bf16), so only bf16 ties remain; block-scaled weights run weight-only (FP8 GEMV).

Run on the GPU machine: python -m pytest -m gpu -q tests/model/test_fp8_gpu.py -s
"""
from __future__ import annotations

import pytest
import torch

from _checkpoints import BF16_GAP, assert_greedy_matches_hf
from _fp8_checkpoints import write_fp8
from graphrt import LLM, SamplingParams
from graphrt.model.quant import Fp8Weight

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def src(ckpt_8b):
    return ckpt_8b


def _fake_quant_rows(x):
    """Per-row e4m3 round trip (scale = amax / 448), float32: what graphrt's W8A8 GEMMs read."""
    s = (x.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
    return (x / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s


def _bf16(x):
    return x.to(torch.bfloat16).float()


def _mirror_w8a8(hf) -> None:
    """Forward hooks on HF float32 so it rounds where graphrt's bf16 W8A8 step rounds: every
    quantized linear layer reads its input quantized per row to e4m3 (from float32, as the norms
    and SiLU-mul write it; the attention output is bf16 first) and writes a bf16 output (the FP8
    GEMM's bf16 accumulator); the residual stream is stored in bf16 (each norm reads a bf16
    input, each decoder layer returns bf16), and the final norm's output is bf16 (the bf16 LM
    head reads it). Then the W8A8 arithmetic itself is in the reference and greedy tokens may
    differ from graphrt's only at bf16 ties."""
    def quant_in(name):
        if name.endswith("o_proj"):
            return lambda m, args: (_fake_quant_rows(_bf16(args[0])),)
        return lambda m, args: (_fake_quant_rows(args[0]),)
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            mod.register_forward_pre_hook(quant_in(name))
            mod.register_forward_hook(lambda m, args, out: _bf16(out))
        elif name.endswith(("input_layernorm", "post_attention_layernorm")) or name == "model.norm":
            mod.register_forward_pre_hook(lambda m, args: (_bf16(args[0]),) + tuple(args[1:]))
    hf.model.norm.register_forward_hook(lambda m, args, out: _bf16(out))
    for layer in hf.model.layers:
        layer.register_forward_hook(
            lambda m, args, out: (_bf16(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else _bf16(out))


def _prompts(n, gen):
    lens = torch.randint(1, 8, (n,), generator=gen).tolist()
    return [torch.randint(2, 128256, (m,), generator=gen).tolist() for m in lens]


@pytest.mark.parametrize("kind,strategy", [("compressed-tensors", "channel"), ("fp8", "block"), ("quantize", None)])
def test_fp8_greedy_equals_hf_over_dequantized_weights(src, tmp_path, kind, strategy):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    if kind == "quantize":
        llm = LLM(src, device="cuda", max_batch=8, steps_per_graph=4, max_model_len=1024,
                  quantization="fp8")
        w = llm.checkpoint.weights
        for i, layer in enumerate(w["layers"]):      # truth: graphrt's own per-channel weights
            p = f"model.layers.{i}."
            for field, names in (("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                                 ("gate_up", ("mlp.gate_proj", "mlp.up_proj")), ("o", ("self_attn.o_proj",)),
                                 ("down", ("mlp.down_proj",))):
                deq = layer[field].dequantize().cpu()
                parts = torch.split(deq, [hf.state_dict()[p + n + ".weight"].shape[0] for n in names])
                for n, t in zip(names, parts):
                    hf.state_dict()[p + n + ".weight"].copy_(t)
    else:
        truth = write_fp8(src, tmp_path / "q", kind, strategy=strategy, block=(128, 128), shards=2)
        hf.load_state_dict(truth, strict=False)
        llm = LLM(tmp_path / "q", device="cuda", max_batch=8, steps_per_graph=4, max_model_len=1024)
    qkv = llm.checkpoint.weights["layers"][0]["qkv"]
    assert isinstance(qkv, Fp8Weight)
    gap = BF16_GAP
    if qkv.block is None:                                        # W8A8: the same rounding points
        _mirror_w8a8(hf)
    hf = hf.cuda()
    prompts = _prompts(8, torch.Generator().manual_seed(0))
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == 16
        assert_greedy_matches_hf(hf, p, o.token_ids, tie_gap=gap)
    one = llm.generate([prompts[0]], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    assert_greedy_matches_hf(hf, prompts[0], one.token_ids, tie_gap=gap)   # bucket 1
