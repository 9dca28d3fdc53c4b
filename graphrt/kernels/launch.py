"""Programmatic dependent launch (PDL) for graphrt's element-wise Triton kernels (Hopper+).

A kernel launched with PDL may be scheduled while the kernel before it on the stream is still
running; inside a CUDA graph the dependency becomes a programmatic edge. Every kernel that
takes `PDL` therefore starts with `pdl_prologue`: it waits (griddepcontrol.wait) for the
previous kernel's memory before it reads or writes anything, then lets the next kernel be
scheduled early. A kernel launched without PDL executes both as no-ops.

    kernel[grid](..., PDL=on, **pdl_options(on))      # on = use_pdl(tensor)
    with pdl_scope(False):                            # launches in here: no PDL
        graphs.capture(...)

`use_pdl`: CUDA tensors on compute capability >= 9.0, unless the launch runs inside
`pdl_scope(False)` (the graph runner, attention/graphs.py, opens one around every warm-up,
capture and eager run with its `pdl` setting: RuntimeOptions.pdl, or GRAPHRT_PDL=0 through
model/options.py, the A/B switch of tools/profile_step.py; on the H200 PDL took the 8B bf16
step's gaps between kernels from 197 to 119 µs). The setting is read at each launch, i.e. at
capture for graphed steps. The CPU interpreter never uses it. The host side (pdl_scope, use_pdl,
pdl_options) lives in kernels/launch_options.py, which imports no Triton (the graph runner opens
scopes on every device); it is re-exported here.
"""
from __future__ import annotations

import triton
import triton.language as tl

from graphrt.kernels.launch_options import pdl_options, pdl_scope, use_pdl


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


__all__ = ["pdl_options", "pdl_prologue", "pdl_scope", "use_pdl"]
