"""Which implementation of the speculative kernels a runner uses: the target model's kernel set's.

    spec = spec_ops(model.kernels)      # "triton": ngram.py, prologue.py, accept.py, draft_prep.py
    spec.judge(logits, ...)             # "torch": their references (speculative/reference.py)

kernels/ops.py's mechanism one layer up (these kernels belong to speculation): the same two names,
one choice per model, so a model on the torch set (a CPU's default) speculates without Triton,
and the Triton set's rounds run the Triton kernels (compiled on CUDA, interpreted on a CPU). Both
sets have the same functions with the same signatures and contracts. The Triton modules are
imported only when the "triton" set is built.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from graphrt.kernels.ops import KERNELS, check_kernels
from graphrt.kernels.triton_import import require_triton


@dataclass(frozen=True)
class SpecOps:
    """One set of the speculative rounds' kernels."""

    name: str
    ngram_propose: Callable
    round_inputs: Callable
    judge: Callable
    advance: Callable
    draft_prep: Callable


def spec_ops(kernels: str) -> SpecOps:
    """The speculative kernels of kernel set `kernels` ("triton" or "torch"; ValueError otherwise;
    "triton" without Triton installed: TritonMissing). Built once per name."""
    check_kernels(kernels)
    if kernels not in KERNELS:
        raise ValueError(f"kernels: {kernels!r} is not one of {list(KERNELS)}")
    return _build(kernels)


@functools.lru_cache(maxsize=None)
def _build(name: str) -> SpecOps:
    if name == "torch":
        from graphrt.speculative import reference as r
        return SpecOps("torch", r.ngram_propose, r.round_inputs, r.judge, r.advance, r.draft_prep)
    require_triton("speculative decoding with kernels='triton'")
    from graphrt.speculative.accept import advance, judge
    from graphrt.speculative.draft_prep import draft_prep
    from graphrt.speculative.ngram import ngram_propose
    from graphrt.speculative.prologue import round_inputs
    return SpecOps("triton", ngram_propose, round_inputs, judge, advance, draft_prep)


__all__ = ["SpecOps", "spec_ops"]
