"""graphrt's one-launch split-KV decode kernel (kernels/decode_attention.py) vs the float32
reference_decode: padding rows, page boundaries, rows long enough for several splits (the last
split merges), mixed lengths, G = 2 / 3 / 4 / 8, D = 64 / 128, NHD and HND, FP8 pages with
non-unit scales, float32 and bf16 q, counters zero after every launch, repeated calls identical,
any program order; bad input; the sm_90 compile."""
from __future__ import annotations

import pytest
import torch

from _sm90 import compile_for_sm90
from graphrt.attention.kvcache import PagedKVCache
from graphrt.attention.reference import reference_decode
from graphrt.kernels.decode_attention import DecodeScratch, decode_attention, default_max_splits
from graphrt.model.quant.kv import quantize_kv

PAGE, POOL = 16, 48
LENS = [0, 1, 15, 16, 17, 64, 65, 300, 129]       # padding, first token, page edges, 1..5 splits


def _cache(layout, hkv, d, gen, *, dtype=torch.float32):
    shape = (POOL, PAGE, hkv, d) if layout == "NHD" else (POOL, hkv, PAGE, d)
    return PagedKVCache(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype),
                        layout)


def _batch(lens, hq, d, gen, *, dtype=torch.float32):
    lens = torch.tensor(lens, dtype=torch.int32)
    width = max(1, -(-int(lens.max()) // PAGE)) + 1
    table = torch.randint(0, POOL, (len(lens), width), generator=gen, dtype=torch.int32)
    return torch.randn((len(lens), hq, d), generator=gen).to(dtype), table, lens


def _run(q, cache, table, lens, splits, **kw):
    hkv = cache.k.shape[2] if cache.layout == "NHD" else cache.k.shape[1]
    scratch = DecodeScratch.allocate([(q.shape[0], splits)], num_kv_heads=hkv, group=q.shape[1] // hkv,
                                     head_dim=q.shape[2], device=q.device)
    out = decode_attention(q, cache, table, lens, max_splits=splits, scratch=scratch, **kw)
    assert scratch.counters.eq(0).all(), "a counter was left non-zero"
    return out, scratch


def _ref(q, cache, table, lens, k_scale=1.0, v_scale=1.0):
    return reference_decode(q.float(), cache.k.float(), cache.v.float(), table, lens, layout=cache.layout,
                            k_scale=k_scale, v_scale=v_scale)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 64), (16, 2, 128), (6, 2, 64)])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_matches_reference(layout, hq, hkv, d, splits):
    gen = torch.Generator().manual_seed(hq * 10 + d + splits)
    cache = _cache(layout, hkv, d, gen)
    q, table, lens = _batch(LENS, hq, d, gen)
    out, _ = _run(q, cache, table, lens, splits)
    torch.testing.assert_close(out, _ref(q, cache, table, lens), rtol=1e-4, atol=1e-5)
    assert out[0].eq(0).all()                                        # padding row: zeros


def test_repeat_calls_identical_and_order_free(monkeypatch):
    """Counters reset: a second launch over the same scratch gives the same bits, also after a
    launch with other lengths, and with the interpreter's programs run in reverse (whichever
    split arrives last merges)."""
    gen = torch.Generator().manual_seed(1)
    cache = _cache("NHD", 2, 64, gen)
    q, table, lens = _batch([300, 7, 129, 0], 8, 64, gen)
    scratch = DecodeScratch.allocate([(4, 8)], num_kv_heads=2, group=4, head_dim=64, device="cpu")
    first = decode_attention(q, cache, table, lens, max_splits=8, scratch=scratch).clone()
    decode_attention(q, cache, table, torch.tensor([64, 300, 1, 200], dtype=torch.int32), max_splits=8,
                     scratch=scratch)
    again = decode_attention(q, cache, table, lens, max_splits=8, scratch=scratch)
    assert torch.equal(first, again) and scratch.counters.eq(0).all()
    if torch.cuda.is_available():
        return
    builder = pytest.importorskip("triton.runtime.interpreter").interpreter_builder
    forward = builder.set_grid_idx
    monkeypatch.setattr(builder, "set_grid_idx",
                        lambda x, y, z: forward(builder.grid_dim[0] - 1 - x, y, builder.grid_dim[2] - 1 - z))
    backwards = decode_attention(q, cache, table, lens, max_splits=8, scratch=scratch)
    torch.testing.assert_close(backwards, first, rtol=1e-6, atol=1e-6)
    assert scratch.counters.eq(0).all()


