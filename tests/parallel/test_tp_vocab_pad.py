"""Tensor parallel with a vocabulary that world_size does not divide (parallel/shard.py,
group.gather_logits, the loader): each rank holds ceil(V/n) embedding / LM-head rows, the
padding rows are zero and their logits dropped, and LLM(tensor_parallel=2) gives the tokens of
tensor_parallel=1 (CPU, gloo)."""
from __future__ import annotations

import pytest
import torch

import _checkpoints
from graphrt.checkpoint.loader import load_checkpoint
from graphrt.model.spec import LlamaSpec
from graphrt.parallel import check_tp_size, shard_spec
from graphrt.parallel.shard import shard_vocab, vocab_rows

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def odd_ckpt(tmp_path_factory):
    mod = _checkpoints.make_checkpoint_module()
    saved = mod.SHAPES["tiny-gqa"]
    mod.SHAPES["tiny-gqa"] = saved[:6] + (359,) + saved[7:]    # 359 ids: odd
    try:
        return mod.write_checkpoint(tmp_path_factory.mktemp("odd"), "tiny-gqa", arch="llama",
                                    dtype="float32", seed=6, tokenizer_vocab=359)
    finally:
        mod.SHAPES["tiny-gqa"] = saved


def test_vocab_rows_and_shard_vocab_pad_with_zeros():
    spec = LlamaSpec(vocab_size=63, hidden_size=16, intermediate_size=8, num_layers=1, num_heads=4,
                     num_kv_heads=4, head_dim=4, rms_norm_eps=1e-5, rope_theta=1e4,
                     tie_word_embeddings=False, attention_bias=False)
    check_tp_size(spec, 2)                                        # no longer refused
    assert shard_spec(spec, 2).vocab_size == 32 and shard_spec(spec, 4).vocab_size == 16
    assert [vocab_rows(63, 16, r) for r in range(4)] == [(0, 16), (16, 32), (32, 48), (48, 63)]
    assert vocab_rows(5, 2, 3) == (5, 5)                          # a rank with only padding
    t = torch.randn(63, 16)
    parts = [shard_vocab(spec, t, r, 2) for r in range(2)]
    assert all(p.shape == (32, 16) for p in parts)
    assert torch.equal(torch.cat(parts)[:63], t) and not parts[1][31].any()


def test_loader_pads_the_vocab_rows(odd_ckpt):
    full = load_checkpoint(odd_ckpt)
    assert full.spec.vocab_size == 359
    parts = [load_checkpoint(odd_ckpt, rank=r, world_size=2) for r in range(2)]
    for name in ("embed", "lm_head"):
        rows = torch.cat([p.weights[name] for p in parts])
        assert rows.shape[0] == 360 and torch.equal(rows[:359], full.weights[name]) and not rows[359].any()


def test_llm_tensor_parallel_odd_vocab_matches_single_process(odd_ckpt):
    from graphrt.engine import LLM, SamplingParams
    kw = dict(device="cpu", max_batch=3, steps_per_graph=2, max_model_len=48)
    prompts = ["Hello world", [5, 6, 7, 358], "the graph token"]
    params = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.9, seed=5, ignore_eos=True)]
    ref = LLM(odd_ckpt, **kw).generate(prompts, params)
    llm = LLM(odd_ckpt, tensor_parallel=2, tp_timeout_s=120, **kw)
    try:
        got = llm.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
        assert all(len(o.token_ids) == 6 for o in got)
    finally:
        llm.shutdown()
