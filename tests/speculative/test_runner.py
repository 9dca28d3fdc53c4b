"""Speculative rounds end to end on CPU (float32, tiny random Llama): greedy speculative output
equals plain greedy decoding (ModelRuntime) token for token, max_tokens is exact, the verify
forward matches decode-step logits, processed rounds record each emitted token's log-probs as
HF's log-softmax gives them, and bad input is refused."""
from __future__ import annotations

import pytest
import torch

from _spec_helpers import PAGE, POOL, VOCAB, hf_greedy, page_table, runtime_config, sample_prompts
from graphrt.attention.kvcache import PagedKVCache
from graphrt.model import LlamaDecoder
from graphrt.model.runtime import ModelRuntime
from graphrt.model.slots import SlotState
from graphrt.speculative import SpeculativeConfig, SpeculativeRunner

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=128, head_dim=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def _plain_greedy(hf, prompts, max_tokens, table):
    """graphrt's own non-speculative greedy decoding (ModelRuntime, one token per step)."""
    mrt = ModelRuntime(LlamaDecoder.from_hf(hf), runtime_config(), "cpu")
    first = mrt.prefill(prompts, table).argmax(-1)
    outs = [[int(t)] for t in first]
    cur, lens = first, torch.tensor([len(p) + 1 for p in prompts], dtype=torch.int32)
    for _ in range(max(max_tokens) - 1):
        cur = mrt.decode(cur, table, lens)[0].clone()
        lens += 1
        for o, t in zip(outs, cur.tolist()):
            o.append(t)
    return [o[:m] for o, m in zip(outs, max_tokens)]


def _speculative(hf, prompts, max_tokens, table, k, rounds, cycle=None):
    """Speculative greedy tokens; cycle: the k of each block in turn (default k every block)."""
    model = LlamaDecoder.from_hf(hf)
    caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=7 + i) for i in range(2)]
    first = model.prefill(prompts, caches, table).argmax(-1)
    runner = SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=k, ngram_min=1, ngram_max=3),
                               buckets=(1, 3), max_len=128, page_size=PAGE, rounds=rounds)
    for i, p in enumerate(prompts):
        runner.set_slot(i, p.tolist(), append=first[i:i + 1], limit=len(p) + max_tokens[i],
                        block_table=table[i])
    got, rounds_run = [[int(t)] for t in first], [0, 0, 0]
    for b in range(40):
        kb = k if cycle is None else cycle[b % len(cycle)]
        out, emitted, proposed, _, _ = runner.run(3, k=kb)
        assert out.shape[-1] == kb + 1
        if int(emitted.sum()) == 0:
            break
        accepted = (emitted - 1).clamp_min(0)
        assert (accepted <= proposed).all() and proposed.le(kb).all()
        assert proposed[emitted == 0].eq(0).all()               # done slots verify nothing
        for r in range(rounds):
            for i in range(3):
                e = int(emitted[r, i])
                assert out[r, i, e:].eq(-1).all()
                got[i] += out[r, i, :e].tolist()
                rounds_run[i] += e > 0
    for i, p in enumerate(prompts):
        assert runner.slot_tokens(i) == p.tolist() + got[i]      # the device token buffer
    assert int(runner.device_error) == 0
    return got, rounds_run


@pytest.mark.parametrize("k,rounds", [(4, 2)])
def test_greedy_matches_plain_decoding(hf, k, rounds):
    prompts, max_tokens = sample_prompts(), [15, 4, 12]
    want = hf_greedy(hf, prompts, max_tokens)
    got, rounds_run = _speculative(hf, prompts, max_tokens, page_table(), k, rounds)
    assert got == want                                           # max_tokens exact too
    assert sum(rounds_run) < sum(len(w) - 1 for w in want)       # proposals were accepted


def test_greedy_matches_model_runtime_while_k_switches(hf):
    prompts, max_tokens = sample_prompts(), [9, 2, 7]
    want = _plain_greedy(hf, prompts, max_tokens, page_table())
    got, _ = _speculative(hf, prompts, max_tokens, page_table(), 3, 2, cycle=(1, 3, 2))   # ks (1, 2, 3)
    assert got == want


