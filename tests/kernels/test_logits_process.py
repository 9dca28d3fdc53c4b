"""kernels/logits_process.py against the float32 torch rule (kernels/reference_sample.py's
process_logits, the torch kernel set's; tests/kernels/test_reference_sample.py compares the rest),
kernels/sample.py's unsorted draw and torch log_softmax: random rows with repetition penalties on
both signs, zero counts, min_p on and off, greedy rows, -inf entries, live / expired / duplicate
token rules; several chunks a row. CPU (interpreter) and, marked gpu, the 8B vocabulary in a
CUDA graph; and every variant the wrappers launch compiles for sm_90 (no GPU needed)."""
from __future__ import annotations


import pytest
import torch

from graphrt.kernels.logits_process import logprobs_into, process_draw, process_logits
from graphrt.kernels.sample import sample_tokens
from graphrt.kernels.reference_sample import process_logits as torch_rule
from graphrt.model.processing import FOREVER
from _sm90 import compile_for_sm90

W = 20


def _process(x, counts, prompt, params, ids, vals, until, step, temp):
    """The torch rule over rows [0, R) of the state (float32 [R, V])."""
    return torch_rule(x, counts, prompt, params, ids, vals, until, torch.zeros_like(x, dtype=torch.float32), step, temp)


def _rows(r: int, v: int, device="cpu", seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, v, generator=g) * 3
    x[1, 5:50] = -torch.inf
    counts = (torch.randint(1, 4, (r, v), generator=g) * (torch.rand(r, v, generator=g) < 0.1)).int()
    counts[3] = 0                                                     # a row that drew nothing
    prompt = torch.rand(r, v, generator=g) < 0.05
    base = [[0.5, 0.3, 1.3, 0.1], [0.0, 0.0, 1.0, 0.0], [0.2, -0.1, 0.8, 0.05], [0.4, 0.2, 1.2, 0.0],
            [1.0, 1.0, 1.5, 0.2]]
    params = torch.tensor([base[i % len(base)] for i in range(r)]).t().contiguous()   # [4, R]
    L = 16
    ids = torch.full((r, L), -1, dtype=torch.int64)
    vals, until = torch.zeros(r, L), torch.zeros(r, L, dtype=torch.int32)
    ids[0, :4] = torch.tensor([3, v - 1, 3, 100])                   # a duplicate id, a ban at the end
    vals[0, :4] = torch.tensor([1.5, -torch.inf, 2.0, 4.0])
    until[0, :4] = FOREVER
    ids[2, :2] = torch.tensor([7, v // 2])                          # the second one expired
    vals[2, :2] = torch.tensor([-torch.inf, 5.0])
    until[2, :2] = torch.tensor([5, 1], dtype=torch.int32)
    step = torch.arange(r, dtype=torch.int32)
    temp = torch.tensor([0.7, 0.0, 1.0, 0.0, 1.3] * (r // 5 + 1))[:r]
    seed = torch.arange(r, dtype=torch.int64) * 7 + 1
    t = lambda a: a.to(device)
    return (t(x).to(dtype), t(counts), t(prompt), t(params), t(ids), t(vals), t(until), t(step), t(temp),
            t(seed))


def _equal_but_summed_duplicates(got: torch.Tensor, want: torch.Tensor, row: int = 0, token: int = 3) -> None:
    """Exactly equal; the element that two finite rules hit to float32 rounding (both sum the
    rules before adding them, in an order that may differ)."""
    torch.testing.assert_close(got[row, token], want[row, token], rtol=1e-6, atol=1e-6)
    got, want = got.clone(), want.clone()
    got[row, token] = want[row, token] = 0.0
    assert torch.equal(got, want)


def _reference_logprobs(src: torch.Tensor, tok: torch.Tensor, w: int):
    ls = torch.log_softmax(src.float(), dim=-1)
    lp = ls.gather(1, tok[:, None])[:, 0]
    rank = (ls > lp[:, None]).sum(1, dtype=torch.int32) + 1
    vals, ids = torch.sort(ls, dim=-1, descending=True, stable=True)     # ties: lowest id first
    return lp, rank, ids[:, :w], vals[:, :w]


def _check_logprobs(got, want, rtol=0.0):
    """Values to float32 rounding of log(sum exp) (rtol: the GPU's exp / log), ranks and ids exact."""
    torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=2e-6)
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[2], want[2])
    torch.testing.assert_close(got[3], want[3], rtol=rtol, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("chunk", [None, 512])
def test_process_logits_equals_the_torch_rule(chunk):
    x, counts, prompt, params, ids, vals, until, step, temp, _ = _rows(5, 3000)
    want = _process(x, counts, prompt, params, ids, vals, until, step, temp)
    bias = torch.zeros(5, 3000)
    got = process_logits(x, counts, prompt, params, ids, vals, until, bias, step, temp, chunk=chunk)
    _equal_but_summed_duplicates(got, want)
    assert torch.isfinite(want[4]).sum() < 3000 and torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert bool((bias == 0).all())                                  # the scratch is left zero
    # slots: rows of a larger state, in any order
    sel = torch.tensor([4, 0, 2])
    got = process_logits(x[sel], counts, prompt, params, ids, vals, until, bias, step[sel], temp[sel],
                         slots=sel, chunk=chunk)
    want = _process(x[sel], counts[sel], prompt[sel], params[:, sel], ids[sel], vals[sel], until[sel],
                    step[sel], temp[sel])
    _equal_but_summed_duplicates(got, want, row=1)                  # sel row 1 is row 0
    assert bool((bias == 0).all())


@pytest.mark.parametrize("source,v,chunk,dtype", [("raw", 3000, 512, torch.float32),
                                                  ("processed", 3000, 512, torch.float32),
                                                  ("raw", 1280, 64, torch.bfloat16)])   # W chunks: pruned top-W
def test_process_draw_is_process_sample_logprobs_count(source, v, chunk, dtype):
    x, counts, prompt, params, ids, vals, until, step, temp, seed = _rows(5, v, seed=1, dtype=dtype)
    ref = _process(x.float(), counts, prompt, params, ids, vals, until, step, temp)
    want_tok, want_step = torch.zeros(5, dtype=torch.int64), step.clone()
    sample_tokens(ref.clone(), temp, torch.zeros(5, dtype=torch.int32), torch.ones(5), seed, want_step, want_tok,
                  filtered=False)
    live = torch.tensor([True, True, False, True, True])
    out, st, c2 = torch.zeros(5, dtype=torch.int64), step.clone(), counts.clone()
    lp = (torch.zeros(5), torch.zeros(5, dtype=torch.int32), torch.zeros(5, W, dtype=torch.int64), torch.zeros(5, W))
    got = process_draw(x, c2, prompt, params, ids, vals, until, torch.zeros(5, v), seed, st, temp, live, out,
                       *lp, source=source, chunk=chunk)
    rows = temp > 0 if source == "raw" else torch.ones(5, dtype=torch.bool)   # raw: greedy rows unwritten
    assert torch.equal(got[rows & (torch.arange(5) > 0)], ref[rows & (torch.arange(5) > 0)])
    _equal_but_summed_duplicates(got[:1], ref[:1])
    assert torch.equal(out, want_tok) and torch.equal(st, want_step)
    assert torch.equal(c2 - counts, torch.zeros_like(counts).scatter_(1, out[:, None], live.int()[:, None]))
    src = x if source == "raw" else ref / torch.where(temp > 0, temp, 1.0)[:, None]
    _check_logprobs(lp, _reference_logprobs(src, out, W))


def test_logprobs_of_bf16_ties_and_zero_width():
    g = torch.Generator().manual_seed(2)
    src = (torch.randn(3, 1500, generator=g) * 2).to(torch.bfloat16)     # many exact ties
    tok = torch.tensor([0, 700, 1499])
    for chunk in (None, 256):
        lp = (torch.zeros(3), torch.zeros(3, dtype=torch.int32), torch.zeros(3, W, dtype=torch.int64),
              torch.zeros(3, W))
        logprobs_into(src, tok, *lp, chunk=chunk)
        _check_logprobs(lp, _reference_logprobs(src, tok, W))
    lp0 = (torch.zeros(3), torch.zeros(3, dtype=torch.int32), torch.zeros(3, 0, dtype=torch.int64), torch.zeros(3, 0))
    logprobs_into(src, tok, *lp0)
    _check_logprobs(lp0, _reference_logprobs(src, tok, 0))


def test_bad_input():
    x, counts, prompt, params, ids, vals, until, step, temp, seed = _rows(5, 600)
    lp = (torch.zeros(5), torch.zeros(5, dtype=torch.int32), torch.zeros(5, 2, dtype=torch.int64), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="source"):
        process_draw(x, counts, prompt, params, ids, vals, until, torch.zeros(5, 600), seed, step, temp,
                     torch.ones(5, dtype=torch.bool), torch.zeros(5, dtype=torch.int64), *lp, source="sorted")
    with pytest.raises(ValueError, match="src"):
        logprobs_into(x.t(), step.long(), *lp)
    with pytest.raises(ValueError, match="step"):
        process_logits(x, counts, prompt, params, ids, vals, until, torch.zeros(5, 600), step[:3], temp)


@pytest.mark.gpu
def test_8b_vocabulary_in_a_cuda_graph():
    r, v = 16, 128256
    x, counts, prompt, params, ids, vals, until, step, temp, seed = _rows(r, v, "cuda", dtype=torch.bfloat16)
    ref = _process(x.float(), counts, prompt, params, ids, vals, until, step, temp)
    want_tok, want_step = torch.zeros(r, dtype=torch.int64, device="cuda"), step.clone()
    sample_tokens(ref.clone(), temp, torch.zeros_like(step), torch.ones_like(temp), seed, want_step, want_tok,
                  filtered=False)
    live = torch.ones(r, dtype=torch.bool, device="cuda")
    out, st, c2 = torch.zeros_like(want_tok), step.clone(), counts.clone()
    bias = torch.zeros(r, v, device="cuda")
    lp = (torch.zeros(r, device="cuda"), torch.zeros(r, dtype=torch.int32, device="cuda"),
          torch.zeros(r, W, dtype=torch.int64, device="cuda"), torch.zeros(r, W, device="cuda"))
    call = lambda: process_draw(x, c2, prompt, params, ids, vals, until, bias, seed, st, temp, live, out, *lp,
                                source="raw")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()                                                        # warm (JIT), then reset
    torch.cuda.synchronize()
    st.copy_(step)
    c2.copy_(counts)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = call()
    graph.replay()
    torch.cuda.synchronize()
    rows = temp > 0                                                   # greedy rows unwritten
    assert torch.equal(got[rows & (torch.arange(r, device="cuda") > 0)], ref[rows & (torch.arange(r, device="cuda") > 0)])
    _equal_but_summed_duplicates(got[:1], ref[:1])
    assert torch.equal(out, want_tok) and torch.equal(st, want_step)
    assert int((c2 - counts).sum()) == r and bool((bias == 0).all())
    _check_logprobs(lp, _reference_logprobs(x, out, W), rtol=2e-6)


_COMPILE = r'''
import warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels import logits_process as lp

def build(fn, args, constexprs):
    constexprs = dict(constexprs, PDL=True)
    sig = {n: args.get(n, "constexpr") for n in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "enable_fp_fusion": False})
    assert "cubin" in k.asm
    print("ok", fn.__name__)

build(lp._rules, dict(ids_ptr="*i64", vals_ptr="*fp32", until_ptr="*i32", step_ptr="*i32", slot_ptr="*i64",
      bias_ptr="*fp32", V="i32", L="i32"), dict(HAS_SLOT=True, LP2=256))
pen = dict(logits_ptr="*bf16", l_stride="i32", counts_ptr="*i32", c_stride="i32", prompt_ptr="*u8", p_stride="i32",
           params_ptr="*fp32", pa_stride="i32", ids_ptr="*i64", L="i32", bias_ptr="*fp32", slot_ptr="*i64",
           x_ptr="*fp32", V="i32", S="i32", xmax_ptr="*fp32", xarg_ptr="*i64", m_ptr="*fp32", s_ptr="*fp32",
           keys_ptr="*i64", rank_ptr="*i32", temp_ptr="*fp32")
for stats in (True, False):
    build(lp._penalize, pen, dict(HAS_SLOT=not stats, STATS=stats, X_ALL=not stats, W=0, CHUNK=2048, LP2=256))
sec = dict(x_ptr="*fp32", x_stride="i32", V="i32", S="i32", xmax_ptr="*fp32", params_ptr="*fp32", pa_stride="i32",
           slot_ptr="*i64", temp_ptr="*fp32", seed_ptr="*i64", step_ptr="*i32", score_ptr="*fp32", sarg_ptr="*i64",
           m_ptr="*fp32", s_ptr="*fp32", keys_ptr="*i64", rank_ptr="*i32", raw_ptr="*bf16", raw_stride="i32")
for cut, draw, stats, div, top in ((True, False, False, False, False), (True, True, False, False, True),
                                   (True, True, True, True, False), (False, False, True, False, False)):
    build(lp._second, sec, dict(HAS_SLOT=not draw, CUT=cut, DRAW=draw, STATS=stats, SRC_DIV=div, TOPK_RAW=top,
          W=20, CHUNK=2048, SP2=64, WP2=32))
fin = dict(src_ptr="*bf16", src_stride="i32", V="i32", S="i32", xmax_ptr="*fp32", xarg_ptr="*i64", score_ptr="*fp32",
           sarg_ptr="*i64", m_ptr="*fp32", s_ptr="*fp32", keys_ptr="*i64", temp_ptr="*fp32", step_ptr="*i32",
           out_ptr="*i64", slot_ptr="*i32", live_ptr="*u8", counts_ptr="*i32", c_stride="i32", tok_lp_ptr="*fp32",
           rank_ptr="*i32", top_ids_ptr="*i64", top_vals_ptr="*fp32")
for token_in, div in ((False, False), (False, True), (True, False)):
    build(lp._finish, fin, dict(HAS_SLOT=False, TOKEN_IN=token_in, COUNT=not token_in, SRC_DIV=div, W=20,
          CHUNK=2048, SP2=64, SWP2=2048))
'''


def test_every_variant_compiles_for_sm90():
    compile_for_sm90(_COMPILE, 10)
