"""On-device sampling (kernels/sample.py, sampling.py): greedy == argmax, per-row seeded draws that
do not depend on the batch or K, and empirical distributions vs a float64 softmax reference."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.kernels.sample import sample_tokens
from graphrt.model.runtime import ModelRuntime
from graphrt.model import LlamaDecoder
from graphrt.model.sampling import SamplingInputs, sample_eager

CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}   # chi-square 0.999 quantiles


def _inputs(n, *, temperature=1.0, top_k=0, top_p=1.0, seed=0, step=0):
    def col(v, dt):
        return v.to(dt) if isinstance(v, torch.Tensor) else torch.full((n,), v, dtype=dt)
    return SamplingInputs(col(temperature, torch.float32), col(top_k, torch.int32),
                          col(top_p, torch.float32), col(seed, torch.int64), col(step, torch.int32))


def test_greedy_rows_equal_argmax_with_ties_and_several_blocks():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 2500, generator=gen)        # 3 blocks of 1024
    logits[1, 2000] = logits[1, 7] = 50.0               # tie: the lower id wins, like argmax
    inp = _inputs(4, temperature=torch.tensor([0.0, 0.0, 0.9, 0.0]),
                  top_k=torch.tensor([0, 0, 1, 5]))     # row 2: top_k 1 is greedy too
    got = sample_eager(logits, inp)
    assert got.tolist() == logits.argmax(-1).tolist()
    assert got[1] == 7


def test_seeded_rows_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 64, generator=gen)
    temp = torch.tensor([1.0, 0.7, 1.3, 0.0, 2.0, 1.0])
    top_k = torch.tensor([0, 10, 0, 0, 3, 0])
    top_p = torch.tensor([1.0, 1.0, 0.8, 1.0, 0.9, 0.5])
    seed = torch.tensor([11, 12, 13, 14, 15, 11])
    step = torch.tensor([0, 5, 9, 2, 1, 0])
    whole = sample_eager(logits, _inputs(6, temperature=temp, top_k=top_k, top_p=top_p, seed=seed, step=step))
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    shuffled = sample_eager(logits[perm], _inputs(6, temperature=temp[perm], top_k=top_k[perm],
                                                  top_p=top_p[perm], seed=seed[perm], step=step[perm]))
    assert shuffled.tolist() == whole[perm].tolist()
    for r in (0, 2):
        alone = sample_eager(logits[r:r + 1], _inputs(1, temperature=temp[r:r + 1], top_k=top_k[r:r + 1],
                                                      top_p=top_p[r:r + 1], seed=seed[r:r + 1],
                                                      step=step[r:r + 1]))
        assert alone.tolist() == whole[r:r + 1].tolist()
    # another seed or step changes the draws (over 16 draws, not all can coincide)
    many = torch.randn(1, 64, generator=gen).repeat(16, 1)
    a = sample_eager(many, _inputs(16, seed=1, step=torch.arange(16)))
    b = sample_eager(many, _inputs(16, seed=2, step=torch.arange(16)))
    assert a.tolist() != b.tolist()


def _reference_probs(logits, temperature, top_k, top_p):
    """float64 vLLM-order reference: temperature, top-k, then top-p over the top-k distribution."""
    x = logits.double() / temperature
    order = torch.argsort(x, descending=True, stable=True)
    keep = torch.zeros_like(x, dtype=torch.bool)
    k = top_k or x.numel()
    p = torch.softmax(x[order[:k]], 0)
    excl = torch.cumsum(p, 0) - p
    keep[order[:k][excl < top_p]] = True
    probs = torch.where(keep, torch.softmax(x.masked_fill(~keep, float("-inf")), 0), 0.0)
    return probs


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 0, 1.0), (1.0, 3, 1.0), (1.2, 0, 0.7),
                                                     (1.0, 4, 0.8)])
def test_empirical_distribution_matches_softmax(temperature, top_k, top_p):
    n = 300                                               # draws t = 0..n-1 of one seeded row
    logits = torch.tensor([1.5, 0.2, -0.4, 1.0, 0.6, -1.0])
    probs = _reference_probs(logits, temperature, top_k, top_p)
    got = sample_eager(logits.repeat(n, 1), _inputs(n, temperature=temperature, top_k=top_k,
                                                    top_p=top_p, seed=1234, step=torch.arange(n)))
    counts = torch.bincount(got, minlength=6).double()
    assert counts[probs == 0].sum() == 0, "a filtered token was drawn"
    live = probs > 0
    expected = probs[live] * n
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    assert df >= 1 and chi2 < CHI2_999[df], (counts.tolist(), expected.tolist(), chi2)


def test_kernel_advances_step_and_inputs_are_checked():
    logits = torch.randn(2, 16)
    inp = _inputs(2, step=torch.tensor([3, 8]))
    step = inp.step.clone()
    out = torch.empty(2, dtype=torch.int64)
    sample_tokens(logits, inp.temperature, inp.top_k, inp.top_p, inp.seed, step, out)
    assert step.tolist() == [4, 9]
    sample_eager(logits, inp)
    assert inp.step.tolist() == [3, 8]                    # sample_eager leaves its inputs alone
    bad = SamplingInputs(inp.temperature.double(), inp.top_k, inp.top_p, inp.seed, inp.step)
    with pytest.raises(ValueError, match="sampling.temperature"):
        sample_eager(logits, bad)
    with pytest.raises(ValueError, match="sampling.seed"):
        sample_eager(logits, SamplingInputs(inp.temperature, inp.top_k, inp.top_p, inp.seed[:1], inp.step))


def _runtime(k):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=192,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = LlamaDecoder.from_hf(transformers.LlamaForCausalLM(cfg).eval())
    rc = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                       buckets=[1, 2, 4], dtype="float32", backend="torch", kv_pool_pages=16)
    return ModelRuntime(model, rc, "cpu", steps_per_graph=k, sampling=True)


def test_model_runtime_sampled_tokens_do_not_depend_on_k_or_batch():
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 96, (n,), generator=gen) for n in (5, 11, 3)]
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    lens = torch.tensor([6, 12, 4], dtype=torch.int32)
    first = torch.randint(0, 96, (3,), generator=gen)
    params = dict(temperature=torch.tensor([1.0, 0.0, 0.8]), top_k=torch.tensor([0, 0, 20]),
                  top_p=torch.tensor([0.9, 1.0, 1.0]), seed=torch.tensor([5, 6, 7]))
    four = _runtime(4)
    four.prefill(prompts, table)
    multi = four.decode(first, table, lens, sampling=_inputs(3, step=torch.tensor([1, 1, 1]), **params)).clone()
    one = _runtime(1)
    one.prefill(prompts[2:], table[2:])                  # row 2 alone, one step a call
    cur, singles = first[2:], []
    for t in range(4):
        p = {k: v[2:] for k, v in params.items()}
        cur = one.decode(cur, table[2:], lens[2:] + t, sampling=_inputs(1, step=torch.tensor([1 + t]), **p))[0].clone()
        singles.append(int(cur))
    assert multi[:, 2].tolist() == singles
    assert four.decode(first, table, lens).shape == (4, 3)   # greedy still works after sampling


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels.sample import _sample_kernel
for vals, sorted_, advance, kept, q in (("*fp32", True, True, False, 1), ("*bf16", True, True, False, 1),
                                        ("*bf16", False, False, False, 1), ("*fp32", True, False, True, 1),
                                        ("*bf16", False, False, False, 5), ("*fp32", True, False, False, 3)):
    sig = {"vals_ptr": vals, "idx_ptr": "*i64" if sorted_ else vals, "vocab": "i32", "n_rows": "i32",
           "temperature_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32", "seed_ptr": "*i64",
           "step_ptr": "*i32", "out_ptr": "*i64", "kept_ptr": "*i32" if kept else "*i64",
           "top_ptr": vals if sorted_ else "*fp32",
           "SORTED": "constexpr", "ADVANCE": "constexpr", "KEPT": "constexpr", "ROWS": "constexpr",
           "BLOCK": "constexpr", "Q": "constexpr"}
    const = {"SORTED": sorted_, "ADVANCE": advance, "KEPT": kept, "ROWS": 1, "BLOCK": 1024, "Q": q}
    k = triton.compile(ASTSource(fn=_sample_kernel, signature=sig, constexprs=const),
                       target=GPUTarget("cuda", 90, 32))
    assert "ptx" in k.asm
"""


