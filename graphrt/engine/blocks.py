"""The engine's blocks: launching a prefill or a decode block and reading its tokens back.

A mixin of Engine (engine.py), which owns the state these methods use: the scheduler (whose slot
changes every launch carries: worker/changes.py), the executor (`runtime`, graphrt/worker's protocol) and its capabilities (`caps`), the
speculation policy and its clock, and `_pending`, the
launched blocks whose tokens are not read yet (a deque of _Pending, oldest first). `_prefill`
and `_decode` launch (and append to `_pending`); `_finish` reads one block back on the host:
stop checks, deltas streamed, finished requests' pages freed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from graphrt.attention.buckets import pick_bucket
from graphrt.model.sampling import SamplingInputs
from graphrt.engine.group import fork_args, fork_owners, prefill_groups
from graphrt.engine import sampling_extras as extras
from graphrt.engine.constrained import ConstrainedMixin
from graphrt.engine.scheduler import Request
from graphrt.engine.speculation import observe, spec_columns
from graphrt.worker.launch import Block, Draw, Prefill


@dataclass
class _Pending:
    """A launched block's tokens (host, valid once `event` completed): [steps, cols] for a decode
    block or a prefill; [R, cols, k + 1] with emitted / proposed [R, cols] for a speculative
    block; and (request, column, request epoch, draws counted) per row (a preempted request's
    rows are skipped)."""
    rows: list
    tokens: torch.Tensor
    event: object
    emitted: torch.Tensor | None = None
    proposed: torch.Tensor | None = None
    kind: str = "decode"                  # "prefill" | "decode" | "spec"
    spec_k: int = 0                       # a speculative block's k
    logprobs: tuple | None = None         # (token [S, cols], rank, ids [S, cols, N], vals) host
    error: torch.Tensor | None = None     # [1] int32 host: the runtime's sticky device-guard flags
    col_counts: tuple | None = None       # a spec block's per-column counts (speculation.spec_columns)
    start: object = None                  # Engine.time_blocks: a timing event recorded before the launch
    free: bool = False                    # a K-step block whose constrained rows ran unmasked (FreeRun)
    argmax: torch.Tensor | None = None    # argmax before masks (host): a split step [1, cols], a grammar round [cols, k + 1]


def _host(values: list, dtype) -> torch.Tensor:
    """A host tensor of a list of numbers (through numpy: a third of torch.tensor's time on
    short lists, half on a prompt's)."""
    return torch.from_numpy(np.array(values, dtype=dtype))


class BlockMixin(ConstrainedMixin):
    """Engine's block launches and read-backs (see the module docstring); constrained rows'
    launches: engine/constrained.py."""

    PREFILL_MERGE_TOKENS = 128     # prefill groups launched together while their new tokens fit

    def _prefill(self, work: list) -> bool:
        """Prefill context positions [start, end) of admitted requests (their context: prompt,
        plus accepted tokens after a preemption); a request whose context is then complete
        draws its next token into its slot and starts its row (a slot change). -> drew any."""
        s = self.scheduler
        defer = {"defer_check": True} if self._error_flag is not None and self.device.type == "cuda" else {}
        #        ^ prefill graphs' K/V-append flags: read with the block's tokens, no sync here
        forks = fork_owners(work, s.page_size)        # n > 1: the samples sharing this prefill's pages
        for r, a, e in work:                          # never a shared or cached page (a forked
            if r.shares is not None:                  # sample writes only its partial page's copy)
                a = len(r.prompt) - len(r.prompt) % s.page_size
            s.kv.check_writable(r.pages, a, e, forks=forks)
        ctx = {id(r): r.context_ids for r, _, _ in work}   # [P] int64 arrays where possible
        part = [w for w in work if w[2] < len(ctx[id(w[0])])]
        if part:                                      # chunks that draw nothing yet
            self._launch_prefill(
                [_host(ctx[id(r)][a:e], np.int64) for r, a, e in part],
                torch.from_numpy(s.block_table([r for r, _, _ in part])),
                starts=[a for _, a, _ in part], after=[int(ctx[id(r)][e]) for r, _, e in part],
                **defer)                              # after: the token each chunk's last position precedes
            for r, _, e in part:
                s.prefilled(r, e)
        work = [w for w in work if w[2] == len(ctx[id(w[0])])]
        if not work:
            return False
        reqs = [r for r, _, _ in work]
        slots = [r.slot for r in reqs]
        own = [w for w in work if w[0].shares is None]   # n > 1: a sample sharing a sibling's prefill
        prompts = [_host(ctx[id(r)][a:], np.int64) for r, a, _ in own]   # host: checked and
        #                                          copied to the device without a host sync (kernels/transfer.py)
        table = torch.from_numpy(s.block_table([r for r, _, _ in own]))   # [m, W] host
        fork = ({} if len(own) == len(work) else fork_args([r for r, _, _ in own], reqs)) | defer
        ps = [r.params for r in reqs]
        inputs = SamplingInputs(_host([0.0 if p.greedy else p.temperature for p in ps], np.float32),
                                _host([max(p.top_k, 0) for p in ps], np.int32),
                                _host([p.top_p for p in ps], np.float32),
                                _host([r.seed for r in reqs], np.int64),
                                _host([r.launched for r in reqs], np.int32))
        starts = [a for _, a, _ in own]
        fork |= self._draft_choice(slots, fork)       # a draft model's prefill may wait
        self._write_masks(reqs, prefill=True)      # constrained first draws (and flags off for the others)
        start = self._block_start()
        own_reqs = [r for r, _, _ in own]
        if self.caps.processing:                      # every slot's processing rows
            fork |= extras.prefill_launch(reqs, self.vocab_size, own=own_reqs)
        res = self._launch_prefill(prompts, table, starts=starts, slots=slots, sampling=inputs, **fork)
        if res.prompt_logprobs:
            extras.take_prompt_logprobs(res, own_reqs, self._token_text)
        owed = fork.get("draft") is False and self.policy is not None   # the drafts' prefill skipped
        per_token = self.policy.graph_costs.draft_prefill_us if owed else 0.0
        for r, a, e in work:                          # res.tokens: [1, len(reqs)] device
            s.prefilled(r, e)
            if self.spec is not None:
                s.set_history(r)                      # the first token: written on the device
                if self.policy is not None:
                    self.policy.admit(r.slot)
                    if owed:                          # its first spec block's catch-up prefills it
                        self.policy.owe(r.slot, (e - a) * per_token)
            r.launched += 1
            s.activate(r)
        pending = self._to_host([(r, i, r.epoch, 1) for i, r in enumerate(reqs)], res.tokens,
                                logprobs=res.logprobs, start=start)
        pending.kind = "prefill"
        self._pending.append(pending)
        return True

    def _launch_prefill(self, *args, **kw):
        """executor.prefill(Prefill(*args, **kw)) carrying the scheduler's slot changes -> Result.
        A launch that raises (one request's prefill failing) gives them back: the next launch
        carries them again (Scheduler.restore_changes)."""
        s = self.scheduler
        changes = s.take_changes()
        try:
            return self.runtime.prefill(Prefill(*args, changes=changes, **kw))
        except BaseException:
            s.restore_changes(changes)
            raise

    def _prefill_launches(self, work: list) -> list[list]:
        """The step's prefill work ((request, start, end)) as launches, each read back on its own
        (one `_pending` entry): where the executor prefills this many tokens through its prefill
        graphs (one replay per piece of one request either way: splitting adds no weight pass),
        the requests whose context this step completes go one prefill group (samples sharing a
        prefill) per launch, fewest new tokens first, so a short prompt's first token streams
        when its own prefill ends, not when the step's last one does; chunks that draw nothing
        go last, in one launch. Adjacent groups ride one launch while its new tokens stay within
        PREFILL_MERGE_TOKENS: a launch costs its host about a millisecond whatever it holds, and a
        piece that short prefills in less (prompts cached but their last tokens: one launch each
        made a bs-4 generate's prefills 2.8 -> 13.7 ms on an H100). Else (eager prefill, one
        batched pass; prompt log-probs; one item) the work as one launch."""
        def new_tokens(items):                        # a sample sharing its owner's prefill runs none
            return sum(e - a for r, a, e in items if r.shares is None)
        if len(work) < 2 or not self.runtime.prefill_graphed(new_tokens(work)) \
                or any(r.params.prompt_logprobs is not None for r, _, _ in work):
            return [work]
        done = [w for w in work if w[2] == len(w[0].prompt) + len(w[0].token_ids)]
        part = [w for w in work if w[2] < len(w[0].prompt) + len(w[0].token_ids)]
        leads = {id(w[0]) for w in done}
        if any(w[0].shares is not None and id(w[0].shares) not in leads for w in done):
            return [work]                             # a sample without its prefill's owner: as it came
        launches, merge = [], self.PREFILL_MERGE_TOKENS
        for g in sorted(prefill_groups(done), key=new_tokens):   # stable: ties keep their order
            if launches and new_tokens(launches[-1]) + new_tokens(g) <= merge:
                launches[-1] = launches[-1] + g
            else:
                launches.append(g)
        return launches + ([part] if part else [])

    def _decode(self, rows: list[Request], piece: tuple | None = None) -> None:
        """One block over `rows`: pages for it (preempting if short), one launch carrying the
        scheduler's slot changes (the executor applies them first; the slots advance on the device). piece: (request,
        start, end) context positions the block also prefills (Scheduler.mixed_piece; plain
        blocks only): [start, end) in its first step, or, when end is the end of the context,
        [start, end - 1) and the request's row decodes in this block from its last token."""
        s, ex = self.scheduler, self.runtime
        ahead, self._ahead = self._ahead, None        # a split step's forward launched before (_run_ahead)
        if self.spec is not None and all(r.launched >= r.params.max_tokens for r in rows):
            return False                              # every row may be done: read the block in flight
        joining = piece[0] if piece is not None and piece[2] == len(piece[0].context) else None
        rows = s.grow(rows if joining is None else rows + [joining])   # its pages for the block too
        if joining is not None and joining.slot < 0:
            joining = piece = None                    # preempted by the growth: prefilled again later
        if not rows:
            return True
        chunk = False                                 # whether the block's first step carries a chunk
        if piece is not None:
            staged, chunk = self._mixed_chunk(piece, joining is not None)
            if staged and joining is not None:        # its last token is the row's current token
                s.set_token(joining, joining.context[-1])
                if self.caps.processing:              # its processing row, as a prefill writes it
                    s.set_processing(joining, extras.processing_rows(joining, self.vocab_size))
                self._write_masks([joining], prefill=True)   # a constrained predecessor's mask flag off
                s.activate(joining)
            elif joining is not None:
                rows = [r for r in rows if r is not joining]
                if not rows:
                    return True
        pacer = s.pacer if not chunk else None       # the pacer times plain blocks
        mark = pacer.start() if pacer is not None else None
        # constrained rows (the scheduler's count, no scan): one step in two launches (_split_step),
        # or with grammar-checked n-gram proposals one speculative round (_grammar_round)
        masked, free = self._masked_rows()           # free: every constrained row runs unmasked
        speculate = self.spec is not None and (masked is None or self.caps.spec_grammar)
        ahead = self._matching_ahead(ahead, rows, split=masked is not None and not chunk and not speculate)
        k = self.spec.num_tokens if speculate else 0
        if k and self.policy is not None:             # speculate this block, or a plain one
            bucket = pick_bucket(self.caps.config.buckets, max(r.slot for r in rows) + 1)
            k = self.policy.choose([r.slot for r in rows], bucket=bucket).k
            if masked is not None:                    # one round at num_tokens (its graphs), or a split
                k = self.spec.num_tokens if k else 0  # step; the clock times R-round blocks only
                self._clock.interrupted()
            else:                                     # rows at their limit ride along: the device holds them
                self._clock.launched(self.policy, bucket, k, self.rounds if k else self.caps.steps_per_graph)
        start = self._block_start() if ahead is None else ahead.start
        if k and masked is not None:
            rows = self._grammar_round(rows, k)
            if not rows:
                return False
            go = s.launch_block(rows, block_tokens=k + 1)      # carries the rows' caps (SetSpecK)
            want_lp = any(r.params.logprobs is not None for r in rows)
            out = ex.run(Block(go.n, k=k, draw=Draw(sampled=go.sampled, processed=True, filtered=go.filtered),
                               rounds=1, logprobs=want_lp, changes=go.changes))
            self.spec_counts["blocks"] += 1
            pending = self._to_host(go.rows, out.tokens, out.emitted, out.proposed, logprobs=out.logprobs,
                                    start=start, argmax=out.argmax if any(r.grammar.free for r in masked) else None)
            pending.kind, pending.spec_k = "spec", k
        elif k:
            go = s.launch_block(rows, block_tokens=self.rounds * (k + 1))
            want_lp = go.processed and any(r.params.logprobs is not None for r in rows)
            out = ex.run(Block(go.n, k=k, draw=Draw(sampled=go.sampled, processed=go.processed, filtered=go.filtered),
                               logprobs=want_lp, changes=go.changes))
            self.spec_counts["blocks"] += 1
            pending = self._to_host(go.rows, out.tokens, out.emitted, out.proposed, logprobs=out.logprobs,
                                    start=start)
            pending.kind, pending.spec_k, pending.free = "spec", k, free
        else:
            go = s.launch_block(rows, block_tokens=1 if masked else self.caps.steps_per_graph,
                                carry=ahead is None)
            # processed: logits processing, + the block's log-probs; chunk: + the prompt chunk
            want_lp = go.processed and any(r.params.logprobs is not None for r in rows)
            draw = Draw(sampled=go.sampled, processed=go.processed, filtered=go.filtered)
            if masked:
                out = self._split_step(go.n, draw, masked, want_lp, go.changes, forward=ahead is None)
            else:
                out = ex.run(Block(go.n, draw=draw, chunk=chunk, logprobs=want_lp, changes=go.changes))
            pending = self._to_host(go.rows, out.tokens, logprobs=out.logprobs, start=start,
                                    argmax=out.argmax if masked and any(r.grammar.free for r in masked) else None)
            pending.free = free
            if self.spec is not None:
                self.spec_counts["plain_blocks"] += 1
        self._pending.append(pending)
        if masked and not k and self.overlap and self.spec is None and self.RUN_AHEAD:
            self._run_ahead()
        if pacer is not None:
            pacer.launched("block", mark)
        return True

    def _mixed_chunk(self, piece: tuple, joining: bool) -> tuple[bool, bool]:
        """Stage `piece` ((request, start, end)) for the next block -> (taken, a chunk staged):
        positions [start, end) (joining: [start, end - 1), none when that is empty) staged as
        the block's chunk and recorded as prefilled. Not taken when its request was preempted
        by the block's growth (prefilled again later), nor when its pages fail the write check
        or the staging refuses it (the request fails; the block runs without it)."""
        req, a, e = piece
        if req.slot < 0 or not req.prefilling or req.computed != a:
            return False, False
        stop = e - 1 if joining else e
        try:
            self.scheduler.kv.check_writable(req.pages, a, e)   # never a shared or cached page
            if stop > a:
                self.runtime.stage_chunk(req.slot, _host(req.context[a:stop], np.int64), a,
                                         table_row=self.scheduler.block_table([req])[0])
        except Exception as err:                      # this request's chunk only
            self._fail(req, err)
            return False, False
        self.scheduler.prefilled(req, e, kind="mixed")
        if stop > a:
            self.mixed_counts["chunks"] += 1
            self.mixed_counts["tokens"] += stop - a
        return True, stop > a

    def _draft_choice(self, slots: list[int], fork: dict) -> dict:
        """{"draft": False} when a draft model's prefill can wait: the policy starts these new
        rows on plain decode (SpecPolicy.start_k: the engine-wide acceptance says speculation
        does not pay), so the draft is caught up only if a later block speculates (never, for a
        request that stays plain); {} otherwise (and for forked samples)."""
        if self.policy is None or not self.caps.draft_state or fork.get("sources") is not None:
            return {}
        bucket = pick_bucket(self.caps.config.buckets, max(slots) + 1)
        return {"draft": False} if self.policy.start_k(bucket) == 0 else {}

    def _block_start(self):
        """A timing event recorded now, before a block's launch (Engine.time_blocks on CUDA), else None."""
        if not self._time_blocks or self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _to_host(self, rows, tokens: torch.Tensor, emitted=None, proposed=None, *, logprobs=None,
                 start=None, argmax=None) -> _Pending:
        """The block's outputs (and the runtime's device-guard flags) copied to the host
        without a sync; valid once the pending's event completed. start: the block's timing event
        (_block_start): the pending's event then times too, and _finish adds the block's device
        time to Engine.block_device_s."""
        flag = self._error_flag
        if self.device.type != "cuda":
            return _Pending(rows, tokens.clone(), None, *(None if t is None else t.clone()
                                                          for t in (emitted, proposed)),
                            logprobs=None if logprobs is None else tuple(t.clone() for t in logprobs),
                            error=None if flag is None else flag.clone(),
                            argmax=None if argmax is None else argmax.clone())
        host = [None if t is None else t.to("cpu", non_blocking=True)
                for t in (tokens, emitted, proposed, flag, argmax)]
        lp = None if logprobs is None else tuple(t.to("cpu", non_blocking=True) for t in logprobs)
        event = torch.cuda.Event(enable_timing=start is not None)
        event.record()
        return _Pending(rows, host[0], event, host[1], host[2], logprobs=lp, error=host[3], start=start,
                        argmax=host[4])

    def _finish(self, block: _Pending) -> None:
        """A block's tokens -> stop checks, deltas, finished requests' pages freed."""
        if block.event is not None:
            block.event.synchronize()
            if block.start is not None:               # complete: no sync
                self.block_device_s[block.kind] += block.start.elapsed_time(block.event) / 1e3
        if block.error is not None and int(block.error[0]):
            self.runtime.check_device_errors()        # DeviceInputError naming the guard: the engine stops
        if self.scheduler.pacer is not None:
            self.scheduler.pacer.poll()               # launches complete by now: read, no sync
        if block.emitted is None:
            cols = block.tokens.t().tolist()              # [cols][steps]
        else:
            cols = spec_columns(block, self.spec_counts)
        if self.policy is not None:
            observe(self.policy, block)
        accept, sched = self.scheduler.accept, self.scheduler
        for req, col, epoch, counted in block.rows:
            if req.finish_reason is not None or req.epoch != epoch:
                continue                              # finished, aborted or preempted: discarded
            try:
                if self.spec is not None:
                    sched.settle(req, counted, len(cols[col]))
                tokens, refused, g = cols[col], False, req.grammar
                if g is not None and g.free is not None:      # unmasked tokens checked (FreeRun)
                    tokens, refused = self._checked(g, block, col, tokens)
                held = len(req.token_ids)
                delta = accept(req, tokens)
                if g is not None:                     # the matcher sees each accepted token
                    g.advance(req.token_ids[held:])
                if refused and req.finish_reason is None:
                    self._set_back(req)               # from its last accepted token, masked
                if req.finish_reason is not None:     # pages back before the final delta is seen
                    self.scheduler.release(req)
                    self._requests.pop(req.request_id, None)
                if delta is not None:
                    extras.attach(req, delta, block.logprobs, col, self._token_text)
                    self._tokens_generated += len(delta.token_ids)
                    req.sink(delta)
            except Exception as e:                    # this request's stop checks / text / stream
                self._fail(req, e)                    # (release is idempotent)


__all__ = ["BlockMixin"]
