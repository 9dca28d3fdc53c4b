"""POST /v1/completions and /v1/chat/completions: request -> SamplingParams -> engine -> response.

Streaming responses are server-sent events, `data: {chunk json}\\n\\n` ... `data: [DONE]\\n\\n`;
an error after the headers were sent is one `data: {"error": ...}` event before [DONE]. A client
that disconnects (streaming: Starlette cancels the body iterator; non-streaming: an
`http.disconnect` on the ASGI channel) aborts its request so the engine frees its pages.

Parsing and validating the JSON body, building SamplingParams, tokenization and chat templating,
and building a whole (non-streamed) response run on the bridge's worker pool, never on the event
loop (a large request, or n long choices with log-probs, must not stall other streams or /health);
a text of MIN_CHARS characters or more (a prompt, a rendered conversation) is tokenized in a
separate process instead (tokenizer_process.py: its ids, or only their count when the prompt cannot
fit max_model_len); a choice's deltas are joined once at its end (appending each to a running total
is quadratic). Text the tokenizer or the template refuses (a lone surrogate, a template's
raise_exception) is a 400 naming the field, and so is a long text whose tokenizer process ended
while it was tokenized. A request that fails in the engine: 400 if the
engine refused its values (ValueError), 500 otherwise. A chat stream's first chunk carries the
role; every later content delta carries text (a delta whose text is still held back, e.g. part
of a character or a possible stop string, is sent only for its token ids, with return_token_ids).
Completion streams send every delta that has tokens (`"text": ""` included: clients time tokens by
events).

Log-probabilities (serve/logprobs.py): completions `logprobs: n` (each token and its top n),
with `echo` the prompt's text and (with logprobs) its tokens' log-probabilities first, from the
prefill; `max_tokens: 0` is allowed with echo (the prompt only: lm-eval's loglikelihood
requests). Chat: `logprobs: true` and `top_logprobs: n`. Streamed chunks carry the log-probs of
their own tokens (a chat delta whose text is still held back passes its entries to the next).
"""
from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from graphrt.engine.params import join_deltas
from graphrt.serve.bridge import AsyncEngine, DeltaStream
from graphrt.serve.errors import APIError, clip, sse_error
from graphrt.serve.logprobs import chat_logprobs, completion_logprobs, merge
from graphrt.serve.structured import constraint, relabel
from graphrt.serve.tokenizer_process import TokenizerProcess, TokenizerProcessError, TokenizerRefused
from graphrt.serve.tools import ToolCalls, fragments
from graphrt.serve.protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                       ChatCompletionResponse, ChatDelta, CompletionChoice, CompletionRequest, CompletionResponse,
                       Usage)

DONE = "data: [DONE]\n\n"


