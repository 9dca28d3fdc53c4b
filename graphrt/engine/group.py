"""n > 1 and best_of: several completions of one prompt, its prefill and KV pages shared.

    stream = engine.add_request("Hi", SamplingParams(n=3, temperature=0.8, seed=1))
    out = stream.result()          # out.outputs[0..2]: CompletionOutput, by index

A request with best_of (or n) > 1 runs as that many sequences ("samples"), each an engine
Request with id f"{i}_{request_id}" (vLLM's child ids; `engine.abort` of the request's id
aborts them all, of one child's id that child only) and seed + i when a seed is given (vLLM's
rule: sample i equals SamplingParams(n=1, seed=seed + i) alone), else a seed of its own.

Sharing: sample 0 is the one prefilled; a sibling admitted in the same step (scheduler.admit)
takes sample 0's full prompt pages with one more owner each (KVCacheManager.fork), a fresh page
for the prompt's partial last page, filled by a device copy after the prefill (copy-on-write:
both append there), and its first token drawn with its own seed from sample 0's last logits
(a Prefill launch's sources / copies, graphrt/worker). A sibling admitted later (no free slot then), or
after a preemption, is prefilled on its own: the same tokens, without the sharing. Pages go
back by refcount, whichever sample finishes or is aborted first.

best_of > n: every sample runs to its end, then the n with the highest cumulative
log-probability are returned (re-indexed 0..n-1, in that order), in one final item: such a
request cannot be streamed. The ranking needs each sample's cumulative_logprob: the samples run
with logprobs=0 (the sampled token's log-probability) unless logprobs was asked for; the
returned completions carry logprobs only when it was.

Prefix cache and chunked prefill (scheduler.admit): the fork is taken only when sample 0's
prompt is prefilled whole in the same step (no chunk budget applies); otherwise each sample is
prefilled on its own, and with the prefix cache on the later samples find sample 0's full
pages there. Every item carries the request's num_cached_tokens (sample 0's) and the first
one prompt_logprobs when asked for.
"""
from __future__ import annotations

import dataclasses

from graphrt.engine.params import CompletionOutput, RequestOutput, SamplingParams, join_deltas


def child_params(params: SamplingParams) -> SamplingParams:
    """One sample's SamplingParams (n = 1); with best_of > n and no logprobs asked for, logprobs=0
    (the sampled token's log-probability: what cumulative_logprob sums, for the ranking)."""
    changes = {"n": 1, "best_of": None}
    if params.samples > params.n and params.logprobs is None:
        changes["logprobs"] = 0
    return dataclasses.replace(params, **changes)


def child_seeds(params: SamplingParams, draw) -> list[int]:
    """Seed of each sample: seed + i (vLLM's rule), or draw() each when the request has none."""
    if params.seed is not None:
        return [params.seed + i for i in range(params.samples)]
    return [draw() for _ in range(params.samples)]


def prefill_groups(work: list) -> list[list]:
    """Prefill work items ((request, start, end)) in prefill groups: a request that shares a
    sibling's prefill (`shares`) goes with that sibling's item (which is among them, before
    it); the others alone."""
    groups, at = [], {}
    for w in work:
        lead = w[0].shares
        if lead is None:
            at[id(w[0])] = len(groups)
            groups.append([w])
        else:
            groups[at[id(lead)]].append(w)
    return groups


