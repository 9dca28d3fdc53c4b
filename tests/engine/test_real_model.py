"""A real pretrained model on CPU: SmolLM2-135M-Instruct from llama.cpp's GGUF (Q4_1; fetched once,
tests/_real_model.py) through graphrt.LLM against HF transformers float32 over the tensors
transformers' own GGUF reader dequantizes (tools/bench_real_model.py's hf_model_from_gguf): the
weights, the chat template's ids, greedy tokens (a divergence only at a near-tie; every position's
margin printed), the stop at `<|im_end|>`, streamed text equal to the final text, log-probs, and
n-gram / draft (the model as its own draft) speculation greedy-identical to plain decoding. Short
generations (10 tokens at most): on CPU each token runs the whole 30-layer model."""
from __future__ import annotations


import pytest
import torch

from _checkpoints import tool_module
from _real_model import smollm2_gguf  # noqa: F401 (a fixture)
from graphrt import LLM, SamplingParams

# on a CPU each prompt's prefill and each token run the 30-layer model (a loaded 2-core machine: minutes)
pytestmark = [pytest.mark.real_model, pytest.mark.timeout(2400)]
transformers = pytest.importorskip("transformers")
MESSAGES = [[{"role": "user", "content": "What is the capital of France?"}],
            [{"role": "user", "content": "Reply with one word: what colour is a clear sky? (naïve café)"}]]
MAX_TOKENS = 10
TIE = 1e-3            # float32 vs float32 over the same weights: a top-2 gap under this is a tie
IM_END = 2            # the file's eos: <|im_end|>


def _bench():
    return tool_module("bench_real_model")


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    llm = LLM(str(smollm2_gguf), device="cpu", max_batch=2, max_model_len=128)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def hf(smollm2_gguf):
    return _bench().hf_model_from_gguf(smollm2_gguf, torch.float32, "cpu")


@pytest.fixture(scope="module")
def run(llm):
    """Both conversations streamed at once (greedy, 2 log-probs a token): per conversation
    (prompt ids, the deltas' text joined, their ids joined, their log-probs joined, the last delta)."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=2)
    prompts = [llm.tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in MESSAGES]
    streams = [llm.engine.add_request(p, params) for p in prompts]
    out = []
    for p, s in zip(prompts, streams):
        text, ids, lps, last = "", [], [], None
        for d in s:
            text, ids, lps, last = text + d.text, ids + list(d.token_ids), lps + list(d.logprobs or []), d
        out.append((p, text, ids, lps, last))
    return out


def test_weights_equal_transformers_gguf_reader(llm, hf):
    w, s = llm.checkpoint.weights, llm.checkpoint.spec
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    assert torch.equal(w["embed"], hf.model.embed_tokens.weight) and s.tie_word_embeddings
    for i, layer in enumerate(hf.model.layers):
        a, m = layer.self_attn, layer.mlp
        mine = w["layers"][i]
        assert torch.equal(mine["qkv"], torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])), i
        assert torch.equal(mine["o"], a.o_proj.weight) and torch.equal(mine["down"], m.down_proj.weight)
        assert torch.equal(mine["gate_up"], torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        assert torch.equal(mine["input_norm"], layer.input_layernorm.weight)
        assert torch.equal(mine["post_attn_norm"], layer.post_attention_layernorm.weight)
    assert mine["qkv"].shape[0] == q + 2 * kv
    print(f"\nSmolLM2 GGUF: tensors read and dequantized in {llm.checkpoint.load_s:.2f} s")


def test_chat_template_ids_equal_transformers(llm, smollm2_gguf, run):
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    for msgs, (prompt, *_rest) in zip(MESSAGES, run):
        want = hf_tok.apply_chat_template(msgs, add_generation_prompt=True)
        want = want if isinstance(want, list) else list(want["input_ids"])
        assert prompt == want
        assert llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == \
            hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    for text in ("The capital of France is Paris.", "naïve café — 日本語 🤖", "  x\n\ny<|im_end|>"):
        assert llm.tokenizer(text).input_ids == hf_tok(text).input_ids
    assert llm.tokenizer.eos_token == hf_tok.eos_token == "<|im_end|>" and llm.checkpoint.eos_token_ids == (IM_END,)


def test_greedy_tokens_match_hf_float32(run, hf):
    for prompt, _, ids, _, _ in run:
        seq = ids                                 # a stop's <|im_end|> included: HF must predict it too
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + seq])).logits[0, len(prompt) - 1:].float()
        margins = []
        for i, tok in enumerate(seq):
            top2 = torch.topk(logits[i], 2)
            margins.append(round(float(top2.values[0] - top2.values[1]), 4))
            if tok != int(top2.indices[0]):
                gap = float(top2.values[0] - logits[i, tok])
                print(f"\ndivergence at token {i}: graphrt {tok}, HF {int(top2.indices[0])}, gap {gap:.2e}")
                assert gap <= TIE, f"token {i}: graphrt {tok} is {gap} below HF's top {int(top2.indices[0])}"
                break
        print(f"\nHF float32 top-2 margins along graphrt's tokens: {margins}")


def test_stops_at_im_end_and_streams_the_final_text(llm, run):
    _, text, ids, _, last = run[0]
    assert last.finish_reason == "stop" and "Paris" in text and "<|im_end|>" not in text
    assert len(ids) < MAX_TOKENS and ids[-1] == IM_END and IM_END not in ids[:-1]   # the stop token ends the ids
    for _, text, ids, _, _ in run:              # the final text (LLM.generate's) is compared below
        assert text == llm.tokenizer.decode(ids, skip_special_tokens=True)


def test_logprobs_match_hf(run, hf):
    for prompt, _, ids, lps, _ in run:
        assert len(lps) == len(ids)
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float(), -1)
        got = torch.tensor([lp[t].logprob for lp, t in zip(lps, ids)])
        want = ref[torch.arange(len(ids)), torch.tensor(ids)]
        assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()
        assert all(lp[t].rank == 1 for lp, t in zip(lps, ids))     # greedy: the top token


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_tokens": 3}, {"method": "draft", "num_tokens": 2}])
def test_final_text_and_speculation_are_greedy_identical(smollm2_gguf, llm, run, spec):
    """LLM.generate's final output equals the stream's; with n-gram or draft speculation (the model
    as its own draft) the tokens are the same as plain greedy decoding's."""
    if spec is not None and spec["method"] == "draft":
        spec = dict(spec, model=str(smollm2_gguf))
    engine = llm if spec is None else LLM(str(smollm2_gguf), device="cpu", max_batch=1, max_model_len=128,
                                           speculative=spec)
    try:
        prompt, text, ids, _, _ = run[0]
        out = engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))[0]
        assert (out.token_ids, out.text, out.finish_reason) == (ids, text, "stop")
    finally:
        if engine is not llm:
            engine.shutdown()
