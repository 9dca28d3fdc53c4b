"""Log-probabilities and logits processing over HTTP on CPU (`openai` client, live server): the
request shapes lm-eval's OpenAI-completions loglikelihood sends (echo + logprobs, max_tokens 0 or
1, prompt as text or token ids) return HF float32's prompt log-probabilities; chat logprobs
streamed and not; a speculative server's prompt and generated log-probabilities; penalties /
logit_bias accepted and applied; bad values 400 naming the field."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import write
from _serve_live import LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
transformers = pytest.importorskip("transformers")

from graphrt import LLM  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

NAME = "tiny-llama"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write(tmp_path_factory, "serve_lp", arch="llama", dtype="float32", seed=3)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, device="cpu", max_batch=4, steps_per_graph=2, max_model_len=96)


@pytest.fixture(scope="module")
def client(llm):
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME, max_waiting=8))) as srv:
        yield srv.client()


@pytest.fixture(scope="module")
def hf(ckpt):
    return transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()


def _logp(hf, ids):
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)   # [T, V]


def test_lm_eval_loglikelihood_shapes_match_hf(llm, hf, client):
    text = "the graph runs on the device"
    ids = llm.tokenizer(text).input_ids
    logp = _logp(hf, ids)
    want = [None] + [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    r = client.completions.create(model=NAME, prompt=text, echo=True, logprobs=1, max_tokens=0, temperature=0)
    c = r.choices[0]
    assert c.text == text and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert lp.tokens == [llm.tokenizer.decode([t]) for t in ids] and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    assert all(abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs[1:], want[1:]))
    for i in range(1, len(ids)):                    # lm-eval's is_greedy: the top-1 alternative
        (top_tok, top_lp), = [(k, v) for k, v in lp.top_logprobs[i].items() if v == max(lp.top_logprobs[i].values())]
        assert abs(top_lp - float(logp[i - 1].max())) < 1e-4
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # token ids, max_tokens=1: the prompt's entries, then the drawn (greedy) token's
    r = client.completions.create(model=NAME, prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None
    assert all(abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs[1:len(ids)], want[1:]))
    assert abs(lp.token_logprobs[-1] - float(logp[-1].max())) < 1e-4


def test_chat_logprobs_streamed_and_not(llm, hf, client):
    msgs = [{"role": "user", "content": "the graph token"}]
    args = dict(model=NAME, messages=msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                extra_body={"ignore_eos": True, "return_token_ids": True})
    r = client.chat.completions.create(**args)
    content, out = r.choices[0].logprobs.content, r.choices[0].token_ids
    prompt = llm.tokenizer(llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)).input_ids
    logp = _logp(hf, prompt + out)
    assert len(content) == len(out) == 4
    for j, (e, tok) in enumerate(zip(content, out)):
        row = logp[len(prompt) - 1 + j]
        assert abs(e.logprob - float(row[tok])) < 1e-4 and e.token == llm.tokenizer.decode([tok])
        assert e.bytes == list(e.token.encode()) and len(e.top_logprobs) == 2
        assert abs(e.top_logprobs[0].logprob - float(row.max())) < 1e-4
    chunks = list(client.chat.completions.create(stream=True, **args))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]


def test_penalties_and_logit_bias_over_http(client):
    r = client.completions.create(model=NAME, prompt="Hello", max_tokens=3, temperature=0, logit_bias={"77": 100},
                                  presence_penalty=0.5, frequency_penalty=0.5,
                                  extra_body={"ignore_eos": True, "return_token_ids": True, "repetition_penalty": 1.2,
                                              "min_p": 0.1, "min_tokens": 2})
    assert r.choices[0].token_ids == [77, 77, 77]
    chunks = list(client.completions.create(model=NAME, prompt="Hello", max_tokens=3, temperature=0, logprobs=2,
                                            stream=True, extra_body={"ignore_eos": True}))
    entries = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs]
    assert len(entries) == 3 and all(x <= 0 for x in entries)


@pytest.mark.parametrize("kwargs,param,text", [
    (dict(logprobs=21), "logprobs", "[0, 20]"),
    (dict(max_tokens=0), "max_tokens", "0 only with echo"),
    (dict(frequency_penalty=-3.0), "frequency_penalty", "[-2, 2]"),
    (dict(logit_bias={"x": 1}), "logit_bias", "token ids"),
    (dict(logit_bias={"5": 150}), "logit_bias", "[-100, 100]"),
    (dict(extra_body={"repetition_penalty": 0.0}), "repetition_penalty", "(0, 10]"),
    (dict(extra_body={"min_p": 2.0}), "min_p", "[0, 1]"),
])
def test_bad_values_are_400_naming_the_field(client, kwargs, param, text):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**(dict(model=NAME, prompt="Hello", max_tokens=2) | kwargs))
    assert e.value.body["param"] == param and text in e.value.body["message"], e.value.body


def test_top_logprobs_needs_logprobs(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"


def test_n_and_several_prompts_with_echo_and_logprobs(llm, hf, client):
    texts = ["the graph runs", "on the device"]
    ids = [llm.tokenizer(t).input_ids for t in texts]
    kw = dict(model=NAME, prompt=texts, n=2, echo=True, logprobs=1, max_tokens=2, temperature=0.8, seed=4,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    for c in r.choices:
        k = c.index // 2
        logp = _logp(hf, ids[k])
        lp = c.logprobs
        assert c.text.startswith(texts[k]) and len(lp.tokens) == len(ids[k]) + 2 and lp.token_logprobs[0] is None
        assert all(abs(lp.token_logprobs[i] - float(logp[i - 1, ids[k][i]])) < 1e-4 for i in range(1, len(ids[k])))
    streamed: dict[int, list] = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed.setdefault(c.index, []).append(c)
    for c in r.choices:                              # the same seeds: the same choices, chunk by chunk
        got = streamed[c.index]
        assert "".join(x.text for x in got) == c.text
        assert [t for x in got if x.logprobs for t in x.logprobs.tokens] == c.logprobs.tokens
    best = client.completions.create(model=NAME, prompt=texts[0], n=1, best_of=3, max_tokens=2, temperature=0.8,
                                     seed=4, extra_body={"ignore_eos": True})
    assert len(best.choices) == 1 and best.choices[0].logprobs is None


def test_logprobs_on_a_speculative_server(ckpt, hf):
    """echo + logprobs with max_tokens 0 (lm-eval's loglikelihood) needs only the prompt's
    log-probs, from the prefill; generated tokens' log-probs (completions `logprobs`, chat
    `logprobs` / `top_logprobs`, streamed and not) come from the verify's logits: each equal to
    HF float32's log-softmax over the whole sequence, top alternatives included."""
    spec = LLM(ckpt, device="cpu", max_batch=2, steps_per_graph=2, max_model_len=96,
               speculative={"method": "ngram", "num_tokens": 2})
    with LiveServer(create_app(spec, ServeConfig(served_model_name=NAME, max_waiting=4))) as srv:
        client = srv.client()
        ids = spec.tokenizer("the graph runs on the device").input_ids
        logp = _logp(hf, ids)
        r = client.completions.create(model=NAME, prompt=ids, echo=True, logprobs=2, max_tokens=0, temperature=0)
        lp = r.choices[0].logprobs
        assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
        assert all(abs(lp.token_logprobs[i] - float(logp[i - 1, ids[i]])) < 1e-4 for i in range(1, len(ids)))
        before = spec.engine.stats()["spec_accepted"]
        prompt = ids * 3                                 # a repeated prompt: the n-gram proposer finds matches
        r = client.completions.create(model=NAME, prompt=prompt, echo=True, logprobs=2, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        out, lp = r.choices[0].token_ids, r.choices[0].logprobs
        logp = _logp(hf, prompt + out)
        assert len(out) == 8 and len(lp.token_logprobs) == len(prompt) + 8
        for j, tok in enumerate(out):                    # the generated tokens' entries
            row, at = logp[len(prompt) - 1 + j], len(prompt) + j
            assert abs(lp.token_logprobs[at] - float(row[tok])) < 1e-4, j
            assert abs(max(lp.top_logprobs[at].values()) - float(row.max())) < 1e-4, j   # keyed by text
        msgs = [{"role": "user", "content": "the graph token the graph token the graph token"}]
        args = dict(model=NAME, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
                    extra_body={"ignore_eos": True, "return_token_ids": True})
        r = client.chat.completions.create(**args)
        content, out = r.choices[0].logprobs.content, r.choices[0].token_ids
        chat = spec.tokenizer(spec.tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                                 tokenize=False)).input_ids
        logp = _logp(hf, chat + out)
        assert len(content) == len(out) == 6
        for j, (e, tok) in enumerate(zip(content, out)):
            row = logp[len(chat) - 1 + j]
            assert abs(e.logprob - float(row[tok])) < 1e-4 and e.token == spec.tokenizer.decode([tok]), j
            assert [round(t.logprob, 4) for t in e.top_logprobs] == [round(float(v), 4) for v in torch.topk(row, 2).values]
        chunks = list(client.chat.completions.create(stream=True, **args))
        streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]
        assert spec.engine.stats()["spec_accepted"] > before   # accepted positions among those checked
    assert spec.engine.error is None