class Generation:
    """What the routes need: the engine bridge, the tokenizer (and its process for long texts),
    the served name, the context limit. `close` at the server's shut-down."""

    def __init__(self, bridge: AsyncEngine, tokenizer, *, model_name: str, max_model_len: int):
        self.bridge, self.tokenizer = bridge, tokenizer
        self.model_name, self.max_model_len = model_name, max_model_len
        self.long_texts = TokenizerProcess(tokenizer)  # started by the first long text
        self._texts: dict[int, str] = {}               # token id -> its text (log-prob bodies)

    def close(self) -> None:
        """End the tokenizer process (if one runs) and its thread."""
        self.long_texts.close()

    def token_text(self, tok: int) -> str:
        s = self._texts.get(tok)
        if s is None:
            s = self._texts[tok] = self.tokenizer.decode([tok])
        return s

    async def parse(self, request: Request, model_cls):
        """The request's JSON body as `model_cls`, parsed and validated on the worker pool (the
        body is read on the loop under limits.py's size and deadline)."""
        return await self.bridge.run(parse_body, await request.body(), model_cls, self.bridge.capacity)

    async def _off_loop(self, fn, arg, *, param: str):
        """fn(arg) on the worker pool; what it raises (other than an APIError) is a 400 naming
        `param`: the text or conversation is what the tokenizer / template refused."""
        try:
            return await self.bridge.run(fn, arg)
        except APIError:
            raise
        except Exception as e:
            raise _refused(param, type(e).__name__, e) from None

    async def _tokenize_long(self, text: str, *, param: str, add_special_tokens: bool,
                             limit: int) -> tuple[int, list[int] | None]:
        """A long text's (token count, ids) from the tokenizer process; ids None when the count
        exceeds `limit` (only the count came back). A 400 naming `param` when the tokenizer
        refuses the text (as `_off_loop`) or its process ends meanwhile."""
        try:
            return await self.long_texts.encode(text, add_special_tokens=add_special_tokens, limit=max(limit, 0))
        except TokenizerRefused as e:
            raise _refused(param, e.kind, e.message) from None
        except TokenizerProcessError as e:
            raise APIError.bad_request(f"{param}: {e}", param=param) from None

    def _tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A text's ids in this process (worker pool)."""
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids
        return ids if type(ids) is list else list(ids)

    async def _prompt(self, text: str, max_tokens: int) -> list[int]:
        """A completions prompt's ids: in this process, or (a long text) from the tokenizer process,
        which sends back only the count when the prompt cannot fit max_model_len with max_tokens:
        then the engine's 400 (check_prompt_len) from that count."""
        if not self.long_texts.takes(text):
            return await self._off_loop(self._tokenize, text, param="prompt")
        n, ids = await self._tokenize_long(text, param="prompt", add_special_tokens=True,
                                           limit=self.max_model_len - max_tokens)
        if ids is None:                                # past the limit: only the count came back
            _check_len(n, max_tokens, self.max_model_len)
        return ids

    # ---- request -> engine ------------------------------------------------------------------------
    def _check(self, body) -> None:
        if body.model != self.model_name:
            raise APIError.bad_request(f"model: {clip(body.model)} is not served here; this server serves "
                                       f"{self.model_name!r}", param="model")
        body.refuse_unsupported()

    def _params(self, body, max_tokens: int, so=None):
        from graphrt.engine import SamplingParams              # the engine package is heavy; import on use
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        if isinstance(body, ChatCompletionRequest):
            logprobs, prompt_logprobs = (body.top_logprobs or 0) if body.logprobs else None, None
        else:                                      # echo with max_tokens 0 (lm-eval's loglikelihood): the
            logprobs = body.logprobs if body.max_tokens != 0 else None   # drawn token is dropped, so are its
            prompt_logprobs = body.logprobs if body.echo else None       # log-probs (a speculative engine serves it)
        try:
            return SamplingParams(max_tokens=max(max_tokens, 1), temperature=body.temperature, top_p=body.top_p,
                                  top_k=body.top_k, seed=body.seed, stop=stop,
                                  stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos,
                                  n=body.n, best_of=getattr(body, "best_of", None),
                                  logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                  presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                                  repetition_penalty=body.repetition_penalty, min_p=body.min_p,
                                  logit_bias=body.bias(), min_tokens=body.min_tokens,
                                  structured_outputs=so if so is not None else constraint(body))
        except ValueError as e:
            raise APIError.from_value_error(e) from None

    def chat_prompt(self, body: ChatCompletionRequest) -> list[int] | str:
        """The conversation through the chat template (worker pool): its ids, or the rendered text
        itself when it is long enough for the tokenizer process (`long_texts.takes`)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError.bad_request("messages: the model's tokenizer has no chat template", param="messages")
        from graphrt.engine.tool_calls import template_messages
        try:
            msgs = template_messages([m.for_template() for m in body.messages])
        except ValueError as e:
            raise APIError.bad_request(" ".join(str(e).split()), param="messages") from None
        text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False,
                                                  tools=body.tools or None)
        # as tokenize=True does (graphrt's Tokenizer and transformers' both): no specials added
        return text if self.long_texts.takes(text) else self._tokenize(text, add_special_tokens=False)

    async def _submit(self, prompts: list, params, *, kind: str, field: str) -> tuple[str, list[DeltaStream]]:
        """One engine request per prompt -> (the response id: the first's, their streams). Every
        prompt's samples are admitted at once before any is queued (400 naming `field` past the
        limit, 503 when they do not fit now); if one is refused, those already queued are aborted."""
        self.bridge.admit(len(prompts) * params.samples, field=field)
        streams, left = [], len(prompts)
        try:
            for p in prompts:
                left -= 1                              # submit gives its own back when it fails
                streams.append(await self.bridge.submit(p, params, kind=kind, held=True))
        except BaseException:
            self.bridge.release(left * params.samples)
            for _, ds in streams:
                ds.close()
            raise
        return streams[0][0], [ds for _, ds in streams]

    # ---- endpoints --------------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self._check(body)
        params = await self.bridge.run(self._params, body, 16 if body.max_tokens is None else body.max_tokens)
        prompts = body.prompts(most=self.bridge.capacity)   # null max_tokens: OpenAI's 16
        field = ("best_of" if body.best_of is not None and body.best_of > body.n else "n") \
            if len(prompts) == 1 or params.samples > 1 else "prompt"
        self.bridge.check_size(len(prompts) * params.samples, field=field)    # before any tokenization
        texts = [p if isinstance(p, str) else None for p in prompts]
        prompts = [await self._prompt(p, params.max_tokens) if isinstance(p, str) else p for p in prompts]
        for p in prompts:                              # the count, before the engine's passes over the ids
            _check_len(len(p), params.max_tokens, self.max_model_len)
        if body.echo:
            texts = [t if t is not None else await self.bridge.run(self.tokenizer.decode, p)
                     for p, t in zip(prompts, texts)]
        try:
            rid, streams = await self._submit(prompts, params, kind="cmpl", field=field)
        except APIError as e:
            raise relabel(e, body) from None
        echoes = [_Echo(self, body, p, t) for p, t in zip(prompts, texts)]
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return SSEResponse(self._completion_events(rid, streams, body.n, usage, body.return_token_ids, echoes),
                               on_close=lambda: _close(streams))
        got = await _collect(streams, request)
        if got is None:
            return Response(status_code=499)
        return await self.bridge.run(self._completion_body, rid, body, got, echoes,
                                     _usage(streams, output=body.max_tokens != 0))

    def _completion_body(self, rid: str, body: CompletionRequest, got, echoes, usage: Usage) -> Response:
        """The whole response (worker pool: log-probs of n long choices take seconds to build)."""
        choices = []
        for k, (per, prompt_entries) in enumerate(got):
            for i, (text, ids, entries, reason) in sorted(per.items()):
                if body.max_tokens == 0:               # echo only: the drawn token is not returned
                    text, ids, entries = "", [], []
                choices.append(CompletionChoice(index=k * body.n + i, text=echoes[k].text + text, finish_reason=reason,
                                                logprobs=echoes[k].logprobs(prompt_entries, ids, entries),
                                                token_ids=ids if body.return_token_ids else None))
        return _json(CompletionResponse(id=rid, model=self.model_name, usage=usage, choices=choices))

    async def _tools(self, body: ChatCompletionRequest):
        """_tooling, bounded as a grammar's compile is (a 47-character parameters schema, a string
        pattern [a-z]{1,20000}, takes xgrammar 22 s): APIError 400 naming tools past the bound."""
        if not body.tools:
            return None, None
        limit = self.bridge.engine.compile_timeout_s
        try:
            return await self.bridge.run_bounded(self._tooling, body, timeout_s=limit)
        except TimeoutError:
            raise APIError.bad_request(f"tools: the tool-call grammar was not built within {limit:g} s",
                                       param="tools") from None

    def _tooling(self, body: ChatCompletionRequest):
        """(ToolCalls or None: how the output is read back, the tool_choice's constraint or None);
        APIError 400 naming tools / tool_choice."""
        if not body.tools:
            return None, None
        from graphrt.engine.tool_calls import check_tools, tool_constraint, tool_format
        try:
            tools = check_tools(body.tools)
            fmt = tool_format(self.tokenizer)
            so = tool_constraint(tools, body.tool_choice, fmt)
        except ValueError as e:
            msg = " ".join(str(e).split())
            raise APIError.bad_request(msg, param="tool_choice" if msg.startswith("tool_choice") else "tools") from None
        return (None if body.tool_choice == "none" else ToolCalls(fmt, tools)), so

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        self._check(body)
        calls, tool_so = await self._tools(body)
        ids = await self._off_loop(self.chat_prompt, body, param="messages")
        n = len(ids) if isinstance(ids, list) else None
        limit = body.token_limit
        if n is None:                                 # a long text: its ids, or only their count past the limit
            n, ids = await self._tokenize_long(ids, param="messages", add_special_tokens=False,
                                               limit=self.max_model_len - (1 if limit is None else max(limit, 1)))
        if limit is None:                             # OpenAI: up to the context
            limit = self.max_model_len - n
            if limit < 1:
                raise APIError.bad_request(f"messages: the conversation is {n} tokens, the context "
                                           f"(max_model_len) is {self.max_model_len}", param="messages")
        names = {"prompt": "messages", "logprobs": "top_logprobs"}       # engine field -> chat's
        if body.max_completion_tokens is not None:
            names["max_tokens"] = "max_completion_tokens"
        try:
            params = await self.bridge.run(self._params, body, limit, tool_so)
            _check_len(n, params.max_tokens, self.max_model_len)   # the count (ids None: all that came back)
            rid, streams = await self._submit([ids], params, kind="chatcmpl", field="n")
        except APIError as e:
            if tool_so is not None and e.message.startswith("structured_outputs"):
                e.param, e.message = "tools", "tools: " + e.message.partition(": ")[2]
            relabel(e, body)
            raise e.renamed(names) from None
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return SSEResponse(self._chat_events(rid, streams, body.n, usage, body.return_token_ids,
                                                 (body.top_logprobs or 0) if body.logprobs else None, calls),
                               on_close=lambda: _close(streams))
        got = await _collect(streams, request)
        if got is None:
            return Response(status_code=499)
        return await self.bridge.run(self._chat_body, rid, body, got[0][0], calls, _usage(streams))

    def _chat_body(self, rid: str, body: ChatCompletionRequest, per: dict, calls, usage: Usage) -> Response:
        """The whole response (worker pool: log-probs of n long choices take seconds to build)."""
        choices = []
        for i, (text, out_ids, entries, reason) in sorted(per.items()):
            content, tcs = calls.whole(text) if calls is not None and reason == "stop" else (text, [])
            choices.append(ChatChoice(index=i, message=AssistantMessage(content=content, tool_calls=tcs or None),
                                      finish_reason="tool_calls" if tcs else reason,
                                      logprobs=chat_logprobs(out_ids, entries, body.top_logprobs or 0, self.token_text)
                                      if body.logprobs else None,
                                      token_ids=out_ids if body.return_token_ids else None))
        return _json(ChatCompletionResponse(id=rid, model=self.model_name, usage=usage, choices=choices))

    # ---- streams ----------------------------------------------------------------------------------
    async def _completion_events(self, rid: str, streams, n: int, include_usage: bool, with_ids: bool,
                                 echoes: list["_Echo"]):
        def chunk(k, index, text, reason=None, ids=None, entries=None, delta=None):
            echo = echoes[k]
            if delta is not None and delta.prompt_logprobs is not None:
                echo.prompt_entries = delta.prompt_logprobs
            if echo.body.max_tokens == 0 and reason is None:
                text, ids, entries = "", [], []
            first = index not in echo.sent
            lp = None
            if echo.body.logprobs is not None and (ids or first):
                lp = echo.logprobs(echo.prompt_entries if first else None, ids or [], entries or [])
            if first:
                text = echo.text + text
                echo.sent.add(index)
            if not text and not ids and reason is None and lp is None:
                return None
            c = CompletionResponse(id=rid, model=self.model_name, choices=[CompletionChoice(
                index=index, text=text, finish_reason=reason, logprobs=lp, token_ids=ids if with_ids else None)])
            return f"data: {c.model_dump_json()}\n\n"

        async for event in _events(streams, n, chunk, include_usage, True,   # text "" keeps the tokens' timing
                                   lambda u: CompletionResponse(id=rid, model=self.model_name, choices=[], usage=u)):
            yield event

    async def _chat_events(self, rid: str, streams, n: int, include_usage: bool, with_ids: bool,
                           top: int | None = None, calls: ToolCalls | None = None):
        def one(index, text, reason=None, ids=None, entries=None, role=None, tool_calls=None):
            lp = chat_logprobs(ids, entries, top, self.token_text) if top is not None and ids else None
            c = ChatCompletionChunk(id=rid, model=self.model_name, choices=[ChatChunkChoice(
                index=index, delta=ChatDelta(role=role, content=text if reason is None and (text or role) else None,
                                             tool_calls=tool_calls),
                finish_reason=reason, logprobs=lp,
                token_ids=ids if with_ids else None)])
            return f"data: {c.model_dump_json()}\n\n"

        def chunk(k, index, text, reason=None, ids=None, entries=None, delta=None, role=None):
            if calls is None or role is not None:
                return one(index, text, reason, ids, entries, role)
            if reason is None:                        # tool calls: text that may start a call is held
                text = calls.feed(index, text)
                return one(index, text, None, ids, entries) if text or ids else None
            rest, tcs = calls.finish(index)
            out = one(index, rest, None, ids, entries) if rest else ""
            out += "".join(one(index, "", None, tool_calls=f) for f in fragments(tcs))
            return out + one(index, "", "tool_calls" if tcs and reason == "stop" else reason,
                             None if rest else ids, None if rest else entries)

        for i in range(n):                            # {"role": "assistant", "content": ""}, as OpenAI's
            yield chunk(0, i, "", role="assistant")
        async for event in _events(streams, n, chunk, include_usage, with_ids,
                                   lambda u: ChatCompletionChunk(id=rid, model=self.model_name, choices=[], usage=u)):
            yield event


def _close(streams) -> None:
    for ds in streams:
        ds.close()


def _usage(streams, *, output: bool = True) -> Usage:
    """Prompt tokens once per prompt (not per choice, as OpenAI counts), every choice's output
    (none with output=False: echo with max_tokens 0), the prompts' cached tokens."""
    return Usage.of(sum(ds.totals.prompt_tokens for ds in streams),
                    sum(ds.totals.output_tokens for ds in streams) if output else 0,
                    sum(ds.totals.cached_tokens for ds in streams))


async def _merged(streams):
    """(prompt index, delta) from several DeltaStreams as the deltas arrive (one stream: in
    place); leaving early closes them all (their requests are aborted)."""
    if len(streams) == 1:
        async for d in streams[0]:
            yield 0, d
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k, ds):
        try:
            async for d in ds:
                await queue.put((k, d))
        except BaseException as e:
            await queue.put((k, e))
        await queue.put((k, None))

    tasks = [asyncio.ensure_future(pump(k, ds)) for k, ds in enumerate(streams)]
    left = len(streams)
    try:
        while left:
            k, d = await queue.get()
            if d is None:
                left -= 1
            elif isinstance(d, BaseException):
                raise d
            else:
                yield k, d
    finally:
        for t in tasks:
            t.cancel()
        _close(streams)


