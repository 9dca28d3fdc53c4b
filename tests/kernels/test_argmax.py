"""kernels/argmax.py against torch.argmax: random rows in float32 / bfloat16 / float16, ties inside
a chunk and across chunk boundaries, rows of -inf, NaN rows, -0.0 against +0.0, the max in the
last partial chunk, strided row views, R = 1 and 17; bad arguments refused by name; the torch
fallback where Triton cannot run. CPU (interpreter), both kernels compiled for sm_90 (no GPU
needed) and, marked gpu, eager and CUDA-graph replays at the 128k vocabulary."""
from __future__ import annotations


import pytest
import torch

import graphrt.kernels.argmax as am
from graphrt.kernels.argmax import argmax_into
from _sm90 import compile_for_sm90

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _hard_rows(r: int, v: int, chunk: int, dtype, seed: int = 0) -> torch.Tensor:
    """[r, v] random rows, the first ones edited into the cases the tie rule must get right."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, v, generator=g) * 3
    if r >= 9:
        x[1, [chunk + 3, chunk + 9, 2 * chunk + 1]] = 50.0       # a tie inside a chunk, and a later one
        x[2, [chunk - 1, chunk]] = 60.0                         # a tie across a chunk boundary
        x[3] = -torch.inf                                       # a row of -inf: 0
        x[4, v - 1] = 70.0                                      # the max in the last (partial) chunk
        x[5, [11, chunk + 2]] = torch.nan                       # NaN above everything, the first wins
        x[5, 4] = torch.inf
        x[6] = 0.0                                              # -0.0 ties +0.0: the lowest id
        x[6, :3] = -0.0
        x[7, [5, v - 1]] = torch.inf                            # +inf tie over chunks
        x[8, :] = -torch.inf
        x[8, v - 2] = -1e30                                     # one finite value at the end
    return x.to(dtype)


def _check(logits: torch.Tensor, **kw) -> None:
    r = logits.shape[0]
    out = torch.full((r,), -7, dtype=torch.int64)
    top = torch.empty(r)
    assert argmax_into(logits, out, top=top, **kw) is out
    assert torch.equal(out, torch.argmax(logits, dim=-1))
    torch.testing.assert_close(top, logits.float().max(dim=-1).values, rtol=0, atol=0, equal_nan=True)
    bare = torch.empty(r, dtype=torch.int64)
    assert torch.equal(argmax_into(logits, bare, **kw), out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", [1, 17])
def test_equals_torch_argmax(dtype, r):
    _check(_hard_rows(r, 10000, 4096, dtype, seed=r))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", [1, 256, 1000, 1031])
def test_many_chunks_and_partial_last_chunk(dtype, v):
    x = _hard_rows(17, max(v, 1), 64, dtype, seed=v) if v >= 200 else torch.randn(17, v).to(dtype)
    _check(x, chunk=64)


def test_ties_everywhere_go_to_the_lowest_id():
    """Rows of few distinct values: many exact ties in every chunk and across chunks."""
    g = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        x = torch.randint(0, 3, (17, 777), generator=g).to(dtype)
        _check(x, chunk=32)
        _check(-x, chunk=32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_row_views(dtype):
    base = _hard_rows(17 * 3, 5000, 1024, dtype, seed=9)
    wide = torch.randn(17, 6000).to(dtype)
    wide[:, :5000] = base[:17]
    _check(base.view(17, 3, 5000)[:, -1], chunk=1024)        # stride(0) = 3 V: a verify row per request
    _check(base.view(17, 3, 5000)[:, 0])
    _check(wide[:, :5000], chunk=1024)                       # a row pitch above V
    _check(base[4:5], chunk=1024)


def test_empty_rows_leave_out_alone():
    out = torch.empty(0, dtype=torch.int64)
    assert argmax_into(torch.empty(0, 50), out) is out


def test_torch_fallback_where_triton_cannot_run(monkeypatch):
    """A CPU tensor with GPU-compiled kernels: torch.argmax itself, the same ids and maxima."""
    monkeypatch.setattr(am, "triton_runs_on", lambda t: False)
    x = _hard_rows(17, 3000, 1024, torch.float32, seed=4)
    _check(x)
    _check_mapped(x)


def _check_mapped(logits: torch.Tensor, **kw) -> None:
    """ids[argmax] into each column of an [R, 3] table (a strided out), the other columns untouched."""
    r, v = logits.shape
    ids = torch.randperm(4 * v, generator=torch.Generator().manual_seed(v))[:v].long()   # a draft->target map
    table = torch.full((r, 3), -5, dtype=torch.int64)
    for j in range(3):
        assert argmax_into(logits, table[:, j], ids=ids, **kw).data_ptr() == table[:, j].data_ptr()
        assert torch.equal(table[:, j], ids[torch.argmax(logits, dim=-1)])
        assert (table[:, j + 1:] == -5).all()


@pytest.mark.parametrize("r", [1, 17])
def test_vocabulary_map_into_a_strided_column(r):
    """The EAGLE-3 chain's form: the draft vocabulary's argmax mapped to target ids and written
    into a column of the proposals table, one call (no index, no copy)."""
    x = _hard_rows(r, 3000, 1024, torch.float32, seed=r)
    _check_mapped(x, chunk=1024)
    _check_mapped(x.to(torch.bfloat16))


def test_bad_arguments_are_refused_by_name():
    x = torch.randn(4, 300)
    out = torch.empty(4, dtype=torch.int64)
    bad = [
        (dict(out=torch.empty(4, dtype=torch.int32)), "out"),
        (dict(out=torch.empty(5, dtype=torch.int64)), "out"),
        (dict(out=torch.empty(4, 1, dtype=torch.int64)), "out"),
        (dict(ids=torch.arange(299)), "ids"),
        (dict(ids=torch.arange(300, dtype=torch.int32)), "ids"),
        (dict(ids=torch.arange(600)[::2]), "ids"),
        (dict(out=torch.empty(4, dtype=torch.int64, device="meta")), "out"),
        (dict(out=[0, 0, 0, 0]), "out"),
        (dict(top=torch.empty(4, dtype=torch.float16)), "top"),
        (dict(top=torch.empty(3)), "top"),
        (dict(top=torch.empty(4, device="meta")), "top"),
        (dict(logits=torch.randint(0, 5, (4, 300))), "logits"),
        (dict(logits=torch.randn(300)), "logits"),
        (dict(logits=torch.randn(300, 4).t()), "logits"),                   # stride(1) != 1
        (dict(logits=torch.randn(4, 300, dtype=torch.float64)), "logits"),
        (dict(chunk=100), "chunk"),
        (dict(chunk=8), "chunk"),
        (dict(chunk=True), "chunk"),
    ]
    for change, name in bad:
        kw = dict(logits=x, out=out, top=None, chunk=None, ids=None) | change
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            argmax_into(kw["logits"], kw["out"], top=kw["top"], chunk=kw["chunk"], ids=kw["ids"])


_COMPILE = r'''
import warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels import argmax as am

def build(fn, args, constexprs):
    sig = {n: args.get(n, "constexpr") for n in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    assert "cubin" in k.asm
    print("ok", fn.__name__, constexprs)

for dt in ("*bf16", "*fp16", "*fp32"):
    for pdl in (False, True):
        build(am._chunks, dict(logits_ptr=dt, l_stride="i64", V="i32", S="i32", xmax_ptr="*fp32",
              xarg_ptr="*i64"), dict(CHUNK=am.CHUNK, PDL=pdl))
for top, mapped in ((False, False), (True, False), (False, True)):
    build(am._rows, dict(xmax_ptr="*fp32", xarg_ptr="*i64", S="i32", out_ptr="*i64", out_stride="i32",
                         top_ptr="*fp32", ids_ptr="*i64"), dict(TOP=top, MAP=mapped, SP2=32, PDL=True))
'''


def test_kernels_compile_for_sm90():
    compile_for_sm90(_COMPILE, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", [1, 5, 16])
def test_gpu_eager_and_graph_replay_equal_torch_argmax(dtype, r):
    """The 128k vocabulary (Llama-3): eager, then a captured graph replayed over fresh rows
    (hard cases included) and over a strided view of verify rows (q = 3 per request)."""
    v = 128256
    logits = _hard_rows(r, v, am.CHUNK, dtype, seed=r).cuda()
    out, top = torch.empty(r, dtype=torch.int64, device="cuda"), torch.empty(r, device="cuda")
    argmax_into(logits, out, top=top)
    assert torch.equal(out, torch.argmax(logits, dim=-1))
    torch.testing.assert_close(top, logits.float().max(dim=-1).values, rtol=0, atol=0, equal_nan=True)

    static = torch.empty_like(logits)
    verify = torch.empty((r, 3, v), dtype=dtype, device="cuda")
    vout = torch.empty(r, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):                         # warm-up (compiles) outside the capture
        argmax_into(static, out, top=top)
        argmax_into(verify[:, -1], vout)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        argmax_into(static, out, top=top)
        argmax_into(verify[:, -1], vout)
    for seed in range(3):
        static.copy_(_hard_rows(r, v, am.CHUNK, dtype, seed=100 + seed).cuda().flip(0))
        verify.copy_(torch.randn((r, 3, v), device="cuda").to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.argmax(static, dim=-1)), seed
        torch.testing.assert_close(top, static.float().max(dim=-1).values, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(vout, torch.argmax(verify[:, -1], dim=-1)), seed
