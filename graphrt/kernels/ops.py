"""Which implementation of graphrt's per-layer kernels a model runs: one choice per model,
resolved once when it is built, never probed per call.

    ops = kernel_ops("torch")          # kernels/reference.py: torch ops (a CPU's default)
    ops = kernel_ops("triton")         # the Triton kernels (CUDA; on a CPU, Triton's interpreter)
    h = ops.rms_norm(x, w, eps)

Both sets have the same functions with the same signatures and contracts (the references are
the kernel tests' oracle): the layer loop's (kernels/reference.py), the multi-query attention
of verify steps, prompt pieces and mixed chunks (kernels/reference_attention.py), and those that draw a step's
tokens: sampling, logits processing, log-probabilities, allowed-token masks
(kernels/reference_sample.py; the RNG is Triton's Philox in torch, bit for bit, so both sets
draw the same tokens from the same scores). `resolve_kernels` gives the default: "torch" on a
CPU, "triton" on CUDA. The Triton modules are imported only when the "triton" set is built, so
a model on the torch set runs where Triton is not installed (a CPU install carries none).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from graphrt.kernels.triton_import import require_triton

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
    # Q query tokens a row: verify steps, graphed prompt pieces, mixed chunks
    query_layout: Callable
    multiquery_attention: Callable
    # drawing a step's tokens (model/draw.py and the helpers it calls)
    sample_tokens: Callable
    kept_lengths: Callable
    process_logits: Callable
    process_draw: Callable
    logprobs_into: Callable
    apply_token_mask: Callable


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
    """The kernel set `name` ("triton" or "torch"); ValueError otherwise. "triton" where Triton
    is not installed: TritonMissing (an ImportError saying how to install it). Built once per
    name (the same object every call)."""
    check_kernels(name)
    if name not in KERNELS:
        raise ValueError(f"kernels: {name!r} is not one of {list(KERNELS)}")
    return _build(name)


@functools.lru_cache(maxsize=None)
def _build(name: str) -> KernelOps:
    if name == "torch":
        from graphrt.kernels import reference as r
        from graphrt.kernels import reference_attention as a
        from graphrt.kernels import reference_sample as d
        return KernelOps("torch", r.rms_norm, r.add_rms_norm, r.embed_rms_norm, r.silu_mul,
                         r.rope_append_decode, r.rope_append_prefill, r.argmax_into, r.step_advance,
                         a.query_layout, a.multiquery_attention, d.sample_tokens, d.kept_lengths, d.process_logits, d.process_draw, d.logprobs_into,
                         d.apply_token_mask)
    require_triton("kernels='triton'")
    from graphrt.kernels.activation import silu_mul
    from graphrt.kernels.argmax import argmax_into
    from graphrt.kernels.logits_process import logprobs_into, process_draw, process_logits
    from graphrt.kernels.multiquery_attention import multiquery_attention
    from graphrt.kernels.norm import add_rms_norm, embed_rms_norm, rms_norm
    from graphrt.kernels.query_layout import query_layout
    from graphrt.kernels.rope_append import rope_append_decode, rope_append_prefill
    from graphrt.kernels.sample import kept_lengths, sample_tokens
    from graphrt.kernels.step_advance import step_advance
    from graphrt.kernels.token_mask import apply_token_mask
    return KernelOps("triton", rms_norm, add_rms_norm, embed_rms_norm, silu_mul, rope_append_decode,
                     rope_append_prefill, argmax_into, step_advance, query_layout, multiquery_attention,
                     sample_tokens, kept_lengths,
                     process_logits, process_draw, logprobs_into, apply_token_mask)


def default_ops(ops: KernelOps | None) -> KernelOps:
    """ops, or the Triton set where None (the drawing helpers' default when no model's set is
    passed: the kernel tests' and the GPU's)."""
    return kernel_ops("triton") if ops is None else ops


__all__ = ["KERNELS", "KernelOps", "check_kernels", "default_ops", "kernel_ops", "resolve_kernels"]
