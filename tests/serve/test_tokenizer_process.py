"""graphrt/serve/tokenizer_process.py: long texts tokenized in a separate process, on CPU.

The process's ids equal the in-process tokenizer's on a few MB of mixed-script text (with and
without the specials, the added tokens' text inside); past a limit only the count comes back; a
text the tokenizer refuses is refused the same way; a killed process fails only the text it was
serving and the next text starts a new one. Through a live server on 127.0.0.1: short prompts and
conversations never start the process (and use it once its threshold is lowered, with the same
tokens), a long prompt or conversation past max_model_len is the 400 the in-process path gives
(with the exact token count), a killed process is a 400 naming the prompt and the next long prompt
works, and the process ends with the server."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import threading

import pytest

from _checkpoints import make_checkpoint_module, write
from _serve_live import LiveServer, wait_for

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from graphrt.checkpoint.tokenizer import load_tokenizer  # noqa: E402
from graphrt.serve.tokenizer_process import (MIN_CHARS, TokenizerProcess, TokenizerProcessError,  # noqa: E402
                                             TokenizerRefused)

NAME = "m"
MAX_MODEL_LEN = 64
# accents, Cyrillic, CJK, emoji (4 UTF-8 bytes), digits, newlines and tabs, the specials' text
PIECE = ("Hello there, général графа 運行時 🙂🚀 12345\n\tπ≈3.14159 <|user|>naïve café<|end|> "
         "Ünïcödé Ωμέγα שלום مرحبا ")
LONG = PIECE * (MIN_CHARS // len(PIECE) + 1)           # just past the threshold: tenths of a second


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    make_checkpoint_module().build_tokenizer(out, vocab_size=400, seed=5)
    return load_tokenizer(out)


@pytest.fixture()
def proc(tok):
    tp = TokenizerProcess(tok)
    yield tp
    tp.close()


def test_the_process_ids_equal_the_in_process_ids(tok, proc):
    text = PIECE * (3_000_000 // len(PIECE))             # ~3M characters, ~7 MB of UTF-8
    assert proc.takes(text) and not proc.takes(text[:MIN_CHARS - 1])
    for specials in (True, False):
        n, ids = proc.encode_blocking(text, specials, None)
        want = tok(text, add_special_tokens=specials).input_ids
        assert n == len(want) > len(text) // 4 and ids == want, (specials, n, len(want))
    n, ids = asyncio.run(proc.encode(LONG, add_special_tokens=True, limit=None))   # the async entry
    assert ids == tok(LONG).input_ids and n == len(ids)


def test_past_the_limit_only_the_count_comes_back(tok, proc):
    want = tok(LONG).input_ids
    assert proc.encode_blocking(LONG, True, len(want) - 1) == (len(want), None)
    assert proc.encode_blocking(LONG, True, len(want)) == (len(want), want)       # at the limit: the ids


def test_a_refused_text_is_refused_as_in_process(tok, proc):
    text = LONG + "\ud800"                                # a lone surrogate
    with pytest.raises(Exception) as here:
        tok(text)
    with pytest.raises(TokenizerRefused) as there:
        proc.encode_blocking(text, True, None)
    assert (there.value.kind, there.value.message) == (type(here.value).__name__, str(here.value))
    assert proc.encode_blocking(LONG, True, None)[1] == tok(LONG).input_ids      # the process goes on


def test_a_killed_process_fails_its_text_and_the_next_starts_a_new_one(tok, proc):
    assert proc.pid is None                               # nothing started before a long text
    big = PIECE * (4_000_000 // len(PIECE))               # seconds of work: killed while at it
    got = {}

    def encode():
        try:
            got["ids"] = proc.encode_blocking(big, True, None)
        except TokenizerProcessError as e:
            got["error"] = str(e)
    t = threading.Thread(target=encode)
    t.start()
    assert wait_for(lambda: proc.pid is not None)
    first = proc.pid
    os.kill(first, signal.SIGKILL)
    t.join(60)
    assert "ids" not in got and "ended (exit code -9)" in got["error"], got
    assert f"text of {len(big)} characters" in got["error"] and "starts a new process" in got["error"]
    assert proc.encode_blocking(LONG, True, None)[1] == tok(LONG).input_ids
    assert proc.pid not in (None, first)
    os.kill(proc.pid, signal.SIGKILL)                     # killed between texts: the next starts another
    assert wait_for(lambda: proc.pid is None)
    assert proc.encode_blocking(LONG, False, None)[1] == tok(LONG, add_special_tokens=False).input_ids


def test_close_ends_the_process_and_refuses_after(tok):
    tp = TokenizerProcess(tok)
    tp.encode_blocking(LONG, True, 1)
    pid = tp.pid
    tp.close()
    tp.close()                                            # idempotent
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)                                   # ended and reaped
    assert not tp.takes(LONG)
    with pytest.raises(TokenizerProcessError, match="shutting down"):
        tp.encode_blocking(LONG, True, None)


def test_bad_construction_and_other_tokenizers(tok):
    for bad in (0, -1, 2.5, True, "1"):
        with pytest.raises(ValueError, match="^min_chars: must be an int >= 1"):
            TokenizerProcess(tok, min_chars=bad)
    other = TokenizerProcess(object())                    # not graphrt's Tokenizer: in-process always
    assert not other.takes(LONG)
    other.close()


# ---- through the server ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from graphrt import LLM
    return LLM(write(tmp_path_factory, "tokproc", arch="llama", dtype="float32", seed=8), device="cpu",
               backend="reference", max_batch=2, steps_per_graph=2, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def live(llm):
    from graphrt.serve import ServeConfig, create_app
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME))) as srv:
        yield srv


def long_texts(live) -> TokenizerProcess:
    return live.server.config.app.state.long_texts


def post(live, path, body) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=120)
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def error(resp, param: str) -> str:
    code, body = resp
    assert code == 400 and body["error"]["param"] == param, (code, body)
    return body["error"]["message"]


def chat_body(content: str, **kw) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 2} | kw


def test_short_texts_stay_in_the_server(live, monkeypatch):
    lt, calls = long_texts(live), []
    encode = lt.encode_blocking
    monkeypatch.setattr(lt, "encode_blocking", lambda *a: calls.append(len(a[0])) or encode(*a))
    short = "Hello there"
    assert post(live, "/v1/completions", {"model": NAME, "prompt": short, "max_tokens": 2})[0] == 200
    assert post(live, "/v1/chat/completions", chat_body(short))[0] == 200
    assert calls == []
    error(post(live, "/v1/completions", {"model": NAME, "prompt": LONG, "max_tokens": 2}), "prompt")
    assert calls == [len(LONG)] and lt.pid is not None    # a long one does go there


def test_a_lowered_threshold_gives_the_same_tokens(live, tok, monkeypatch):
    lt = long_texts(live)
    text = "Hello there, général графа 🙂"
    body = {"model": NAME, "prompt": text, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    chat = chat_body(text, max_tokens=4, temperature=0)
    here, here_chat = post(live, "/v1/completions", body), post(live, "/v1/chat/completions", chat)
    monkeypatch.setattr(lt, "min_chars", 1)
    assert lt.takes(text)
    there, there_chat = post(live, "/v1/completions", body), post(live, "/v1/chat/completions", chat)
    assert here[0] == there[0] == 200 and here_chat[0] == there_chat[0] == 200
    for a, b in ((here, there), (here_chat, there_chat)):        # the second: its prompt found in the
        assert a[1]["choices"] == b[1]["choices"]                  # prefix cache (the same ids)
        assert [a[1]["usage"][k] for k in ("prompt_tokens", "completion_tokens")] == \
               [b[1]["usage"][k] for k in ("prompt_tokens", "completion_tokens")]
    assert there_chat[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_long_texts_past_the_context_are_the_usual_400(live, tok):
    n = len(tok(LONG).input_ids)
    msg = error(post(live, "/v1/completions", {"model": NAME, "prompt": LONG, "max_tokens": 1}), "prompt")
    assert msg == f"prompt: {n} tokens leave no room to generate in max_model_len {MAX_MODEL_LEN}", msg
    conv = tok.apply_chat_template([{"role": "user", "content": LONG}], add_generation_prompt=True)
    msg = error(post(live, "/v1/chat/completions", chat_body(LONG, max_tokens=None)), "messages")
    assert msg == f"messages: the conversation is {len(conv)} tokens, the context (max_model_len) is " \
                  f"{MAX_MODEL_LEN}", msg
    msg = error(post(live, "/v1/chat/completions", chat_body(LONG, max_tokens=None, max_completion_tokens=3)),
                "messages")
    assert msg.startswith(f"messages: {len(conv)} tokens leave no room"), msg
    msg = error(post(live, "/v1/completions", {"model": NAME, "prompt": LONG + "\ud800", "max_tokens": 1}),
                "prompt")
    assert msg.startswith("prompt: the tokenizer refused it: "), msg


def test_a_killed_process_is_a_400_and_the_next_long_prompt_works(live):
    lt = long_texts(live)
    if lt.pid is not None:                                # an earlier test's: gone before ours starts
        os.kill(lt.pid, signal.SIGKILL)
        assert wait_for(lambda: lt.pid is None)
    got = []
    body = {"model": NAME, "prompt": "Hello there, general graph runtime. " * 110_000, "max_tokens": 1}  # 4 MB, seconds
    t = threading.Thread(target=lambda: got.append(post(live, "/v1/completions", body)))
    t.start()
    assert wait_for(lambda: lt.pid is not None)
    first = lt.pid
    os.kill(first, signal.SIGKILL)
    t.join(60)
    msg = error(got[0], "prompt")
    assert msg.startswith("prompt: the tokenizer process ended (exit code -9)"), msg
    msg = error(post(live, "/v1/completions", {"model": NAME, "prompt": LONG, "max_tokens": 1}), "prompt")
    assert "max_model_len" in msg and lt.pid not in (None, first), msg


def test_the_process_ends_with_the_server(live, llm):
    from graphrt.serve import ServeConfig, create_app
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME))) as srv:   # the engine: live's
        error(post(srv, "/v1/completions", {"model": NAME, "prompt": LONG, "max_tokens": 1}), "prompt")
        pid = long_texts(srv).pid
        assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
