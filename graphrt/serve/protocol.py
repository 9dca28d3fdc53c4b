"""OpenAI API request and response bodies (pydantic), with OpenAI's field names.

Requests are strict (no "yes" for true, no 2.0 for an int), forbid unknown fields, and refuse
with a 400 naming the field what the engine cannot do (suffix, tools, a streamed best_of > n): a
field accepted and ignored would silently change what the client asked for. `n` (and
completions' `best_of`) go to the engine (engine/group.py); completions take several prompts,
their choices indexed prompt-major (prompt p's i-th choice is index p * n + i), as OpenAI does.
graphrt's extensions follow vLLM's names: top_k, min_p, repetition_penalty, min_tokens,
ignore_eos, stop_token_ids, return_token_ids (the `openai` client sends them through
`extra_body`; token ids come back as `choices[i].token_ids`). logit_bias keys are token ids (as
strings, OpenAI's JSON).
`null` for a field with a default means the default (OpenAI marks them nullable; vLLM does this).

Validation is bounded by the body's size, not by how many errors it holds: pydantic turns each
error into Python objects while it holds the GIL (1.6 s for a 4 MB body of 800k bad list items,
during which no other thread runs), so lists the engine caps are refused on their length before
their items are looked at (stop, stop_token_ids, tools; logit_bias's entries), other lists stop
at their first bad item (fail_fast), and an object's unknown fields past the first MAX_UNKNOWN
are dropped before validation (one error each otherwise). A completions request's prompts are
counted against the server's limit (validation context {"prompts": most}) before each is validated.
"""
from __future__ import annotations

import time
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from graphrt.engine.params import MAX_LOGIT_BIAS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from graphrt.engine.tool_calls import MAX_TOOLS
from graphrt.serve.errors import APIError, clip
from graphrt.serve.logprobs import ChatLogprobs, CompletionLogprobs


MAX_UNKNOWN = 4             # unknown fields of one object that are reported (the rest are dropped)
TOO_MANY_PROMPTS = "at most {most} prompts per request (max_batch + max_waiting), got {got}"


def _few(items):
    """A list whose validation stops at its first bad item (one error, not one per item)."""
    return Annotated[list[items], Field(fail_fast=True)]


class _Strict(BaseModel):
    """A request object: strict types, unknown fields refused (the first MAX_UNKNOWN of them named)."""
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _few_unknown(cls, data):
        if not isinstance(data, dict) or len(data) <= MAX_UNKNOWN:
            return data
        fields, out, unknown = cls.model_fields, {}, 0
        for k, v in data.items():
            if k in fields or unknown < MAX_UNKNOWN:
                out[k] = v
                unknown += k not in fields
        return out


class _Request(_Strict):
    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        """`"field": null` -> the field's default (a non-null default only; null stays an error
        for required fields)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if not (v is None and k in fields and not fields[k].is_required())}

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: "StreamOptions | None" = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = None
    user: str | None = None                    # metadata only; nothing to act on
    logit_bias: dict[str, float] | None = None           # at most MAX_LOGIT_BIAS entries (_bias_size)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # extensions (vLLM names)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    return_token_ids: bool = False             # add each choice's output token ids (vLLM's name)
    structured_outputs: dict | None = None     # vLLM's: {json | regex | choice | grammar | json_object}

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_size(cls, v):
        """A dict's length is not checked before its entries (pydantic), so it is checked here."""
        if isinstance(v, dict) and len(v) > MAX_LOGIT_BIAS:
            raise PydanticCustomError("too_long", "at most {most} entries, got {got}", {"most": MAX_LOGIT_BIAS, "got": len(v)})
        return v

    def refuse_unsupported(self) -> None:
        """Raise a 400 for each field the engine cannot honour (instead of ignoring it)."""
        if self.stream_options is not None and not self.stream:
            raise APIError.bad_request("stream_options: only allowed with stream=true", param="stream_options")

    def bias(self) -> dict[int, float] | None:
        """logit_bias with int keys (400 naming logit_bias for a key that is not a token id)."""
        if not self.logit_bias:
            return None
        try:
            return {int(k): v for k, v in self.logit_bias.items()}
        except ValueError:
            bad = next(k for k in self.logit_bias if not _is_int(k))
            raise APIError.bad_request(f"logit_bias: keys must be token ids, got {clip(bad)}",
                                       param="logit_bias") from None


def _is_int(key: str) -> bool:
    try:
        int(key)
    except ValueError:
        return False
    return True