async def _events(streams, n: int, chunk, include_usage: bool, textless: bool, usage_chunk):
    """Deltas -> SSE events, each for one choice (index prompt * n + sample; a delta with tokens
    but no text yet only if `textless`, else its tokens and log-prob entries wait for the
    choice's next text); a choice's final event carries its finish_reason; then usage (if
    asked), [DONE]."""
    try:
        held: dict[int, tuple[list, list]] = {}       # choice -> tokens, log-prob entries not sent yet
        async for k, d in _merged(streams):
            for o in d.outputs:
                if o.finish_reason == "abort":
                    raise APIError(503, "request aborted by the engine")
                index = k * n + o.index
                ids, entries = held.pop(index, ([], []))
                ids += o.token_ids
                entries += o.logprobs or []
                if o.text or (textless and ids):
                    event = chunk(k, index, o.text, None, ids, entries, d)
                    ids, entries = [], []
                    if event is not None:
                        yield event
                if o.finish_reason is not None:
                    event = chunk(k, index, "", o.finish_reason, ids if textless else [], entries, d)
                    if event is not None:
                        yield event
                else:
                    held[index] = (ids, entries)
        if include_usage:
            yield f"data: {usage_chunk(_usage(streams)).model_dump_json()}\n\n"
    except APIError as e:
        yield sse_error(e)
    except Exception as e:                            # engine failure: tell the client, then close
        yield sse_error(engine_error(e))
    yield DONE


