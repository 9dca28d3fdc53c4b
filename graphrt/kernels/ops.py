"""Which implementation of graphrt's per-layer kernels a model runs: one choice per model,
resolved once when it is built, never probed per call.

    ops = kernel_ops("torch")          # kernels/reference.py: torch ops (a CPU's default)
    ops = kernel_ops("triton")         # the Triton kernels (CUDA; on a CPU, Triton's interpreter)
    h = ops.rms_norm(x, w, eps)

Both sets have the same functions with the same signatures and contracts (the references are
the kernel tests' oracle). `resolve_kernels` gives the default: "torch" on a CPU, "triton" on
CUDA. The Triton modules are imported only when the "triton" set is built, so a model on the
torch set runs where Triton is not installed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

KERNELS = ("triton", "torch")


@dataclass(frozen=True)
class KernelOps:
    """One kernel set: the functions the model's layer loop and decode step call."""

    name: str
    rms_norm: Callable
    add_rms_norm: Callable
    embed_rms_norm: Callable
    silu_mul: Callable
    rope_append_decode: Callable
    rope_append_prefill: Callable
    argmax_into: Callable
    step_advance: Callable


def check_kernels(kernels) -> None:
    """ValueError unless kernels is None, "auto" or one of KERNELS."""
    if kernels is not None and kernels != "auto" and (not isinstance(kernels, str) or kernels not in KERNELS):
        raise ValueError(f"kernels: {kernels!r} is not one of {list(KERNELS)} (or None / 'auto': torch on "
                         f"a CPU, triton on CUDA)")


def resolve_kernels(kernels, device) -> str:
    """None / "auto" -> "torch" on a CPU device, "triton" on CUDA; a name in KERNELS as given."""
    check_kernels(kernels)
    if kernels in (None, "auto"):
        return "torch" if torch.device(device).type == "cpu" else "triton"
    return kernels


def kernel_ops(name: str) -> KernelOps:
    """The kernel set `name` ("triton" or "torch"); ValueError otherwise."""
    check_kernels(name)
    if name == "torch":
        from graphrt.kernels import reference as r
        return KernelOps("torch", r.rms_norm, r.add_rms_norm, r.embed_rms_norm, r.silu_mul,
                         r.rope_append_decode, r.rope_append_prefill, r.argmax_into, r.step_advance)
    if name != "triton":
        raise ValueError(f"kernels: {name!r} is not one of {list(KERNELS)}")
    from graphrt.kernels.activation import silu_mul
    from graphrt.kernels.argmax import argmax_into
    from graphrt.kernels.norm import add_rms_norm, embed_rms_norm, rms_norm
    from graphrt.kernels.rope_append import rope_append_decode, rope_append_prefill
    from graphrt.kernels.step_advance import step_advance
    return KernelOps("triton", rms_norm, add_rms_norm, embed_rms_norm, silu_mul, rope_append_decode,
                     rope_append_prefill, argmax_into, step_advance)


__all__ = ["KERNELS", "KernelOps", "check_kernels", "kernel_ops", "resolve_kernels"]
