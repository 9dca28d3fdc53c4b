"""The engine-device boundary: the one interface the engine drives.

    ex.capture()                                  # every phase's graphs; K ("auto") fixed here
    caps = ex.caps                                # Capabilities, read once (caps.py)
    ex.stage_chunk(slot, tokens, start)           # a prompt chunk for the next Block(chunk=True)
    res = ex.prefill(Prefill(...))                # launch.py: Result
    res = ex.run(Block(n, k, draw, changes=...))  # a plain or speculative block: Result
    ex.check_device_errors()                      # raise what the sticky guard flags name

Implementations: LocalExecutor (worker/local.py: one process, one device) and TPExecutor
(graphrt/parallel/executor.py: rank 0 broadcasts each call, every rank runs it); tests run the
engine against a pure-Python fake. The engine reads nothing else of an executor: what one cannot
do is a Capabilities field, refused where a request or a config asks for it.

Every call is a pure function of the executor's slot rows (model/slots.py) and its arguments,
so a tensor-parallel driver can replay the same call on every rank. The slot rows have one host
writer: the executor. The engine's scheduler describes its slot changes (worker/changes.py) and
each launch (Prefill, Block) carries those recorded since the last one; the executor applies them
(its InputBatch) before it runs the launch, and its launches' draws advance the rows on the device.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from graphrt.worker.caps import Capabilities
from graphrt.worker.launch import Block, Prefill, Result


@runtime_checkable
class Executor(Protocol):
    caps: Capabilities
    # [1] int32 device: the sticky device-guard flags, read with every block's tokens (nonzero:
    # check_device_errors says which guard); None when caps.device_errors is False
    error_flag: torch.Tensor | None

    def capture(self) -> dict:
        """Capture every phase's graphs (a no-op where nothing is captured) -> {key: stats};
        K ("auto") and so `caps` are final after it."""

    def stage_chunk(self, slot: int, tokens: torch.Tensor, start: int, *, table_row=None) -> None:
        """Stage CPU [m] int64 prompt tokens (m <= caps.mixed_tokens) at positions [start,
        start + m) of `slot` for the next Block(chunk=True); ValueError names the field."""

    def prefill(self, launch: Prefill) -> Result:
        """Apply launch.changes to the slots, then run a prefill (launch.py's Prefill) -> Result
        (tokens [1, m] when it draws)."""

    def run(self, block: Block) -> Result:
        """Apply block.changes to the slots, then run one block (launch.py's Block) -> Result of
        device views."""

    def write_token_mask(self, slots: list[int], bits: torch.Tensor, active: torch.Tensor) -> None:
        """Constrained decoding (caps.structured): the allowed-token masks of `slots` (bits [m, W]
        int32, W = ceil(vocab / 32), or [m, p, W]: positions 0..p-1, the masks before each of a
        speculative round's verified proposals and after the last (caps.spec_grammar); active
        [m] int32, 1 = constrained; CPU), read by the next processed draws of those slots (a
        prefill's first draws, processed blocks and rounds); stream-ordered, no sync.
        ValueError naming structured_outputs where caps.structured is False."""

    def prefill_graphed(self, new_tokens: int) -> bool:
        """Whether a prefill of this many new tokens (no prompt log-probs) runs through prefill
        graphs (one replay per piece of one request: splitting a step's prefill adds no weight
        pass). Pure over the executor's state."""

    def measure_costs(self):
        """speculative/policy.py's StepCosts of the captured graphs, or None (nothing captured,
        no speculation)."""

    def check_device_errors(self) -> None:
        """Raise DeviceInputError naming the guard that flagged (a no-op when none did)."""


def check_executor(executor) -> Executor:
    """`executor` when it implements the protocol, else ValueError naming what is missing."""
    if not isinstance(executor, Executor):
        missing = [n for n in ("caps", "error_flag", "capture", "stage_chunk", "prefill", "run", "write_token_mask",
                               "prefill_graphed", "measure_costs", "check_device_errors")
                   if not hasattr(executor, n)]
        raise ValueError(f"executor: {type(executor).__name__} does not implement graphrt.worker.Executor "
                         f"(missing {missing})")
    if not isinstance(executor.caps, Capabilities):
        raise ValueError(f"executor.caps: expected Capabilities, got {type(executor.caps).__name__}")
    return executor


__all__ = ["Executor", "check_executor"]
