"""The decode kernels compile for an H100/H200 (sm_90) through Triton's CUDA backend, ptxas
included, without a GPU. The interpreter runs the kernels' semantics on CPU but accepts code the
compiler rejects (types across scf.if branches, shapes, constexpr use); this catches that here.
Runs in a subprocess without TRITON_INTERPRET, so the kernels are real JITFunctions."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import itertools, warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels import activation, gemv, norm, rope_append

def build(fn, args, constexprs, num_warps, num_stages=3):
    sig = {n: args.get(n, "constexpr") for n in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    assert "cubin" in k.asm
    print("ok", fn.__name__, constexprs)

rope = dict(qkv_ptr="*bf16", qkv_stride="i32", q_ptr="*bf16", cs_ptr="*fp32", num_positions="i32",
            qn_ptr="*bf16", kn_ptr="*bf16", eps="fp32", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
            bt_ptr="*i32", bt_stride="i32", bt_rows="i32", max_pages="i32", num_pool_pages="i32",
            page_size="i32", s_page="i32", s_slot="i32", s_head="i32", lens_ptr="*i32",
            pos_ptr="*i64", rows_ptr="*i32", error_ptr="*i32")
for decode, qk, (bh, d) in itertools.product([True, False], [True, False], [(1, 128), (4, 64)]):
    build(rope_append._rope_append_kernel, rope,
          dict(HQ=32, HKV=8, D=d, BH=bh, BLOCK=d // 2, DECODE=decode, QK_NORM=qk), 1)
for add, split in itertools.product((True, False), (1, 2)):
    build(norm._rms_norm_kernel, dict(x_ptr="*bf16", x_stride="i32", res_ptr="*bf16", res_stride="i32",
          w_ptr="*bf16", out_ptr="*bf16", out_stride="i32", H="i32", eps="fp32"),
          dict(BLOCK=4096, ADD=add, SPLIT=split), 8)
build(norm._rms_norm_kernel, dict(x_ptr="*bf16", x_stride="i32", w_ptr="*bf16", out_ptr="*bf16",   # embed_rms_norm
      out_stride="i32", ids_ptr="*i64", ids_stride="i32", res_ptr="*bf16", res_stride="i32", copy_ptr="*bf16",
      copy_stride="i32", H="i32", eps="fp32"),
      dict(BLOCK=4096, ADD=False, SPLIT=1, GATHER=True, STORE_RES=True, COPY=True), 8)
build(norm._rms_norm_kernel, dict(x_ptr="*bf16", x_stride="i32", res_ptr="*bf16", res_stride="i32",   # + a record
      w_ptr="*bf16", out_ptr="*bf16", out_stride="i32", copy_ptr="*bf16", copy_stride="i32", H="i32", eps="fp32"),
      dict(BLOCK=4096, ADD=True, SPLIT=1, COPY=True), 8)
build(activation._silu_mul_kernel, dict(x_ptr="*bf16", x_stride="i32", out_ptr="*bf16",
      out_stride="i32", I="i32"), dict(BLOCK=1024), 4)
# the GEMV, with and without a bias, at every config the plan times
gv = dict(x_ptr="*bf16", w_ptr="*bf16", s_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16",
          M="i32", N="i32", K="i32", stride_x="i32", stride_w="i32", stride_s="i32", stride_y="i32")
for bias, c in itertools.product((False, True), gemv.CANDIDATES):
    build(gemv._gemv_kernel, gv, dict(BLOCK_M=16, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SCALE_BN=1, SCALE_BK=1,
          SCALED=False, BLOCKWISE=False, HAS_BIAS=bias, DOT_F32=False), c.num_warps, c.num_stages)
'''


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.count("ok ") == 23, run.stdout
