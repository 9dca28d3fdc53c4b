"""The small per-round / per-step kernels (speculative/prologue.py, kernels/step_advance.py,
kernels/query_layout.py, speculative/accept.py's comparison and advance, the EAGLE-3 and draft rounds' preps) compile to PTX for sm_90 without a
GPU: the interpreter accepts code the compiler refuses."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt.speculative.prologue import _round_inputs_kernel
from graphrt.kernels.step_advance import _step_advance_kernel
from graphrt.kernels.query_layout import _query_layout_kernel
from graphrt.speculative.accept import _accept_kernel, _advance_kernel
from graphrt.speculative.eagle3.propose import _round_prep_kernel
from graphrt.speculative.draft_prep import _draft_prep_kernel
cases = [
    (_round_inputs_kernel, {"hist_ptr": "*i32", "hist_stride": "i32", "width": "i32", "n_rows": "i32",
                            "num_ptr": "*i32", "limit_ptr": "*i32", "cap_ptr": "*i32", "prop_ptr": "*i64",
                            "count_ptr": "*i32", "tokens_ptr": "*i64", "cache_lens_ptr": "*i32",
                            "proposed_ptr": "*i32", "K": "constexpr", "KB": "constexpr", "ROWS": "constexpr",
                            "FILL": "constexpr"},
     {"K": 4, "KB": 4, "ROWS": 1, "FILL": False}),
    (_round_inputs_kernel, None, {"K": 3, "KB": 4, "ROWS": 1, "FILL": True}),
]
for hist in (True, False):
    for lim in (False, True):
        cases.append((_step_advance_kernel, {"out_ptr": "*i64", "tokens_ptr": "*i64", "seq_ptr": "*i32",
                                             "hist_ptr": "*i32" if hist else "*i64", "hist_stride": "i32",
                                             "width": "i32", "n_rows": "i32", "limit_ptr": "*i32",
                                             "HAS_HIST": "constexpr", "HAS_LIMIT": "constexpr", "ROWS": "constexpr"},
                      {"HAS_HIST": hist, "HAS_LIMIT": lim, "ROWS": 1}))
for q, has in ((5, False), (16, True), (1, False)):
    cases.append((_query_layout_kernel, {"cache_lens_ptr": "*i32", "q_lens_ptr": "*i32", "positions_ptr": "*i32",
                                         "rows_ptr": "*i32", "kv_lens_ptr": "*i32", "n_rows": "i32",
                                         "offset": "i32", "Q": "constexpr", "QB": "constexpr", "HAS_Q_LENS": "constexpr",
                                         "ROWS": "constexpr"},
                  {"Q": q, "QB": triton.next_power_of_2(q), "HAS_Q_LENS": has, "ROWS": 1}))
cases.append((_accept_kernel, {"fallback_ptr": "*i64", "prop_ptr": "*i64", "count_ptr": "*i32", "accept_ptr": "*i32",
                               "n_rows": "i32", "Q": "constexpr", "QB": "constexpr", "ROWS": "constexpr"},
              {"Q": 5, "QB": 8, "ROWS": 1}))
for cur in (False, True):
    cases.append((_advance_kernel, {"accept_ptr": "*i32", "fallback_ptr": "*i64", "prop_ptr": "*i64", "tok_ptr": "*i32",
                                    "tok_stride": "i32", "width": "i32", "n_rows": "i32", "num_ptr": "*i32",
                                    "limit_ptr": "*i32", "step_ptr": "*i32", "out_ptr": "*i64", "emitted_ptr": "*i32",
                                    "cur_ptr": "*i64", "Q": "constexpr", "QB": "constexpr", "ROWS": "constexpr",
                                    "CUR": "constexpr"}, {"Q": 5, "QB": 8, "ROWS": 1, "CUR": cur}))
cases.append((_round_prep_kernel, {"emitted_ptr": "*i32", "cache_lens_ptr": "*i32", "cl_ptr": "*i32", "at_ptr": "*i64",
                                   "base_ptr": "*i32", "n_rows": "i32", "Q": "constexpr", "ROWS": "constexpr"},
              {"Q": 5, "ROWS": 1}))
cases.append((_draft_prep_kernel, {"hist_ptr": "*i32", "hist_stride": "i32", "width": "i32", "num_ptr": "*i32",
                                   "limit_ptr": "*i32", "toks_ptr": "*i64", "base_ptr": "*i32", "count_ptr": "*i32",
                                   "n_rows": "i32", "K": "constexpr", "ROWS": "constexpr"}, {"K": 4, "ROWS": 1}))
last = None
for fn, sig, const in cases:
    sig = sig or last
    last = sig
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32))
    assert "ptx" in k.asm, fn
print("compiled", len(cases))
"""


def test_round_kernels_compile_for_sm90_without_a_gpu():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "compiled 14" in r.stdout
