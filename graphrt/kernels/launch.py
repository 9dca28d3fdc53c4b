"""Programmatic dependent launch (PDL) for graphrt's element-wise Triton kernels (Hopper+).

A kernel launched with PDL may be scheduled while the kernel before it on the stream is still
running; inside a CUDA graph the dependency becomes a programmatic edge. Every kernel that
takes `PDL` therefore starts with `pdl_prologue`: it waits (griddepcontrol.wait) for the
previous kernel's memory before it reads or writes anything, then lets the next kernel be
scheduled early. A kernel launched without PDL executes both as no-ops.

    kernel[grid](..., PDL=on, **pdl_options(on))      # on = use_pdl(tensor)

`use_pdl`: CUDA tensors on compute capability >= 9.0, unless the environment sets
GRAPHRT_PDL=0 (read at each launch, i.e. at capture for graphed steps: the A/B switch of
tools/profile_step.py; on the H200 PDL took the 8B bf16 step's gaps between kernels from 197
to 119 µs). The CPU interpreter never uses it.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def use_pdl(t: torch.Tensor) -> bool:
    """Launch kernels over `t` with PDL?"""
    if t.device.type != "cuda" or os.environ.get("GRAPHRT_PDL", "1") == "0":
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_options(on: bool) -> dict:
    """Launch keyword arguments for a PDL launch (none otherwise)."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


__all__ = ["pdl_options", "pdl_prologue", "use_pdl"]
