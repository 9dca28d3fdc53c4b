"""The speculative kernels compile for an H100/H200 (sm_90) through Triton's CUDA backend, ptxas
included, without a GPU (the interpreter accepts code the compiler rejects); acceptance draws
through the sampler, whose kernel tests/model/test_sampling.py compiles. Runs in a
subprocess without TRITON_INTERPRET, so the kernels are real JITFunctions."""
from __future__ import annotations

from _sm90 import compile_for_sm90

SCRIPT = r'''
import warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels import multiquery_attention as mq
from graphrt.speculative import accept, ngram

def build(fn, args, constexprs, num_warps=4):
    sig = {n: args.get(n, "constexpr") for n in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps})
    assert "cubin" in k.asm
    print("ok", fn.__name__, constexprs)

build(ngram._ngram_kernel, dict(tok_ptr="*i32", tok_stride="i32", width="i32", lens_ptr="*i32",
      out_ptr="*i64", count_ptr="*i32", min_n="i32"), dict(K=4, MAX_N=4, BLOCK=256, KB=4))
build(accept._advance_kernel, dict(accept_ptr="*i32", fallback_ptr="*i64", prop_ptr="*i64",
      tok_ptr="*i32", tok_stride="i32", width="i32", n_rows="i32", num_ptr="*i32", limit_ptr="*i32",
      step_ptr="*i32", out_ptr="*i64", emitted_ptr="*i32"), dict(Q=5, QB=8, ROWS=1))
mqa = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", bt_ptr="*i32", bt_stride="i32",
           lens_ptr="*i32", qlens_ptr="*i32", out_ptr="*bf16", part_ptr="*fp32", lse_ptr="*fp32",
           s_page="i32", s_slot="i32", s_head="i32", page_size="i32", splits="i32", n_tiles="i32",
           Q="i32", qk_scale="fp32", kvs_ptr="*i32")
for split in (True, False):
    for q, d in ((5, 128), (8, 64), (1, 128)):
        build(mq._mq_attention_kernel, mqa, dict(HQ=32, HKV=8, D=d, TILE_T=q,
              BLOCK_M=max(16, triton.next_power_of_2(q * 4)), BLOCK_N=64, SPLIT=split, PREC="tf32",
              KV_FP8=False, QLENS=False))
    t, m, _ = mq.query_tiles(512, 4)                  # a graphed prefill chunk: query tiles, q_lens
    build(mq._mq_attention_kernel, mqa, dict(HQ=32, HKV=8, D=128, TILE_T=t, BLOCK_M=m, BLOCK_N=128,
          SPLIT=split, PREC="tf32", KV_FP8=False, QLENS=True), num_warps=8)
build(mq._combine_kernel, dict(part_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16", splits="i32"),
      dict(D=128, SB=8))
'''


def test_speculative_kernels_compile_for_sm90():
    compile_for_sm90(SCRIPT, 11)
