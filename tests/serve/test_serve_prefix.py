"""`usage.prompt_tokens_details.cached_tokens` over HTTP (the `openai` client): completions and
chat, whole and streamed with include_usage, the prefix-cache counters on /metrics, and the same
field under speculative decoding with a draft model."""
from __future__ import annotations

import pytest

from _checkpoints import write
from _serve_live import LiveServer, get_metrics, pages_full

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from graphrt import LLM  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

PS = 4
PROMPT = list(range(20, 34))                         # 14 tokens: 3 full pages may hit (13 tokens)
OPTS = dict(model="tiny", max_tokens=2, temperature=0.0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = write(tmp_path_factory, "serve-prefix", arch="llama", dtype="float32", seed=4)
    llm = LLM(path, device="cpu", backend="reference", max_batch=2, steps_per_graph=2, max_model_len=64,
              page_size=PS)
    with LiveServer(create_app(llm, ServeConfig(served_model_name="tiny", max_waiting=4))) as srv:
        srv.llm = llm
        yield srv


def test_cached_tokens_in_completions_whole_and_streamed(live):
    client = live.client()
    cold = client.completions.create(prompt=PROMPT, **OPTS)
    warm = client.completions.create(prompt=PROMPT, **OPTS)
    assert cold.usage.prompt_tokens == warm.usage.prompt_tokens == 14
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens == 12
    assert warm.choices[0].text == cold.choices[0].text
    chunks = list(client.completions.create(prompt=PROMPT + [40], stream=True,
                                            stream_options={"include_usage": True}, **OPTS))
    usage = chunks[-1].usage
    assert usage.prompt_tokens == 15 and usage.prompt_tokens_details.cached_tokens == 12
    got = get_metrics(live)
    assert got["graphrt_prefix_cache_hits_total"] == 24
    assert got["graphrt_prefix_cache_queries_total"] == 36
    assert pages_full(live.llm)


def test_cached_tokens_in_chat(live):
    client = live.client()
    msgs = [{"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Hi"}]
    cold = client.chat.completions.create(messages=msgs, **OPTS)
    warm = client.chat.completions.create(messages=msgs, **OPTS)
    n = cold.usage.prompt_tokens
    assert warm.usage.prompt_tokens_details.cached_tokens == (n - 1) // PS * PS > 0
    chunks = list(client.chat.completions.create(messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}, **OPTS))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (n - 1) // PS * PS


@pytest.fixture(scope="module")
def live_draft(tmp_path_factory):
    """The same server over an engine that speculates with a draft model (the target itself)."""
    path = write(tmp_path_factory, "serve-prefix-spec", arch="llama", dtype="float32", seed=4)
    llm = LLM(path, device="cpu", backend="reference", max_batch=2, steps_per_graph=2, max_model_len=64,
              page_size=PS, spec_rounds=2, speculative={"method": "draft", "model": str(path), "num_tokens": 2})
    with LiveServer(create_app(llm, ServeConfig(served_model_name="tiny", max_waiting=4))) as srv:
        srv.llm = llm
        yield srv


def test_cached_tokens_under_speculation(live, live_draft):
    """Speculative decoding with a draft model reports the same cached tokens and the same text
    as the plain server, whole and streamed; every page comes back."""
    opts = dict(OPTS, max_tokens=6)
    prompt = [7] + PROMPT                             # a prompt no other test of this module sent
    plain = live.client().completions.create(prompt=prompt, **opts)
    client = live_draft.client()
    cold = client.completions.create(prompt=prompt, **opts)
    warm = client.completions.create(prompt=prompt, **opts)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens == 12
    assert cold.choices[0].text == warm.choices[0].text == plain.choices[0].text
    chunks = list(client.completions.create(prompt=prompt + [40], stream=True,
                                            stream_options={"include_usage": True}, **opts))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 12
    assert "".join(c.choices[0].text for c in chunks if c.choices) != ""
    assert pages_full(live_draft.llm)
