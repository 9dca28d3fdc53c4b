"""Values that reach the engine's tensors, at the edges of what they can hold (engine/params.py,
engine/engine.py): temperature bounded, stop_token_ids counted, top_k past int32 clamped to the vocabulary (the same
tokens as top_k off), a tokenizer larger than the model's vocabulary refused per request."""
from __future__ import annotations

import pytest

from _checkpoints import make_checkpoint_module, write
from graphrt import LLM, SamplingParams
from graphrt.engine.params import MAX_STOP_TOKEN_IDS, MAX_TEMPERATURE

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_batch=2, steps_per_graph=2, max_model_len=40)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write(tmp_path_factory, "edges", arch="llama", dtype="float32", seed=4), **CPU)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=1e308), "temperature: must be <= 10000"),
    (dict(temperature=3.5e38), "temperature: must be <= 10000"),
    (dict(temperature=MAX_TEMPERATURE * 1.5), "temperature: must be <="),
    (dict(temperature=10**400), "temperature: expected a finite number"),
    (dict(top_p=10**400), "top_p: expected a finite number"),
    (dict(top_k=1e20), "top_k: expected an int"),
    (dict(max_tokens=10**400), None),                 # an int: refused by the engine (max_model_len)
    (dict(seed=2**63), "seed: must be in"),
    # each sample builds a set of them on the engine's thread (1.3M ids: 0.13 s a sample)
    (dict(stop_token_ids=[1] * (MAX_STOP_TOKEN_IDS + 1)), f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got"),
    (dict(stop_token_ids="x" * 10_000), "stop_token_ids: expected a list of ints, got 'x{36}[.]{3}$"),
])
def test_out_of_range_values_name_the_field(llm, kwargs, match):
    if match is not None:
        with pytest.raises(ValueError, match=f"^{match}"):
            SamplingParams(**kwargs)
        return
    with pytest.raises(ValueError, match="^max_tokens: .* exceed max_model_len"):
        llm.engine.add_request([3, 4], SamplingParams(**kwargs))


def test_top_k_past_int32_is_the_vocabulary(llm):
    base = dict(max_tokens=6, temperature=1.0, seed=11, ignore_eos=True)
    off = llm.generate([[3, 4, 5]], SamplingParams(top_k=0, **base))[0].token_ids
    for k in (2**31, 2**31 - 1, 10**30, llm.checkpoint.spec.vocab_size):
        assert llm.generate([[3, 4, 5]], SamplingParams(top_k=k, **base))[0].token_ids == off, k
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages and llm.engine.error is None


def test_temperature_edges_generate(llm):
    greedy = llm.generate([[7, 8]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0].token_ids
    tiny = llm.generate([[7, 8]], SamplingParams(max_tokens=5, temperature=1e-30, seed=1, ignore_eos=True))[0]
    assert tiny.token_ids == greedy                    # every other token's weight underflows to 0
    hot = llm.generate([[7, 8]], SamplingParams(max_tokens=5, temperature=MAX_TEMPERATURE, seed=1,
                                                ignore_eos=True))[0]
    assert len(hot.token_ids) == 5 and all(0 <= t < llm.checkpoint.spec.vocab_size for t in hot.token_ids)
    assert llm.engine.error is None


def test_tokenizer_larger_than_the_vocabulary(tmp_path_factory, caplog):
    path = write(tmp_path_factory, "smallvocab", arch="llama", dtype="float32", seed=4, tokenizer_vocab=300)
    make_checkpoint_module().build_tokenizer(path, vocab_size=384, seed=4)   # 384 ids, vocab_size 300
    with caplog.at_level("WARNING", logger="graphrt.engine"):
        llm = LLM(path, **CPU)
    assert llm.checkpoint.spec.vocab_size == 300 and len(llm.tokenizer) > 300
    assert any("vocab_size is 300" in r.getMessage() for r in caplog.records)
    text = next(t for t in (llm.tokenizer.decode([i]) for i in range(383, 299, -1))
                if t and max(llm.tokenizer(t).input_ids) >= 300)
    with pytest.raises(ValueError, match="^prompt: the tokenizer gives id 3[0-9][0-9], outside the model's "
                                         "vocabulary \\[0, 300\\)"):
        llm.generate([text], SamplingParams(max_tokens=3))
    ok = llm.generate(["ab"], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0]
    assert len(ok.token_ids) == 3 and llm.engine.error is None
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages
