"""Programmatic dependent launch (PDL), the host side: whether a launch uses it (no Triton).

    with pdl_scope(False):                 # launches in here: no PDL (the graph runner's setting)
        ...
    on = use_pdl(tensor); kernel[grid](..., PDL=on, **pdl_options(on))

kernels/launch.py has the device side (`pdl_prologue`, which every PDL kernel starts with) and
says what PDL does; this module is what code that never launches a Triton kernel needs (the graph
runner, attention/graphs.py, and the model runtime open scopes on every device).
"""
from __future__ import annotations

import contextvars
import functools
from contextlib import contextmanager

import torch


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


__all__ = ["pdl_options", "pdl_scope", "use_pdl"]
