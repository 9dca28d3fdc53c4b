"""The engine side of logits processing and log-probabilities (the device side: model/processing.py,
model/logprobs.py).

- `check_request`, `prefill_launch`, `take_prompt_logprobs`, `processing_rows`, `attach`: the
  engine's calls (add_request, a prefill, its prompt log-probs, a row joining a block, a delta).
- `token_rules`: a request's logit_bias, bad_words and min_tokens as the slots' token rules
  (id, value, until), checked when the request is added (ValueError naming the field).
- `process_row`: a request's row of ProcessRows, written into its slot by its prefill.
- `logprob_dicts` / `prompt_logprob_dicts`: the device's log-probability rows, read back with a
  block's tokens, as vLLM-shaped `{token id: Logprob}` dicts (the drawn / prompt token, plus the
  top-n alternatives, ranks 1..n).

bad_words: each word is tokenized as given and with a leading space (as vLLM does); each variant
that is one token is banned at every draw. A word with no one-token variant is refused: banning a
token sequence (the last token, only after the others) is not supported.
"""
from __future__ import annotations

from graphrt.engine.params import Logprob, SamplingParams, short_repr
from graphrt.model.processing import (FOREVER, FREQUENCY, MIN_P, NEUTRAL, PRESENCE, REPETITION, RULE_WIDTH,
                                     ProcessRows)


def check_request(caps, params: SamplingParams, tokenizer, eos_ids, vocab: int):
    """The request's token rules (None when it needs no processing); ValueError naming the field
    when it needs logits processing the executor (its Capabilities `caps`) lacks, or more
    log-probs than it keeps."""
    if not (params.processed or params.prompt_logprobs is not None):
        return None
    if not caps.processing:
        default = SamplingParams()
        field = next(f for f in ("logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
                                 "repetition_penalty", "min_p", "logit_bias", "min_tokens", "bad_words",
                                 "structured_outputs")
                     if getattr(params, f) != getattr(default, f))
        raise ValueError(f"{field}: needs logits processing, which this engine's runtime does not "
                         f"have (not supported with tensor parallel yet)")
    width = caps.logprobs_width
    for f in ("logprobs", "prompt_logprobs"):
        if (getattr(params, f) or 0) > width:
            raise ValueError(f"{f}: at most {width} (the runtime's captured width), got {getattr(params, f)}")
    return token_rules(params, tokenizer, eos_ids, vocab)


def prefill_launch(reqs, vocab: int, *, own=None) -> dict:
    """The processing fields of a Prefill (graphrt/worker/launch.py) for `reqs` (a processing
    executor): every request's processing row, the prompt log-probs asked for (rows of `own`,
    the requests whose prompts the launch carries; default reqs; n > 1: the others draw from a
    sibling's logits) and whether the first draws' log-probs come back."""
    own = reqs if own is None else own
    want = {i: r.params.prompt_logprobs for i, r in enumerate(own)
            if r.params.prompt_logprobs is not None and not r.token_ids}    # not again after a preemption
    return {"processing": _process_rows(reqs, vocab), "prompt_logprobs": want,
            "logprobs": any(r.params.logprobs is not None for r in reqs)}


def take_prompt_logprobs(result, own, text) -> None:
    """A prefill Result's prompt log-probs onto the requests they belong to (`prompt_lp`, for
    each one's first delta); own: the requests whose prompts the launch carried."""
    for i, res in result.prompt_logprobs.items():
        r = own[i]
        r.prompt_lp = prompt_logprob_dicts(res, r.prompt, r.params.prompt_logprobs, text)


def processing_rows(req, vocab: int) -> ProcessRows:
    """A request whose row starts decoding inside a decode block (no prefill of its own): its
    slot's processing row as a prefill writes it (Scheduler.set_processing: the slot's previous
    request must leave nothing a later processed block would apply to this one)."""
    return _process_rows([req], vocab)


def _process_rows(reqs, vocab: int) -> ProcessRows:
    """The processing rows of `reqs` (their params, token rules, prompt and drawn tokens)."""
    return ProcessRows.build([process_row(r.params, r.rules, r.prompt, r.token_ids) for r in reqs], vocab)


