"""GPU tests of int4 weights (W4A16): the int4 GEMV (its packed-register unpacking; the default and
five other configs: 16 / 32 / 64 rows, 2 warps, split-K; one row, 16 rows and two M tiles;
act-order, asymmetric / symmetric, group 128 / 32 / per channel, Llama-3.1-8B shapes; bf16, fp16
and float32 activations; split-K partials) and the dequantize + cuBLAS path against float32 over
the dequantized weight; then decode graphs over a small checkpoint written as GPTQ act-order
(tests/_int4_checkpoints.py, group 32) and over an 8B-shaped 1-layer checkpoint with
`quantization="int4"` (RTN g128): greedy tokens
(batch 8 with 4-step graphs, batch 1) equal HF float32 over the dequantized weights up to bf16
ties (the int4 path is weight-only and exact to its arithmetic: like block-scaled FP8).

Run on the GPU machine: python -m pytest -m gpu -q tests/model/test_int4_gpu.py -s
"""
from __future__ import annotations

import pytest
import torch

from _checkpoints import assert_greedy_matches_hf, write
from _int4_checkpoints import write_int4
from graphrt import LLM, SamplingParams
from graphrt.kernels.gemv_int4 import CANDIDATES, Int4GemvConfig, default_config, gemv_int4, gemv_int4_partial
from graphrt.kernels.splitk import SplitAcc
from graphrt.model.linear import INT4_GEMV_MAX_M, int4_linear
from graphrt.model.quant.int4 import Int4Weight, quantize_int4

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")

SHAPES_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
STEPS = 16


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    """y (bf16) within one bf16 rounding of the float32 reference, plus float32 summation order."""
    err = (y.float() - ref).abs()
    bound = ref.abs() * 2 ** -8 + 1e-4 * float(ref.abs().max())
    assert bool((err <= bound).all()), float((err - bound).max())


@pytest.mark.parametrize("name", list(SHAPES_8B))
@pytest.mark.parametrize("group,sym,perm", [(128, False, False), (128, True, True), (32, False, False),
                                            (-1, True, False)])
