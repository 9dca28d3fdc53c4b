"""What the engine's failure policy needs (docs/engine.md): which exceptions one request may own,
and the error every request gets once the engine could not go on."""
from __future__ import annotations

import torch


class EngineDeadError(RuntimeError):
    """The engine stopped after an error it could not attribute to one request (the cause is
    `__cause__`); every request in flight and every later call gets this."""


def attributable(e: BaseException) -> bool:
    """Whether an exception raised by one request's own work may fail only that request: not a
    device fault (CUDA errors are sticky), not a dead rank, not an interpreter-level error. A
    CUDA out-of-memory error in a prefill is the prompt's (the context survives it)."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    if not isinstance(e, Exception) or isinstance(e, (MemoryError, EngineDeadError)):
        return False
    if type(e).__name__ in ("RankError", "AcceleratorError") or "CUDA error" in str(e):
        return False
    return True


__all__ = ["EngineDeadError", "attributable"]