@pytest.mark.parametrize("layout,qdtype,fp8_dot", [("NHD", torch.float32, "f16"), ("HND", torch.bfloat16, "f16"),
                                                   ("NHD", torch.bfloat16, "q"), ("NHD", torch.float16, "f16")])
def test_fp8_pages_with_scales(layout, qdtype, fp8_dot):
    gen = torch.Generator().manual_seed(3)
    hkv, d = 2, 64
    shape = (POOL, PAGE, hkv, d) if layout == "NHD" else (POOL, hkv, PAGE, d)
    kf, vf = torch.randn(shape, generator=gen) * 5, torch.randn(shape, generator=gen) * 0.3
    scale = torch.tensor([float(kf.abs().max()) / 448, float(vf.abs().max()) / 448])
    cache = PagedKVCache(quantize_kv(kf, scale[0]), quantize_kv(vf, scale[1]), layout, scale)
    q, table, lens = _batch(LENS, 8, d, gen, dtype=qdtype)
    out, _ = _run(q, cache, table, lens, 4, fp8_dot=fp8_dot)
    assert out.dtype == qdtype
    want = _ref(q, cache, table, lens, k_scale=scale[0], v_scale=scale[1])
    tol = dict(rtol=1e-4, atol=1e-5) if qdtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), want, **tol)


def test_fp8_pages_float16_dots_clamp_a_huge_q():
    """fp8_dot="f16" rounds the scaled q to float16: a q past its range is clamped, never inf / NaN."""
    gen = torch.Generator().manual_seed(4)
    hkv, d = 2, 64
    shape = (POOL, PAGE, hkv, d)
    kf, vf = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    scale = torch.tensor([float(kf.abs().max()) / 448, float(vf.abs().max()) / 448])
    cache = PagedKVCache(quantize_kv(kf, scale[0]), quantize_kv(vf, scale[1]), "NHD", scale)
    q, table, lens = _batch(LENS, 8, d, gen, dtype=torch.bfloat16)
    out, _ = _run(q * 1e8, cache, table, lens, 4)
    assert torch.isfinite(out.float()).all()


def test_bf16_pages_and_q():
    gen = torch.Generator().manual_seed(4)
    cache = _cache("NHD", 2, 128, gen, dtype=torch.bfloat16)
    q, table, lens = _batch([300, 33, 1, 200], 8, 128, gen, dtype=torch.bfloat16)
    out, _ = _run(q, cache, table, lens, 5)
    want = _ref(q, cache, table, lens)
    assert out.dtype == torch.bfloat16
    assert float((out.float() - want).norm() / want.norm()) < 1e-2