def fork_owners(work: list, page_size: int) -> dict[int, int]:
    """{page: forked samples sharing it} over the work items ((request, start, end)) whose
    request shares a sibling's prefill: the full prompt pages that sibling writes first
    (KVCacheManager.check_writable's forks)."""
    out: dict[int, int] = {}
    for w in work:
        r = w[0]
        if r.shares is not None:
            for p in r.pages[:len(r.prompt) // page_size]:
                out[p] = out.get(p, 0) + 1
    return out


def fork_args(own: list, reqs: list) -> dict:
    """A Prefill launch's keywords (graphrt/worker) when some of `reqs` share a prefill: sources (each
    request's row among the `own` prompts prefilled) and copies (partial pages, src -> dst)."""
    at = {id(r): i for i, r in enumerate(own)}
    return {"sources": [at[id(r.shares if r.shares is not None else r)] for r in reqs],
            "copies": [r.copy_page for r in reqs if r.shares is not None and r.copy_page is not None]}


def best_of(outputs: list[CompletionOutput], n: int, *, keep_logprobs: bool) -> list[CompletionOutput]:
    """The n completions with the highest cumulative_logprob (ties: the lower index first),
    re-indexed 0..n-1 in that order; their logprobs dropped unless keep_logprobs. ValueError when
    a completion has no cumulative_logprob (nothing to rank by)."""
    missing = [o.index for o in outputs if o.cumulative_logprob is None]
    if missing:
        raise ValueError(f"best_of: completion {missing[0]} has no cumulative_logprob to rank by")
    ranked = sorted(outputs, key=lambda o: (-o.cumulative_logprob, o.index))[:n]
    return [dataclasses.replace(o, index=i, logprobs=o.logprobs if keep_logprobs else None)
            for i, o in enumerate(ranked)]


class GroupSink:
    """The samples' sinks (engine thread) -> the request's stream: each sample's delta becomes
    an item whose outputs hold that sample's CompletionOutput (its index), finished once every
    sample has finished; with best_of > n one final item only. A sample's error is raised by
    the stream and aborts the other samples (abort: callable(child id)); done() runs once, when
    every sample has finished or the first error came."""

    def __init__(self, stream, params: SamplingParams, prompt_ids: list[int], *, child_ids: list[str],
                 abort, done, prompt: str | None = None):
        self.stream, self.params, self.prompt_ids, self.prompt = stream, params, prompt_ids, prompt
        self.child_ids, self._abort, self._done = child_ids, abort, done
        self.left = len(child_ids)
        self.ranked = params.samples > params.n
        self.deltas = [[] for _ in child_ids] if self.ranked else None   # best_of > n: joined at the end
        self.failed = False
        self.cached = None                     # num_cached_tokens: sample 0's, else the first seen
        self.prompt_lp = None                  # prompt_logprobs, until sent once
        self.prompt_lp_sent = False

    def sink(self, index: int):
        return lambda item: self.put(index, item)

    def put(self, index: int, item) -> None:
        if self.failed:
            return
        if isinstance(item, BaseException):
            self.failed = True
            for cid in self.child_ids:
                self._abort(cid)
            self._done()
            self.stream.put(item)
            return
        o = item.outputs[0]
        if index == 0 or self.cached is None:
            self.cached = item.num_cached_tokens
        if item.prompt_logprobs is not None and not self.prompt_lp_sent and self.prompt_lp is None:
            self.prompt_lp = item.prompt_logprobs
        out = CompletionOutput(index, o.text, list(o.token_ids), o.cumulative_logprob, o.logprobs,
                               o.finish_reason, o.stop_reason)
        if o.finish_reason is not None:
            self.left -= 1
        if self.left == 0:
            self._done()
        if not self.ranked:
            self.stream.put(RequestOutput(self.stream.request_id, self.prompt_ids, outputs=[out],
                                          prompt=self.prompt, finished=self.left == 0,
                                          prompt_logprobs=self._take_prompt_lp(), num_cached_tokens=self.cached))
            return
        self.deltas[index].append(out)
        if self.left == 0:
            try:
                picked = best_of([join_deltas(i, d) for i, d in enumerate(self.deltas)], self.params.n,
                                 keep_logprobs=self.params.logprobs is not None)
            except ValueError as e:
                self.failed = True
                self.stream.put(e)
                return
            self.stream.put(RequestOutput(self.stream.request_id, self.prompt_ids, outputs=picked,
                                          prompt=self.prompt, finished=True,
                                          prompt_logprobs=self._take_prompt_lp(), num_cached_tokens=self.cached))

    def _take_prompt_lp(self):
        lp, self.prompt_lp = self.prompt_lp, None
        if lp is not None:
            self.prompt_lp_sent = True
        return lp


__all__ = ["GroupSink", "child_params", "child_seeds", "prefill_groups", "fork_owners", "fork_args", "best_of"]