def attach(req, delta, lp, col: int, text) -> None:
    """A delta's log-probs (lp: its block's host rows, or None) and its cumulative_logprob (the
    request's sampled tokens so far) and, on the first, the prompt's."""
    p = req.params
    if p.logprobs is not None:
        delta.logprobs = logprob_dicts(lp, col, delta.token_ids, p.logprobs, text) \
            if lp is not None and delta.token_ids else []
        req.cumulative_logprob += sum(e[t].logprob for e, t in zip(delta.logprobs, delta.token_ids))
        delta.outputs[0].cumulative_logprob = req.cumulative_logprob
    if req.prompt_lp is not None:
        delta.prompt_logprobs, req.prompt_lp = req.prompt_lp, None


def token_rules(params: SamplingParams, tokenizer, eos_ids, vocab: int) -> list[tuple[int, float, int]]:
    """(token id, value added, draw index it applies before) for each rule of the request."""
    rules = []
    for tok, v in (params.logit_bias or {}).items():
        if tok >= vocab:
            raise ValueError(f"logit_bias: token id {short_repr(tok)} outside the vocabulary [0, {vocab})")
        rules.append((tok, v, FOREVER))
    _at_most(rules, "logit_bias")
    for word in params.bad_words:
        ids = set()
        for variant in (word, " " + word):
            toks = list(tokenizer(variant, add_special_tokens=False).input_ids)
            if len(toks) == 1:
                ids.add(toks[0])
        if not ids:
            raise ValueError(f"bad_words: {word[:40]!r} is more than one token; only words of one token "
                             f"are supported")
        rules += [(t, float("-inf"), FOREVER) for t in sorted(ids) if t < vocab]
    _at_most(rules, "bad_words")
    if params.min_tokens:
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))
        rules += [(t, float("-inf"), params.min_tokens) for t in sorted(stops) if t < vocab]
        _at_most(rules, "stop_token_ids" if params.stop_token_ids else "min_tokens")
    return rules


def _at_most(rules: list, field: str) -> None:
    """ValueError naming `field` (the client's field whose rules went past the limit) when the
    rules so far exceed the slots' RULE_WIDTH."""
    if len(rules) > RULE_WIDTH:
        raise ValueError(f"{field}: {len(rules)} token rules in all (logit_bias entries, bad_words' tokens, "
                         f"and with min_tokens the stop token ids and eos), at most {RULE_WIDTH}")


def process_row(params: SamplingParams, rules, prompt: list[int], output: list[int]) -> dict:
    """The request's row of model.processing.ProcessRows.build."""
    vals = list(NEUTRAL)
    vals[PRESENCE], vals[FREQUENCY] = params.presence_penalty, params.frequency_penalty
    vals[REPETITION], vals[MIN_P] = params.repetition_penalty, params.min_p
    return {"params": vals, "rules": rules or [], "prompt": prompt, "output": output}


class TokenText:
    """decoded_token of one id (cached): the text of that token alone."""

    def __init__(self, decode):
        self._decode, self._cache = decode, {}

    def __call__(self, tok: int) -> str:
        s = self._cache.get(tok)
        if s is None:
            s = self._cache[tok] = self._decode([tok])
        return s


def _entry(tok: int, lp: float, rank: int, ids, vals, n: int, text) -> dict[int, Logprob]:
    d = {tok: Logprob(lp, rank, text(tok))}
    for j in range(n):
        t = int(ids[j])
        if t not in d:
            d[t] = Logprob(float(vals[j]), j + 1, text(t))
    return d


def logprob_dicts(lp, col: int, tokens: list[int], n: int, text) -> list[dict[int, Logprob]]:
    """lp = (token [S, cols], rank, ids [S, cols, N], vals) host tensors of a block; the first
    len(tokens) steps of column `col`, with n alternatives each."""
    tok_lp, rank, ids, vals = (t[:len(tokens), col].tolist() for t in lp)
    return [_entry(t, tok_lp[s], rank[s], ids[s], vals[s], n, text) for s, t in enumerate(tokens)]


def prompt_logprob_dicts(result, prompt: list[int], n: int, text) -> list[dict[int, Logprob] | None]:
    """model.logprobs.PromptLogprobs.result(i) -> one entry per prompt token (None first)."""
    tok_lp, rank, ids, vals = (t.tolist() for t in result)
    return [None] + [_entry(prompt[s + 1], tok_lp[s], rank[s], ids[s], vals[s], n, text)
                     for s in range(len(tok_lp))]


__all__ = ["ProcessRows", "check_request", "prefill_launch", "take_prompt_logprobs", "processing_rows", "attach", "token_rules", "process_row", "logprob_dicts", "prompt_logprob_dicts", "TokenText"]