class _Echo:
    """A completion prompt's echo and log-probs settings: the prompt's text (echo) and body;
    streaming: the choices whose first chunk (which carries the echo) went out, and the prompt's
    log-prob entries once a delta brought them."""

    def __init__(self, gen: Generation, body: CompletionRequest, prompt: list[int], prompt_text: str | None):
        self.gen, self.body, self.prompt = gen, body, prompt
        self.text = prompt_text if body.echo else ""
        self.sent: set[int] = set()
        self.prompt_entries = None

    def logprobs(self, prompt_entries, ids: list[int], entries: list):
        """The choice's CompletionLogprobs (None without logprobs): the prompt's (echo) then ids'."""
        if self.body.logprobs is None:
            return None
        lp = None
        if self.body.echo and prompt_entries is not None:
            lp = completion_logprobs(self.prompt, prompt_entries, self.gen.token_text)
        if lp is not None and lp.tokens:
            start = lp.text_offset[-1] + len(lp.tokens[-1])
        else:
            start = len(self.text) if self.body.echo else 0
        return merge(lp, completion_logprobs(ids, entries, self.gen.token_text, offset=start))


async def _collect(streams, request: Request) -> list[tuple[dict, list | None]] | None:
    """Per stream ({choice index: (whole text, token ids, their log-prob entries, finish
    reason)}, the prompt's log-prob entries), or None if the client disconnected first (the
    requests are then aborted)."""
    async def gather(ds):
        deltas: dict = {}                              # choice -> its deltas, joined once at the end
        prompt = None
        async for d in ds:
            prompt = d.prompt_logprobs if d.prompt_logprobs is not None else prompt
            for o in d.outputs:
                if o.finish_reason == "abort":
                    raise APIError(503, "request aborted by the engine")
                deltas.setdefault(o.index, []).append(o)
        joined = (join_deltas(i, parts) for i, parts in deltas.items())
        return {o.index: (o.text, o.token_ids, o.logprobs or [], o.finish_reason) for o in joined}, prompt

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(asyncio.gather(*(gather(ds) for ds in streams)))
    watch = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
        _close(streams)
    if work in done:
        try:
            return work.result()
        except APIError:
            raise
        except Exception as e:
            raise engine_error(e) from e
    return None