def test_verify_logits_match_decode_steps(hf):
    """verify_step over [cur, x1, x2] == three single-token decode steps' logits."""
    model = LlamaDecoder.from_hf(hf)
    prompt = sample_prompts()[0]
    table = torch.arange(8, dtype=torch.int32).view(1, 8)
    caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=i) for i in range(2)]
    model.prefill([prompt], caches, table)
    toks = torch.tensor([[5, 9, 33]])
    err = torch.zeros(1, dtype=torch.int32)
    got = model.verify_step(toks, torch.tensor([len(prompt)], dtype=torch.int32), caches, table, err)
    with torch.no_grad():
        ref = hf(torch.cat([prompt, toks[0]])[None]).logits[0, -3:]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # a padding row next to it writes nothing and leaves the live row unchanged
    k0 = caches[0].k[8:16].clone()
    got2 = model.verify_step(toks.repeat(2, 1), torch.tensor([len(prompt), -1], dtype=torch.int32),
                             caches, torch.cat([table, table + 8]), err)
    torch.testing.assert_close(got2[:3], got, rtol=1e-5, atol=1e-5)
    assert torch.equal(caches[0].k[8:16], k0) and int(err) == 0


def test_bad_input(hf):
    model = LlamaDecoder.from_hf(hf)
    caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu") for _ in range(2)]
    with pytest.raises(ValueError, match="method"):
        SpeculativeRunner(model, caches, SpeculativeConfig(method="draft", draft_model="/x"),
                          buckets=(1,), max_len=64, page_size=PAGE)
    with pytest.raises(ValueError, match="buckets"):
        SpeculativeRunner(model, caches, SpeculativeConfig(), buckets=(2, 1), max_len=64, page_size=PAGE)
    runner = SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=4), buckets=(1, 2),
                               max_len=64, page_size=PAGE)
    row = torch.arange(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="slot"):
        runner.set_slot(2, [1, 2], limit=10, block_table=row)
    with pytest.raises(ValueError, match="limit"):
        runner.set_slot(0, [1, 2], limit=61, block_table=row)
    with pytest.raises(ValueError, match="tokens"):
        runner.set_slot(0, [1, 2, 3], limit=2, block_table=row)
    with pytest.raises(ValueError, match="block_table"):
        runner.set_slot(0, [1, 2], limit=62 - 4, block_table=row[:2])
    with pytest.raises(ValueError, match="n:"):
        runner.run(3)
    assert runner.ks == (1, 2, 4)
    with pytest.raises(ValueError, match="k: 3 is not one of"):
        runner.run(1, k=3)
    with pytest.raises(ValueError, match="ks:"):
        SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=4), buckets=(1,), max_len=64,
                          page_size=PAGE, ks=(2, 5))
    for kw, field in ((dict(logprobs_width=-1), "logprobs_width"), (dict(logprobs_width=4), "logprobs_width"),
                      (dict(logprobs_mode="softmax"), "logprobs_mode")):   # width 4: slots without processing
        with pytest.raises(ValueError, match=field):
            SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=4), buckets=(1,), max_len=64,
                              page_size=PAGE, **kw)
    # one-round blocks: only with grammar-checked proposals (token masks of 1 + num_tokens positions)
    assert not runner.grammar
    with pytest.raises(ValueError, match=r"^rounds: 1 \(R\), or 1 for a processed block"):
        runner.run(1, rounds=2)
    from graphrt.model.token_mask import TokenMask
    with pytest.raises(ValueError, match=r"^mask: 4 positions a slot, a round verifies up to 5"):
        SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=4), buckets=(1,), max_len=64,
                          page_size=PAGE, mask=TokenMask.allocate(1, VOCAB, "cpu", positions=4))


def test_seeded_sampling_is_batch_invariant_and_clear_slot_stops(hf):
    """A seeded sampled request draws the same tokens alone (slot 0 of bucket 1) and in slot 2 of
    a batch of 3; a slot cleared by the host emits nothing afterwards."""
    prompts, table = sample_prompts(), page_table()
    model = LlamaDecoder.from_hf(hf)

    def run(slots, clear_after_first=None):
        caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=3 + i) for i in range(2)]
        runner = SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=3), buckets=(1, 3),
                                   max_len=128, page_size=PAGE, rounds=2)
        for slot, i in enumerate(slots):
            p = prompts[i]
            model.prefill([p], caches, table[i:i + 1])
            runner.set_slot(slot, p.tolist() + [7], limit=len(p) + 6, block_table=table[i],
                            temperature=0.8, seed=1234 + i, step=1)
        got = [[] for _ in slots]
        for blk in range(6):
            out, emitted, _, _, _ = runner.run(len(slots))
            if int(emitted.sum()) == 0:
                break
            for r in range(2):
                for s in range(len(slots)):
                    got[s] += out[r, s, : int(emitted[r, s])].tolist()
            if blk == 0 and clear_after_first is not None:
                runner.clear_slot(clear_after_first)
                cleared_at = len(got[clear_after_first])
        if clear_after_first is not None:
            assert len(got[clear_after_first]) == cleared_at
        return got

    alone = run([0])[0]
    batched = run([1, 2, 0], clear_after_first=0)
    assert len(alone) == 5 and batched[2] == alone