class StreamOptions(_Strict):
    include_usage: bool = False


class CompletionRequest(_Request):
    """POST /v1/completions. prompt: a string, a list of token ids, or a list of either (several
    prompts: one engine request each, n choices each)."""

    prompt: Union[str, _few(int), _few(str), _few(_few(int))]
    max_tokens: int | None = 16                # OpenAI's default for completions
    best_of: int | None = None
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_count(cls, v, info: ValidationInfo):
        """Several prompts: at most context["prompts"] of them, counted before each is validated."""
        most = (info.context or {}).get("prompts")
        if most is not None and isinstance(v, list) and v and isinstance(v[0], (str, list)) and len(v) > most:
            raise PydanticCustomError("too_many", TOO_MANY_PROMPTS.format(most=most, got=len(v)))
        return v

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.best_of is not None and self.stream and self.best_of > self.n:
            raise APIError.bad_request(f"best_of: {self.best_of} > n={self.n} cannot be streamed (the best "
                                       f"are known at the end)", param="best_of")
        if self.suffix:
            raise APIError.bad_request("suffix: not supported", param="suffix")
        if self.max_tokens == 0 and not self.echo:
            raise APIError.bad_request("max_tokens: must be >= 1 (0 only with echo=true), got 0",
                                       param="max_tokens")

    def prompts(self, *, most: int) -> list[str | list[int]]:
        """The request's prompts (one, or a batch of at most `most`), each non-empty."""
        p = self.prompt
        batch = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
        if len(batch) > most:
            raise APIError.bad_request("prompt: " + TOO_MANY_PROMPTS.format(most=most, got=len(batch)), param="prompt")
        for i, one in enumerate(batch):
            if len(one) == 0:
                raise APIError.bad_request("prompt: empty" if len(batch) == 1 else f"prompt[{i}]: empty",
                                           param="prompt")
        return batch


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ToolCallFunction(_Strict):
    name: str
    arguments: str                                # JSON text (OpenAI's)


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Strict):
    """A message of the conversation; an assistant's may carry tool_calls (content then may be
    null), a tool's answers one by tool_call_id."""
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | _few(TextPart) | None = None
    name: str | None = None
    tool_calls: _few(ToolCall) | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_needed(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content: required (null only for an assistant message with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only on assistant messages")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: required on a tool message")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as chat templates read it (engine/tool_calls.py template_messages)."""
        m = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            m["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            m["name"] = self.name
        return m


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions. max_tokens (or max_completion_tokens) None: up to the context."""

    messages: list[ChatMessage] = Field(min_length=1, fail_fast=True)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: Annotated[list, Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None

    @model_validator(mode="after")
    def _one_limit(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError.bad_request("top_logprobs: needs logprobs=true", param="top_logprobs")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise APIError.bad_request("tool_choice: needs tools", param="tool_choice")
        if self.tools and self.tool_choice not in (None, "none", "auto") and self.response_format is not None:
            raise APIError.bad_request("response_format: not with a required or named tool_choice",
                                       param="response_format")


_Request.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0                       # prompt tokens whose KV came from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0) -> "Usage":
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


_OMIT_NONE = dict(default=None, exclude_if=lambda v: v is None)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None
    token_ids: list[int] | None = Field(**_OMIT_NONE)


class CompletionResponse(BaseModel):
    """Both the whole response and (object "text_completion" too, as OpenAI does) a stream chunk."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(**_OMIT_NONE)


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]
    token_ids: list[int] | None = Field(**_OMIT_NONE)


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """A stream chunk's delta: role only in the first chunk, content in the text chunks; unset
    fields are left out of the JSON (never `"role": null`), so the last chunk's delta is {}."""
    role: Literal["assistant"] | None = Field(**_OMIT_NONE)
    content: str | None = Field(**_OMIT_NONE)
    tool_calls: list[dict] | None = Field(**_OMIT_NONE)     # {index, id?, type?, function: {name?, arguments}}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    token_ids: list[int] | None = Field(**_OMIT_NONE)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "graphrt"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


__all__ = ["CompletionRequest", "ChatCompletionRequest", "ChatMessage", "Usage", "CompletionChoice",
           "CompletionResponse", "ChatCompletionResponse", "ChatCompletionChunk", "ChatChunkChoice",
           "ChatDelta", "ChatChoice", "AssistantMessage", "ToolCall", "ToolCallFunction", "ModelCard", "ModelList", "StreamOptions"]