def parse_body(raw: bytes, model_cls, most_prompts: int | None = None):
    """A JSON request body -> model_cls (pydantic); malformed JSON (nesting past the parser's
    depth included) is a 400, a body that does not fit the model the handler's 400 naming the
    field (RequestValidationError, as FastAPI raises it); most_prompts: a completions request's
    prompts are refused past it before they are validated (protocol.py)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise APIError.bad_request(f"malformed JSON body: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise APIError.bad_request("malformed JSON body: nested deeper than the parser allows") from None
    except UnicodeDecodeError as e:
        raise APIError.bad_request(f"malformed JSON body: not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        return model_cls.model_validate(data, context={"prompts": most_prompts})
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False, include_context=False)) from None
    except RecursionError:
        raise APIError.bad_request("body: nested deeper than the validator allows") from None


def engine_error(e: Exception) -> APIError:
    """A request's failure in the engine: 400 if the engine refused its values, else 500."""
    if isinstance(e, ValueError):
        return APIError.from_value_error(e)
    return APIError(500, f"engine error: {type(e).__name__}: {_one_line(e)}")


def _one_line(e) -> str:
    return " ".join(str(e).split())[:500]


def _refused(param: str, kind: str, message) -> APIError:
    """400 naming `param`: the tokenizer or the template raised `kind` (an exception's type name)."""
    return APIError.bad_request(f"{param}: the tokenizer refused it: {kind}: {_one_line(message)}", param=param)


def _check_len(n: int, max_tokens: int, max_model_len: int) -> None:
    """The engine's 400 (check_prompt_len) for a prompt of n tokens that cannot fit max_model_len
    with max_tokens to generate."""
    from graphrt.engine.params import check_prompt_len     # the engine package is heavy; import on use
    try:
        check_prompt_len(n, max_tokens=max_tokens, max_model_len=max_model_len)
    except ValueError as e:
        raise APIError.from_value_error(e) from None


class SSEResponse(StreamingResponse):
    """Server-sent events; `on_close` runs however the response ends (finished, client gone
    before or during the body, error), so a request is aborted even if its event generator
    never started."""

    def __init__(self, events, *, on_close):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _json(model) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


__all__ = ["Generation", "SSEResponse"]
