"""Slot changes: what the engine's scheduler describes, the executor applies.

    changes = scheduler.take_changes()              # recorded since the last launch, in order
    ex.prefill(Prefill(..., changes=changes))       # or Block(..., changes=...): applied first
    batch.record(changes); batch.flush(slots.apply) # the executor (worker/local.py): the one writer

The scheduler never writes a slot's device rows, nor their host mirror: it records each change as
one of these small frozen records (plain host data: a tensor-parallel driver pickles them with
the launch to every rank), and every launch carries the changes recorded since the one before.
The executor hands them to its InputBatch (input_batch.py), which stages what changed into the
runtime's SlotState (model/slots.py) before the launch runs. Pure host code.
"""
from __future__ import annotations

from dataclasses import dataclass

from graphrt.model.processing import ProcessRows


@dataclass(frozen=True, slots=True)
class SetPages:
    """block_table[slot, col:col + len(pages)] = pages (admission, a row's growth)."""
    slot: int
    col: int
    pages: tuple


@dataclass(frozen=True, slots=True)
class Activate:
    """The row decodes from the next block: seq_len counts its current token; step: the draw
    index of its next token; temperature (0 = greedy), top_k (0 = off), top_p, seed: its
    sampling row; limit: the most tokens it may hold (speculative rounds); spec_k: proposals a
    speculative round may verify for it."""
    slot: int
    seq_len: int
    step: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    limit: int = 0
    spec_k: int = 0


@dataclass(frozen=True, slots=True)
class Deactivate:
    """The row becomes padding (seq_len 0) and stops advancing; free: the slot is freed too (its
    block-table row back to PAD_PAGE in the host mirror: the device row is stale, never read)."""
    slot: int
    free: bool = False


@dataclass(frozen=True, slots=True)
class SetToken:
    """The row's current token (a row that decodes from its last context token, with no prefill
    draw before it)."""
    slot: int
    token: int


@dataclass(frozen=True, slots=True)
class SetHistory:
    """history[slot, :len(tokens)] = tokens (speculation: the slot's prompt + accepted tokens)."""
    slot: int
    tokens: list


@dataclass(frozen=True, slots=True)
class SetProcessing:
    """The slot's logits-processing row reset to `rows` (one row of model/processing.py's
    ProcessRows: a row that starts decoding without a prefill of its own)."""
    slot: int
    rows: ProcessRows


@dataclass(frozen=True, slots=True)
class SetSpecK:
    """The most proposals a speculative round may verify for the row (its SPEC_K; Activate
    sets it to the configured k): a constrained row's proposals capped at the first token its
    grammar refuses, before a one-round block."""
    slot: int
    k: int


SLOT_CHANGES = (SetPages, Activate, Deactivate, SetToken, SetHistory, SetProcessing, SetSpecK)


def check_changes(changes) -> tuple:
    """`changes` (a tuple or list of SLOT_CHANGES records) as a tuple; ValueError naming changes."""
    if not isinstance(changes, (tuple, list)):
        raise ValueError(f"changes: expected a tuple of slot changes, got {type(changes).__name__}")
    for c in changes:
        if type(c) not in SLOT_CHANGES:
            raise ValueError(f"changes: {type(c).__name__} is not a slot change "
                             f"({', '.join(t.__name__ for t in SLOT_CHANGES)})")
    return tuple(changes)


__all__ = ["Activate", "Deactivate", "SLOT_CHANGES", "SetHistory", "SetPages", "SetProcessing", "SetSpecK",
           "SetToken", "check_changes"]
