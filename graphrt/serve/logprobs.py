"""OpenAI log-probability bodies from the engine's `{token id: Logprob}` entries (engine/params.py).

Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one element per token
(with echo the prompt's tokens first, whose first entry has no log-probability: null);
`top_logprobs[i]` maps each alternative's text to its log-probability (the drawn token included,
as OpenAI does). Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
A log-probability of -inf (a banned token) is sent as -9999.0, OpenAI's floor.
"""
from __future__ import annotations

from pydantic import BaseModel

FLOOR = -9999.0


def _lp(x: float) -> float:
    return x if x > FLOOR else FLOOR


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


def completion_logprobs(ids: list[int], entries: list, text, *, offset: int = 0) -> CompletionLogprobs:
    """ids: the tokens; entries: their {id: Logprob} dicts (None: no log-probability, e.g. the
    first prompt token); text(id) -> the token's text; offset: the text_offset of the first token."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for tok, d in zip(ids, entries):
        s = text(tok)
        out.tokens.append(s)
        out.text_offset.append(offset)
        offset += len(s)
        if d is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_lp(d[tok].logprob))
        top = {}
        for i, lp in sorted(d.items(), key=lambda kv: -kv[1].logprob):
            top.setdefault(text(i), _lp(lp.logprob))
        out.top_logprobs.append(top)
    return out


def merge(a: CompletionLogprobs | None, b: CompletionLogprobs) -> CompletionLogprobs:
    if a is None:
        return b
    return CompletionLogprobs(tokens=a.tokens + b.tokens, token_logprobs=a.token_logprobs + b.token_logprobs,
                              top_logprobs=a.top_logprobs + b.top_logprobs, text_offset=a.text_offset + b.text_offset)


def chat_logprobs(ids: list[int], entries: list, n: int, text) -> ChatLogprobs:
    """n: top_logprobs asked for (the alternatives beyond the drawn token's own entry)."""
    content = []
    for tok, d in zip(ids, entries):
        s = text(tok)
        top = sorted(d.items(), key=lambda kv: -kv[1].logprob)[:n]
        content.append(ChatTokenLogprob(
            token=s, logprob=_lp(d[tok].logprob), bytes=list(s.encode("utf-8")),
            top_logprobs=[TopLogprob(token=text(i), logprob=_lp(lp.logprob), bytes=list(text(i).encode("utf-8")))
                          for i, lp in top]))
    return ChatLogprobs(content=content)


__all__ = ["CompletionLogprobs", "ChatLogprobs", "ChatTokenLogprob", "TopLogprob", "completion_logprobs",
           "chat_logprobs", "merge"]
