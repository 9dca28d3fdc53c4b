"""The persistent decode step's kernel compiles for an H100 / H200 (sm_90) through Triton's CUDA
backend, ptxas included, without a GPU (the interpreter accepts code the compiler rejects), with
the pointer alignment a launch specialises (16-byte aligned tensors): the 1B geometry at 1 row
(multiply-add GEMVs, the L2 prefetch's inline PTX, the timeline's timer) and at 16 rows (tl.dot),
8 warps, and for each: no register spill, every weight load 16 bytes wide (a 2-byte weight load
was the first GPU run's bandwidth ceiling), and no barrier or shuffle inside a multiply-add GEMV
loop. Runs in a subprocess without TRITON_INTERPRET; prints each build's resource line (pytest -s)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import os, re, subprocess, tempfile, warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.kernels.persistent.schedule import Geometry, build_schedule
from graphrt.kernels.persistent.step import _step_kernel, kernel_constexprs

ARGS = dict(units_ptr="*i64", starts_ptr="*i64", ctr_ptr="*i32", err_ptr="*i32", w_ptr="*bf16", woffs_ptr="*i64",
            embed_ptr="*bf16", fnorm_ptr="*bf16", cs_ptr="*fp32", tok_ptr="*i64", lens_ptr="*i32",
            bt_ptr="*i32", bt_stride="i32", num_pages="i32", out_ptr="*i64", logits_ptr="*bf16", res_ptr="*bf16",
            qkv_ptr="*bf16", att_ptr="*bf16", mlp_ptr="*bf16", ss_o_ptr="*fp32", ss_d_ptr="*fp32", part_ptr="*fp32",
            lse_ptr="*fp32", amax_ptr="*fp32", aidx_ptr="*i32", ts_ptr="*i64", programs="i32", nunits="i32",
            nhs="i32", eps="fp32", qk_scale="fp32", SPIN="i32")
G = Geometry(layers=16, hidden=2048, inter=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256)
for rows, gemv, prefetch, timeline in ((1, "fma", 1, True), (16, "dot", 0, False)):
    s = build_schedule(G, rows, 132, max_context_len=4096)
    cx = kernel_constexprs(s, gemv=gemv, prefetch=prefetch, has_bias=False, qk_norm=False, interpreter=False,
                           fp32=False, align=8, xalign=8, PAGE=16, S_PAGE=16 * 8 * 64, S_SLOT=8 * 64,
                           S_HEAD=64, timeline=timeline)
    sig = {n: ARGS.get(n, "constexpr") for n in _step_kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(_step_kernel.arg_names) if sig[n].startswith("*")}
    k = triton.compile(ASTSource(_step_kernel, sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 8, "num_stages": 1})
    ptx = k.asm["ptx"]
    weight = re.findall(r"ld\.global\.L1::evict_first\S*", ptx)            # the weight chunks
    narrow = [w for w in weight if ".v4." not in w]
    loops, lines = [], ptx.splitlines()
    for i, line in enumerate(lines):                                       # innermost loops
        if "Inner Loop Header" not in line:
            continue
        j = i
        while not re.match(r"(\$L__BB\d+_\d+):", lines[j]):
            j -= 1
        label = re.match(r"(\$L__BB\d+_\d+):", lines[j]).group(1)
        ends = [e for e in range(i, len(lines)) if re.search(r"bra(\.uni)?\s+" + re.escape(label) + ";", lines[e])]
        body = "\n".join(lines[j:ends[-1]]) if ends else ""
        if "evict_first" in body:                                          # a GEMV loop
            loops.append((body.count("bar.sync"), body.count("shfl.sync")))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = [l.strip() for l in subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                                               text=True).stdout.splitlines() if "REG:" in l]
    os.unlink(f.name)
    clean = all(b == 0 and sh == 0 for b, sh in loops)
    print("ok", rows, gemv, usage[0] if usage else "?", f"weight loads {len(weight)} narrow {len(narrow)}",
          f"gemv loops {len(loops)} clean {clean}", f"(barriers, shuffles) {loops}")
'''


def test_persistent_step_compiles_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("ok ")]
    print("\n".join(lines))
    assert len(lines) == 2, run.stdout
    for line in lines:
        assert "STACK:0 " in line, line                            # no register spill
        assert " narrow 0 " in line and "weight loads 0 " not in line, line
    assert "gemv loops 6 clean True" in lines[0], lines[0]         # qkv, o, gate_up, down, lm_head, layer-0 qkv