def test_top_k_needs_a_filtered_runner(hf):
    model = LlamaDecoder.from_hf(hf)
    caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu") for _ in range(2)]
    row = torch.arange(4, dtype=torch.int32)
    plain = SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=2), buckets=(1,),
                              max_len=64, page_size=PAGE)
    with pytest.raises(ValueError, match="filtered=True"):
        plain.set_slot(0, [1, 2], limit=10, block_table=row, temperature=1.0, top_k=5)
    filt = SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=2), buckets=(1,),
                             max_len=64, page_size=PAGE, filtered=True)
    with pytest.raises(ValueError, match="top_p"):
        filt.set_slot(0, [1, 2], limit=10, block_table=row, temperature=1.0, top_p=0.0)
    model.prefill([torch.tensor([3, 4, 3, 4])], caches, row[None])   # K/V of all but the last
    filt.set_slot(0, [3, 4, 3, 4, 3], limit=9, block_table=row, temperature=1.0, top_k=1, seed=3)
    out, emitted, _, _, _ = filt.run(1)                     # top_k = 1: sampling == greedy
    seq = [3, 4, 3, 4, 3] + out[0, 0, : int(emitted[0, 0])].tolist()
    with torch.no_grad():
        for i in range(5, len(seq)):
            assert seq[i] == int(hf(torch.tensor([seq[:i]])).logits[0, -1].argmax())


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_processed_rounds_record_each_emitted_tokens_logprobs(hf, mode):
    """A processed block records, for every emitted token (accepted proposals and the bonus /
    fallback token alike), its log-probability, rank and top N at its verified position: equal to
    HF's log-softmax over the full recomputation (raw: of the logits; processed: of the logits /
    temperature, what the sampler draws from), greedy and seeded-sampled slots side by side."""
    prompts, table, width, temps = sample_prompts()[:2], page_table(), 4, (0.0, 0.8)
    model = LlamaDecoder.from_hf(hf)
    caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=5 + i) for i in range(2)]
    first = model.prefill(prompts, caches, table[:2]).argmax(-1)
    slots = SlotState.allocate(4, 8, "cpu", history_width=128, vocab=VOCAB)
    runner = SpeculativeRunner(model, caches, SpeculativeConfig(num_tokens=2, ngram_min=1, ngram_max=3),
                               buckets=(1, 2, 4), max_len=128, page_size=PAGE, max_pages=8, rounds=2, slots=slots,
                               logprobs_width=width, logprobs_mode=mode)
    for i, p in enumerate(prompts):
        runner.set_slot(i, p.tolist(), append=first[i:i + 1], limit=len(p) + 11, block_table=table[i],
                        temperature=temps[i], seed=40 + i, step=1)
    got = [[] for _ in prompts]                             # (token, logprob, rank, ids, vals)
    accepted = 0
    for _ in range(8):
        out, emitted, proposed, lp, _ = runner.run(2, k=2, processed=True)
        assert lp is not None and lp[0].shape == (2, 2, 3) and lp[2].shape == (2, 2, 3, width)
        if int(emitted.sum()) == 0:
            break
        accepted += int((emitted - 1).clamp_min(0).sum())
        for r in range(2):
            for i in range(2):
                for j in range(int(emitted[r, i])):
                    got[i].append((int(out[r, i, j]), float(lp[0][r, i, j]), int(lp[1][r, i, j]),
                                   lp[2][r, i, j].tolist(), lp[3][r, i, j].clone()))
    assert accepted > 0                                     # accepted positions are among those checked
    plain = runner.run(2, k=2)                              # an unprocessed block records none
    assert plain.logprobs is None
    for i, p in enumerate(prompts):
        assert len(got[i]) == 10
        seq = p.tolist() + [int(first[i])] + [t for t, *_ in got[i]]
        with torch.no_grad():
            logits = hf(torch.tensor([seq])).logits[0].float()
        t_eff = temps[i] if mode == "processed" and temps[i] > 0 else 1.0
        ref = torch.log_softmax(logits / t_eff, -1)
        for n, (tok, lp_tok, rank, ids, vals) in enumerate(got[i]):
            row = ref[len(p) + n]                           # predicts token n + 1 of the output
            assert abs(lp_tok - float(row[tok])) < 1e-4, (i, n)
            assert rank == 1 + int((row > row[tok] + 1e-5).sum()), (i, n)
            top = torch.topk(row, width)
            assert ids == top.indices.tolist(), (i, n)
            torch.testing.assert_close(vals, top.values, atol=1e-4, rtol=0)