def test_gemv_int4_8b_shapes_match_float32(name, group, sym, perm):
    n, k = SHAPES_8B[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w4 = quantize_int4(torch.randn(n, k, device="cuda", generator=gen) * 0.02, group, symmetric=sym)
    if perm:
        w4 = Int4Weight(w4.qweight, w4.scale, w4.group_size, w4.zero,
                        torch.randperm(k, device="cuda", generator=gen).to(torch.int32))
    wf = w4.dequantize(torch.float32)
    for m in (1, 16, 33):
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        ref = x.float() @ wf.T
        picks = (Int4GemvConfig(16, 512, 4, 4), Int4GemvConfig(32, 1024, 8, 4), Int4GemvConfig(64, 256, 4, 4),
                 Int4GemvConfig(16, 256, 2, 4), Int4GemvConfig(16, 1024, 8, 4, 2))
        configs = [None] + [c for c in picks if c in CANDIDATES and c.fits(k, w4.group_size)]
        for c in configs:
            _close(gemv_int4(x, w4.qweight, w4.scale, w4.group_size, zero=w4.zero, perm=w4.perm, config=c), ref)
    x = torch.randn(INT4_GEMV_MAX_M + 36, k, device="cuda", generator=gen).bfloat16()   # dequantize + cuBLAS
    ref = x.float() @ wf.T
    y = int4_linear(x, w4)
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
    print(f"{name} g{group} sym={sym} perm={perm}: default {default_config(n, k, w4.group_size).name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gemv_int4_other_activation_dtypes(dtype):
    """fp16: the fp16 packed unpacking (magic 1024); float32: shifts and masks, IEEE dot."""
    w4 = quantize_int4(torch.randn(4096, 4096, device="cuda") * 0.02, 128)
    for sym in (False, True):
        zero = None if sym else w4.zero
        wf = Int4Weight(w4.qweight, w4.scale, 128, zero).dequantize()
        for m in (1, 5):
            x = torch.randn(m, 4096, device="cuda").to(dtype)
            y = gemv_int4(x, w4.qweight, w4.scale, 128, zero=zero)
            assert y.dtype == dtype
            _close(y, x.float() @ wf.T)


@pytest.mark.parametrize("m", [1, 16])
def test_gemv_int4_captured_in_a_graph(m):
    w4 = quantize_int4(torch.randn(4096, 4096, device="cuda") * 0.02, 128)
    x = torch.randn(m, 4096, device="cuda").bfloat16()
    out = torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16)
    acc = torch.empty(2 * m, 2 * 4096, device="cuda", dtype=torch.bfloat16)
    cfgs = (default_config(4096, 4096, 128), Int4GemvConfig(16, 1024, 8, 4, 2))   # the workspace path

    def step():
        for c in cfgs:
            gemv_int4(x, w4.qweight, w4.scale, 128, zero=w4.zero, config=c, out=out)
        gemv_int4_partial(x, w4.qweight, w4.scale, 128, acc, zero=w4.zero, config=cfgs[1])
    step()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    x.copy_(torch.randn_like(x))
    g.replay()
    ref = x.float() @ w4.dequantize().T
    _close(out, ref)
    got = SplitAcc(acc, 2, m).reference()                        # two partials, each rounded to bf16
    assert float((got - ref).norm() / ref.norm()) < 1e-2


def _prompts(n, gen, vocab):
    lens = torch.randint(1, 8, (n,), generator=gen).tolist()
    return [torch.randint(2, vocab, (m,), generator=gen).tolist() for m in lens]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return write(tmp_path_factory, "int4small", shape="tiny-gqa", arch="llama", dtype="bfloat16")


@pytest.fixture(scope="module")
def one_layer_8b(tmp_path_factory):
    """A random Llama-3.1-8B-shaped checkpoint with one layer, drawn on the GPU (fast)."""
    return write(tmp_path_factory, "int4_8b", shape="llama-3.1-8b", arch="llama", dtype="bfloat16", num_layers=1,
                 max_shard_mb=4096, tokenizer_vocab=4096, device="cuda")


@pytest.mark.parametrize("kind", ["gptq-act-order", "quantize"])
def test_int4_greedy_equals_hf_over_dequantized_weights(request, tmp_path, kind):
    src = request.getfixturevalue("one_layer_8b" if kind == "quantize" else "small")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    if kind == "quantize":
        llm = LLM(src, device="cuda", max_batch=8, steps_per_graph=4, max_model_len=1024, quantization="int4")
        sd = hf.state_dict()
        for i, layer in enumerate(llm.checkpoint.weights["layers"]):   # truth: graphrt's own RTN weights
            p = f"model.layers.{i}."
            for field, names in (("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                                 ("gate_up", ("mlp.gate_proj", "mlp.up_proj")), ("o", ("self_attn.o_proj",)),
                                 ("down", ("mlp.down_proj",))):
                parts = torch.split(layer[field].dequantize().cpu(), [sd[p + n + ".weight"].shape[0] for n in names])
                for n, t in zip(names, parts):
                    sd[p + n + ".weight"].copy_(t)
    else:
        truth = write_int4(src, tmp_path / "q", "gptq", group_size=32, sym=False, act_order=True)
        hf.load_state_dict(truth, strict=False)
        llm = LLM(tmp_path / "q", device="cuda", max_batch=8, steps_per_graph=4, max_model_len=256)
    w = llm.checkpoint.weights["layers"][0]
    assert isinstance(w["gate_up"], Int4Weight) and (w["qkv"].perm is not None) == (kind != "quantize")
    hf = hf.cuda()
    prompts = _prompts(8, torch.Generator().manual_seed(0), hf.config.vocab_size)
    params = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True)
    for p, o in zip(prompts, llm.generate(prompts, params)):
        assert len(o.token_ids) == STEPS
        assert_greedy_matches_hf(hf, p, o.token_ids)
    one = llm.generate([prompts[0]], params)[0]
    assert_greedy_matches_hf(hf, prompts[0], one.token_ids)      # bucket 1
    llm.shutdown()