def test_block_sizes_and_out():
    gen = torch.Generator().manual_seed(5)
    cache = _cache("HND", 2, 64, gen)
    q, table, lens = _batch([90, 47, 300], 4, 64, gen)
    out = torch.full_like(q, float("nan"))
    got, _ = _run(q, cache, table, lens, 6, out=out, block_n=16, min_keys=32)
    assert got is out
    torch.testing.assert_close(out, _ref(q, cache, table, lens), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("stages,block_n", [(2, 64), (3, 128)])
def test_pipelined_key_loop(stages, block_n):
    gen = torch.Generator().manual_seed(7)
    cache = _cache("NHD", 2, 64, gen)
    q, table, lens = _batch([300, 1, 129, 0], 8, 64, gen)
    got, _ = _run(q, cache, table, lens, 3, stages=stages, block_n=block_n, min_keys=128)
    torch.testing.assert_close(got, _ref(q, cache, table, lens), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="stages"):
        _run(q, cache, table, lens, 3, stages=0)


def test_default_max_splits():
    assert default_max_splits(132, 1, 8, 8192) == 33             # two waves over 8 (b, kv head) pairs
    assert default_max_splits(132, 16, 8, 8192) == 3
    assert default_max_splits(132, 64, 8, 8192) == 1
    assert default_max_splits(132, 1, 8, 128) == 2               # at most one split per 64 keys
    assert default_max_splits(132, 1, 1, 1 << 20) == 64          # capped
    assert default_max_splits(1, 1, 1, 1) == 1


def test_scratch_sizes():
    s = DecodeScratch.allocate([(1, 33), (16, 3), (64, 1)], num_kv_heads=8, group=4, head_dim=128, device="cpu")
    assert s.partial.shape == (48 * 8, 4, 128) and s.lse.shape == (48 * 8, 4)
    assert s.counters.shape == (64 * 8,) and s.counters.dtype == torch.int32 and s.counters.eq(0).all()
    s.check(16, 8, 4, 128, 3, torch.device("cpu"))
    with pytest.raises(ValueError, match="scratch: expected partial"):
        s.check(16, 8, 4, 128, 4, torch.device("cpu"))


def test_bad_input():
    gen = torch.Generator().manual_seed(6)
    cache = _cache("NHD", 2, 64, gen)
    q, table, lens = _batch([5, 70], 4, 64, gen)
    scratch = DecodeScratch.allocate([(2, 4)], num_kv_heads=2, group=2, head_dim=64, device="cpu")
    cases = [
        (dict(q=q[..., :32].contiguous()), "q:"), (dict(q=q.to(torch.bfloat16)), "q:"),
        (dict(q=q[:, :3].contiguous()), "q:"), (dict(block_table=table.long()), "block_table"),
        (dict(block_table=table[:1]), "block_table"), (dict(seq_lens=lens[:1]), "seq_lens"),
        (dict(seq_lens=lens.long()), "seq_lens"), (dict(max_splits=0), "max_splits"),
        (dict(max_splits=True), "max_splits"), (dict(max_splits=4, scratch=None), "scratch"),
        (dict(max_splits=8), "scratch"), (dict(out=torch.empty(2, 4, 32)), "out"),
        (dict(block_n=48), "block_n"), (dict(min_keys=96), "min_keys"), (dict(fp8_dot="bf16"), "fp8_dot"),
    ]
    for change, words in cases:
        kw = dict(q=q, block_table=table, seq_lens=lens, max_splits=4, scratch=scratch) | change
        with pytest.raises(ValueError, match=words):
            decode_attention(kw.pop("q"), cache, kw.pop("block_table"), kw.pop("seq_lens"), **kw)
    fp8 = PagedKVCache(cache.k.to(torch.float8_e4m3fn), cache.v.to(torch.float8_e4m3fn), "NHD",
                       torch.ones(2))
    object.__setattr__(fp8, "scale", None)
    with pytest.raises(ValueError, match="scale"):
        decode_attention(q, fp8, table, lens)


_COMPILE = r'''
import itertools, warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels import decode_attention as da

fn = da._decode_attention_kernel
ints = ("s_page", "s_slot", "s_head")
for (dt, kv, hq, d, splits, f16) in [("bf16", "bf16", 32, 128, 16, 0), ("bf16", "bf16", 32, 64, 1, 0),
                                     ("bf16", "fp8e4nv", 32, 128, 33, 1), ("bf16", "fp8e4nv", 32, 128, 4, 0),
                                     ("fp16", "fp16", 64, 128, 4, 0), ("fp32", "fp32", 16, 64, 8, 0),
                                     ("bf16", "bf16", 32, 256, 8, 0)]:
    args = dict(q_ptr=f"*{dt}", k_ptr=f"*{kv}", v_ptr=f"*{kv}", bt_ptr="*i32", bt_stride="i32",
                lens_ptr="*i32", out_ptr=f"*{dt}", part_ptr="*fp32", lse_ptr="*fp32", count_ptr="*i32",
                kvs_ptr="*fp32", s_page="i32", s_slot="i32", s_head="i32", qk_scale="fp32")
    sig = {n: args.get(n, "constexpr") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in args
             if n.endswith("_ptr") or n in ints}   # what the runtime specialises: vectorised K/V loads
    g = hq // 8
    bn = 32 if d > 128 else (da.BLOCK_N_FP8 if kv == "fp8e4nv" else da.BLOCK_N)
    ce = dict(HQ=hq, HKV=8, D=d, PAGE=16, BLOCK_M=max(16, g), BLOCK_N=bn, GP=g, MAX_SPLITS=splits,
              MIN_KEYS=max(64, bn), MERGE_S=max(1, min(triton.next_power_of_2(splits), 8192 // (g * d))),
              PREC="ieee" if dt == "fp32" else "tf32", KV_FP8=kv == "fp8e4nv", DOT_F16=bool(f16), DOT_F32=False, PDL=True,
              STAGES=da.STAGES)
    k = triton.compile(ASTSource(fn, sig, constexprs=ce, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    ptx = k.asm["ptx"]
    assert "cubin" in k.asm and k.metadata.shared <= 227 * 1024, k.metadata.shared   # an H100/H200 SM
    if splits > 1:   # release after a CTA barrier, then the merge reads L2
        assert "atom.global.gpu.acq_rel.add" in ptx and "ld.global.cg" in ptx, ptx[-2000:]
    print("ok", dt, kv, hq, d, splits, k.metadata.shared)
'''


def test_kernel_compiles_for_sm90():
    compile_for_sm90(_COMPILE, 7)