@pytest.mark.slow
def test_sample_kernel_compiles_for_sm90_without_a_gpu():
    """The interpreter accepts code the compiler refuses (loop-carried types): compile to PTX."""
    import os
    import subprocess
    import sys
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_unsorted_path_draws_what_the_sorted_path_draws():
    """filtered=False skips the sort: same token as the sorted path for unfiltered rows (several
    vocabulary blocks, greedy rows and exact ties included); step is left alone with advance=False."""
    gen = torch.Generator().manual_seed(5)
    n, vocab = 24, 2500
    logits = torch.randn((n, vocab), generator=gen) * 2
    logits[0, 100] = logits[0, 2400] = 40.0                       # greedy tie across blocks
    temp = torch.tensor([0.0, 0.0] + [0.3, 0.8, 1.0, 1.7] * 5 + [0.0, 2.0])
    zeros = torch.zeros(n, dtype=torch.int32)
    seed = torch.arange(n, dtype=torch.int64) * 13
    step = torch.arange(n, dtype=torch.int32)
    a, b = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
    sample_tokens(logits, temp, zeros, torch.ones(n), seed, step, a, advance=False)
    sample_tokens(logits, temp, zeros, torch.ones(n), seed, step, b, advance=False, filtered=False)
    assert torch.equal(a, b) and int(a[0]) == 100
    assert torch.equal(step, torch.arange(n, dtype=torch.int32))
    with pytest.raises(ValueError, match="seed"):
        sample_tokens(logits, temp, zeros, torch.ones(n), seed.repeat(2)[::2], step, a)   # stride 2


@pytest.mark.gpu
def test_gpu_unsorted_path_draws_what_the_sorted_path_draws():
    """filtered=False (no sort) must give the sorted path's token for unfiltered rows, bf16 and
    float32 logits, a Llama-3 sized vocabulary (one sampling rule whatever the batch needs)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, vocab = 64, 128256
    for dt in (torch.float32, torch.bfloat16):
        logits = (torch.randn((n, vocab), generator=gen, device="cuda") * 3).to(dt)
        temp = torch.linspace(0.0, 1.5, n, device="cuda")
        zeros = torch.zeros(n, dtype=torch.int32, device="cuda")
        ones = torch.ones(n, device="cuda")
        seed = torch.arange(n, dtype=torch.int64, device="cuda") + 3
        a = torch.empty(n, dtype=torch.int64, device="cuda")
        b = torch.empty_like(a)
        sample_tokens(logits, temp, zeros, ones, seed, zeros.clone(), a)
        sample_tokens(logits, temp, zeros, ones, seed, zeros.clone(), b, filtered=False)
        assert torch.equal(a, b), dt
        assert torch.equal(a[temp == 0], logits[temp == 0].argmax(-1))
