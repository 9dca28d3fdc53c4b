"""Constrained rows' launches and read-backs: a mixin of Engine (through engine/blocks.py's
BlockMixin), with the state the engine owns (`scheduler`, `runtime`, `_pending`, `_masked_slots`:
the slots whose mask flag is on, `_ahead`: a split step's forward launched before its draw).

How a block holding constrained rows runs (docs/structured-output.md):
- masked, one step in two launches (`_split_step`): the forward; the blocks in flight read back
  and each constrained row's next mask written (`_write_masks`) while it runs; the draw. With
  overlap and RUN_AHEAD (off by default: no measured gain) the next step's forward is launched
  right after the draw (`_run_ahead`) and the next block takes it up (`_matching_ahead`), or
  drops it (a forward advances no slot);
- with grammar-checked n-gram proposals, one speculative round (`_grammar_round`);
- unmasked (engine/structured.py FreeRun), when every constrained row's model has agreed with its
  grammar (the raw argmax of split steps and of grammar rounds' verified positions): a whole
  K-step block, or with n-gram speculation an R-round one, with their mask flags off (`_unmask`);
  its tokens are checked when read (`_checked`) and a row whose token was refused is set back
  (`_set_back`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.engine import structured
from graphrt.engine.scheduler import Request
from graphrt.speculative.ngram_rule import NgramIndex
from graphrt.worker.launch import Block, Draw


@dataclass
class _Ahead:
    """The forward of a split step launched ahead of its draw (`_run_ahead`): the rows it ran
    ((id, epoch) of each, in order), and the timing event recorded before it (or None)."""
    ids: tuple
    start: object = None


class ConstrainedMixin:
    """The engine's constrained-row launches (see the module docstring)."""

    # a split step's next forward launched right after its draw (_run_ahead): off by default, as
    # measured on an H100 it gained nothing at the 1B shape (serial / ahead 1.001) and cost 0.5-2% on
    # a 135M model's JSON (0.982-0.995: forwards dropped at set-backs and prefills cost device time)
    RUN_AHEAD = False
    FREE_RUN = True                # constrained rows may decode unmasked (engine/structured.py FreeRun)

    def _masked_rows(self) -> tuple[list | None, bool]:
        """The constrained rows the next block masks (None: none), and whether it is a free block
        (every constrained row runs unmasked: a whole K-step block, their mask flags turned off
        here, their tokens checked when read)."""
        live = self.scheduler.constrained
        if not live:
            return None, False
        masked = list(live.values())
        if (self.spec is None or self.caps.spec_grammar) and all(r.grammar.unmasked for r in masked):
            self._unmask(masked)
            return None, True
        return masked, False

    def _matching_ahead(self, ahead: _Ahead | None, rows: list, *, split: bool) -> _Ahead | None:
        """`ahead` if the block about to launch is its step: a split step (`split`) over the same
        rows at the same epochs with no slot change recorded since; else None (dropped: a forward
        advances no slot, so its step never happened)."""
        if ahead is None or not split or self.scheduler.changes \
                or ahead.ids != tuple((id(r), r.epoch) for r in rows):
            return None
        return ahead

    def _run_ahead(self) -> None:
        """After a split step's draw: the next step's forward, launched now (its rows' pages grown,
        the slot changes recorded so far carried), so that the device runs it while the host reads
        the draw's tokens back and goes round its loop; the next block's draw takes it up if it is
        the same step over the same rows (`_ahead`), else it is dropped. Not while requests wait
        to be admitted or prefilled (their prefill would drop it)."""
        s = self.scheduler
        if (s.waiting and s.free_slots) or s.prefilling or not self._inbox.empty() \
                or all(r.grammar.unmasked for r in s.constrained.values()):
            return                                    # (none constrained, or all unmasked: a K-step block)
        rows = s.decode_rows()
        rows = s.grow(rows) if rows else rows
        if not rows:
            return
        start = self._block_start()
        changes = s.take_changes()
        try:
            self.runtime.run(Block(max(r.slot for r in rows) + 1, draw=Draw(sampled=True, processed=True),
                                   part="forward", changes=changes))
        except BaseException:
            s.restore_changes(changes)
            raise
        self._ahead = _Ahead(tuple((id(r), r.epoch) for r in rows), start)

    def _split_step(self, n: int, draw: Draw, masked: list, logprobs: bool, changes: tuple, *,
                    forward: bool = True):
        """One step over rows [0, n) holding constrained rows (`masked`), in two launches
        (model/runtime.py's split steps): the forward (carrying the slot changes; forward=False:
        launched ahead already, `_run_ahead`); then, while it runs, every block in flight is read
        back (each matcher sees every token drawn so far: its next mask depends on them;
        streaming, stop checks and the matchers' work overlap the forward), the constrained rows'
        next-token masks are written, and the draw is launched (changes recorded meanwhile go
        with the next launch). -> the draw's Result ([1, n] tokens). A row that finished
        meanwhile still draws (discarded)."""
        ex = self.runtime
        if forward:
            ex.run(Block(n, draw=draw, part="forward", changes=changes))
        while self._pending:
            self._finish(self._pending.popleft())
        self._write_masks(masked)
        return ex.run(Block(n, draw=draw, part="draw", logprobs=logprobs))

    def _grammar_round(self, rows: list, k: int) -> list:
        """Before a one-round speculative block over `rows`, which hold constrained rows: every
        block in flight is read (a proposal and its masks follow every token); each constrained
        row's device proposal is predicted on the host (n-gram over prompt + tokens, the slot's
        history: its NgramIndex), cut at the first token its grammar refuses (the slot's k is
        capped there), and its masks before each kept proposal and after the last are written
        (positions 0..kept; the verify applies them). -> the rows still decoding."""
        while self._pending:
            self._finish(self._pending.popleft())
        rows = [r for r in rows if r.slot >= 0 and r.finish_reason is None]
        live = list(self.scheduler.constrained.values())
        if not rows or not live:
            return rows
        c = self.spec
        bits = torch.full((len(live), k + 1, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
        for i, r in enumerate(live):
            index = r.ngram
            if index is None:
                index = r.ngram = NgramIndex(c.ngram_min, c.ngram_max)
                index.extend(r.prompt)
            index.extend(r.token_ids[len(index) - len(r.prompt):])
            self.scheduler.cap_proposals(r, r.grammar.fill_along(index.propose(k), bits[i]))
        self.runtime.write_token_mask([r.slot for r in live], bits, torch.ones(len(live), dtype=torch.int32))
        self._masked_slots.update(r.slot for r in live)
        return rows

    def _unmask(self, reqs: list) -> None:
        """Before a K-step (or R-round speculative) block whose constrained rows `reqs` run
        unmasked: the mask flags of those still on, off (a processed block would apply them at
        every step), and, with speculation, each such row's proposal cap back to num_tokens (a
        grammar round capped it at its grammar's)."""
        on = [r.slot for r in reqs if r.slot in self._masked_slots]
        if on and self.spec is not None:
            for r in reqs:
                if r.slot in self._masked_slots:
                    self.scheduler.cap_proposals(r, self.spec.num_tokens)
        if on:
            words = (self.vocab_size + 31) // 32
            self.runtime.write_token_mask(on, torch.full((len(on), words), -1, dtype=torch.int32),
                                          torch.zeros(len(on), dtype=torch.int32))
            self._masked_slots.difference_update(on)

    def _set_back(self, req: Request) -> None:
        """req's unmasked tokens were refused by its grammar after the ones accepted: its row
        decodes again from its last accepted token (Scheduler.resume), masked; its draws in
        flight are discarded (its epoch moves on)."""
        req.epoch += 1
        req.launched = len(req.token_ids)
        req.grammar.free.refused()
        self.scheduler.resume(req)

    def _write_masks(self, reqs: list, *, prefill: bool = False) -> None:
        """The allowed-token masks of the live constrained requests among `reqs` into their
        slots before a launch draws for them (structured.fill_masks; written through the
        executor's write_token_mask); a prefill also clears the flag of a slot a constrained
        request held before."""
        masked = self._masked_slots
        rows = [r for r in reqs if (r.grammar is not None and r.slot >= 0 and r.finish_reason is None)
                or (prefill and r.slot in masked)]
        if not rows:
            return
        bits, active = structured.fill_masks(rows, self.vocab_size)
        self.runtime.write_token_mask([r.slot for r in rows], bits, active)
        for r in rows:
            (masked.add if r.grammar is not None else masked.discard)(r.slot)

    def _checked(self, g, block, col: int, tokens: list[int]) -> tuple[list[int], bool]:
        """A constrained row's tokens read back (g: its GrammarState with a FreeRun): an unmasked
        block's are cut at the first its grammar refuses -> (tokens kept, refused); a masked
        step's raw argmax tells whether its model agreed with the mask it was drawn under."""
        if block.free:
            j = g.prefix(tokens)
            if j < len(tokens):
                return tokens[:j], True
            g.free.kept()
        elif block.argmax is not None and block.kind == "spec":     # a grammar round: per position
            best = block.argmax[col].tolist()
            for j in range(len(tokens)):
                g.free.masked(g.allows(best[j], j))
        elif block.argmax is not None:
            g.free.masked(g.allows(int(block.argmax[0, col])))
        return tokens, False


__all__ = ["ConstrainedMixin"]
