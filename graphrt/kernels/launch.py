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
capture for graphed steps. The CPU interpreter never uses it.
"""
from __future__ import annotations

import contextvars
import functools
from contextlib import contextmanager

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


# the innermost pdl_scope's setting in this thread / task (None: no scope, PDL where capable)
_SCOPE: contextvars.ContextVar[bool | None] = contextvars.ContextVar("graphrt_pdl", default=None)


@contextmanager
def pdl_scope(on: bool):
    """Kernels launched inside use PDL only if `on` (and the device can). A scope inside one
    of the other setting is refused (RuntimeError): one setting per launch path."""
    if not isinstance(on, bool):
        raise ValueError(f"pdl: expected a bool, got {on!r}")
    outer = _SCOPE.get()
    if outer is not None and outer != on:
        raise RuntimeError(f"pdl: a scope with pdl={on} inside one with pdl={outer}")
    token = _SCOPE.set(on)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def use_pdl(t: torch.Tensor) -> bool:
    """Launch kernels over `t` with PDL?"""
    if t.device.type != "cuda" or _SCOPE.get() is False:
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


__all__ = ["pdl_options", "pdl_prologue", "pdl_scope", "use_pdl"]
