"""Logits processing and log-probabilities through the engine on CPU, against HF transformers
float32: logprobs / prompt logprobs = HF's log_softmax, penalties = HF's RepetitionPenaltyLogitsProcessor
+ OpenAI's presence / frequency rule token by token, logit_bias / min_tokens / bad_words / min_p
exactly, and a plain greedy neighbour in the same blocks unchanged (= HF's argmax)."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import write
from graphrt import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=48)
N = 6                                           # tokens per request: the prefill's + 2 blocks of K=3
PROMPTS = [[5, 17, 33, 2, 91], [7, 8, 9, 10, 11, 12], [40, 41, 3], [100, 7, 100, 7, 100]]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "samp", arch="llama", dtype="float32", seed=11)


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, max_batch=8, steps_per_graph=3, **CPU)


@pytest.fixture(scope="module")
def hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _logits(hf, seq) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([seq])).logits[0].float()                  # [T, V]


def _hf_greedy(hf, prompt, n, process=lambda seq, out, t, x: x):
    """n greedy tokens, each the argmax of process(prompt + out so far, out, draw index, logits)."""
    out = []
    for t in range(n):
        x = process(prompt + out, out, t, _logits(hf, prompt + out)[-1])
        out.append(int(torch.argmax(x)))
    return out


def _penalised(rep, presence, frequency):
    proc = transformers.RepetitionPenaltyLogitsProcessor(rep)

    def f(seq, out, t, x):
        x = proc(torch.tensor([seq]), x[None].clone())[0]
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=x.numel()).float()
        return x - presence * (counts > 0) - frequency * counts
    return f


@pytest.fixture(scope="module")
def batch(llm, hf):
    """One generate: every feature in one batch, next to a plain greedy request."""
    tok = llm.tokenizer
    g2 = _hf_greedy(hf, PROMPTS[2], N)
    word = tok.decode([g2[0]])                  # a one-token bad word: the greedy first token of prompt 2
    one_token = list(tok(word, add_special_tokens=False).input_ids) == [g2[0]]
    g0 = _hf_greedy(hf, PROMPTS[0], N)
    reqs = {
        "plain": (PROMPTS[1], SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)),
        "logprobs": (PROMPTS[0], SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logprobs=3,
                                                 prompt_logprobs=2)),
        "penalties": (PROMPTS[3], SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logprobs=0,
                                                  repetition_penalty=1.5, presence_penalty=0.7,
                                                  frequency_penalty=0.4)),
        "bias": (PROMPTS[1], SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logit_bias={77: 100})),
        "min_tokens": (PROMPTS[0], SamplingParams(max_tokens=N, temperature=0, min_tokens=3,
                                                   stop_token_ids=[g0[0], g0[1]])),
        "min_p": (PROMPTS[2], SamplingParams(max_tokens=N, temperature=1.0, seed=3, ignore_eos=True, min_p=1.0,
                                              top_k=3)),     # top_k: the processed graph that sorts
    }
    if one_token:
        reqs["bad_words"] = (PROMPTS[2], SamplingParams(max_tokens=N, temperature=0, ignore_eos=True,
                                                         bad_words=[word]))
    outs = llm.generate([p for p, _ in reqs.values()], [s for _, s in reqs.values()])
    return dict(zip(reqs, outs)), {"g0": g0, "g2": g2, "word_token": g2[0] if one_token else None}


def test_plain_greedy_neighbour_unchanged(batch, hf):
    outs, _ = batch
    assert outs["plain"].token_ids == _hf_greedy(hf, PROMPTS[1], N)
    assert outs["plain"].logprobs is None and outs["plain"].prompt_logprobs is None


def test_logprobs_and_prompt_logprobs_match_hf(batch, hf):
    outs, ref = batch
    o = outs["logprobs"]
    assert o.token_ids == ref["g0"]
    logp = torch.log_softmax(_logits(hf, PROMPTS[0] + o.token_ids), dim=-1)     # [T, V]
    assert len(o.logprobs) == N
    for t, (tok, d) in enumerate(zip(o.token_ids, o.logprobs)):
        row = logp[len(PROMPTS[0]) - 1 + t]
        top = torch.topk(row, 3)
        assert d[tok].rank == 1 and abs(d[tok].logprob - float(row[tok])) < 1e-4
        assert set(d) == set(top.indices.tolist())
        for j, i in enumerate(top.indices.tolist()):
            assert abs(d[i].logprob - float(top.values[j])) < 1e-4 and d[i].rank == j + 1
    p = o.prompt_logprobs
    assert len(p) == len(PROMPTS[0]) and p[0] is None
    for s in range(1, len(PROMPTS[0])):
        row, tok = logp[s - 1], PROMPTS[0][s]
        assert abs(p[s][tok].logprob - float(row[tok])) < 1e-4
        assert p[s][tok].rank == int((row > row[tok]).sum()) + 1
        assert len(p[s]) in (2, 3) and all(abs(v.logprob - float(row[i])) < 1e-4 for i, v in p[s].items())


def test_penalties_match_hf_processors_token_by_token(batch, hf):
    outs, _ = batch
    o = outs["penalties"]
    want = _hf_greedy(hf, PROMPTS[3], N, _penalised(1.5, 0.7, 0.4))
    assert o.token_ids == want
    assert want != _hf_greedy(hf, PROMPTS[3], N)          # the penalties changed something
    assert [list(d) for d in o.logprobs] == [[t] for t in want]   # logprobs=0: the drawn token only


def test_bias_min_tokens_bad_words_min_p_are_exact(batch, hf):
    outs, ref = batch
    assert outs["bias"].token_ids == [77] * N                # +100 forces the token
    g0 = ref["g0"]
    mt = outs["min_tokens"]

    def masked(seq, out, t, x):
        if t < 3:
            x = x.clone()
            x[[g0[0], g0[1]]] = -torch.inf
        return x
    want = _hf_greedy(hf, PROMPTS[0], N, masked)
    stop = next((i for i, t in enumerate(want) if t in (g0[0], g0[1])), None)
    assert mt.token_ids == (want if stop is None else want[:stop + 1])
    assert not {g0[0], g0[1]} & set(mt.token_ids[:3])
    if ref["word_token"] is not None:
        banned = ref["word_token"]

        def ban(seq, out, t, x):
            x = x.clone()
            x[banned] = -torch.inf
            return x
        assert outs["bad_words"].token_ids == _hf_greedy(hf, PROMPTS[2], N, ban)
    assert outs["min_p"].token_ids == ref["g2"]              # min_p = 1: only the most likely token


def test_bad_values_are_value_errors_naming_the_field(llm):
    eng = llm.engine
    for kw, field in ((dict(logprobs=21), "logprobs"), (dict(prompt_logprobs=-1), "prompt_logprobs"),
                      (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty="1"), "frequency_penalty"),
                      (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(min_p=1.5), "min_p"),
                      (dict(logit_bias={1: 101}), "logit_bias"), (dict(logit_bias={i: 1 for i in range(65)}), "logit_bias"),
                      (dict(logit_bias=[1]), "logit_bias"), (dict(min_tokens=17), "min_tokens"),
                      (dict(bad_words=[""]), "bad_words")):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="logit_bias: token id 100000"):
        eng.add_request([1, 2], SamplingParams(logit_bias={100000: 1.0}))
    with pytest.raises(ValueError, match="bad_words"):
        eng.add_request([1, 2], SamplingParams(bad_words=["a much longer phrase than one token"]))


def test_too_many_token_rules_name_the_field_the_client_sent(llm):
    """logit_bias + min_tokens' stop ids past the slots' rule width: the error names
    stop_token_ids (or min_tokens when the stop ids are only eos), not logit_bias."""
    from graphrt.model.processing import RULE_WIDTH
    eng, bias = llm.engine, {i: 1.0 for i in range(60)}
    stops = list(range(100, 100 + RULE_WIDTH))
    for kw, field in ((dict(logit_bias=bias, min_tokens=2, stop_token_ids=stops), "stop_token_ids"),
                      (dict(min_tokens=2, stop_token_ids=stops + [1000]), "stop_token_ids")):
        with pytest.raises(ValueError, match=f"^{field}: [0-9]+ token rules.*at most {RULE_WIDTH}"):
            eng.add_request([1, 2], SamplingParams(**kw))
    eng.add_request([1, 2], SamplingParams(logit_bias=bias, stop_token_ids=stops, max_tokens=1)).result()
