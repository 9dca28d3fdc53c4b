"""ModelRuntime's split steps on CPU (model/runtime.py "Split steps"): K forward + draw launch
pairs give the tokens, log-probabilities and slot state of one K-step processed block from the
same state (sampled and greedy rows, processing rows, a constrained row's mask); a mask written
between a forward and its draw is the one the draw applies; a draw without its forward, an
unknown part, or a part of an unprocessed block is refused naming `part`."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.model.processing import ProcessRows
from graphrt.model.runtime import ModelRuntime
from graphrt.model.sampling import SamplingInputs

transformers = pytest.importorskip("transformers")
V, K = 160, 2


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=128, intermediate_size=224, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    return LlamaDecoder.from_hf(transformers.LlamaForCausalLM(cfg).eval())


def _loaded(model) -> ModelRuntime:
    """A runtime whose slots 0, 1 decode (a sampled row, a greedy row) after one K-step block,
    with neutral-but-penalised processing rows and slot 0 constrained to the even tokens."""
    rc = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                       buckets=[1, 2], dtype="float32", backend="torch", kv_pool_pages=8)
    mrt = ModelRuntime(model, rc, "cpu", steps_per_graph=K, processing=True)
    prompts = [torch.tensor([5, 9, 33, 2, 71]), torch.tensor([101, 7, 7])]
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    first = mrt.prefill(prompts, table).argmax(-1)
    sampling = SamplingInputs(torch.tensor([0.9, 0.0]), torch.tensor([0, 0], dtype=torch.int32),
                              torch.tensor([1.0, 1.0]), torch.tensor([17, 3]), torch.tensor([1, 1], dtype=torch.int32))
    mrt.decode(first, table, torch.tensor([6, 4], dtype=torch.int32), sampling=sampling)
    mrt.slots.proc.write_rows(torch.tensor([0, 1]), ProcessRows.build(
        [{"params": [0.4, 0.1, 1.3, 0.0], "rules": [], "prompt": p.tolist(), "output": []} for p in prompts], V))
    even = torch.zeros(V, dtype=torch.bool)
    even[::2] = True
    mrt.token_mask.write([0, 1], _bits(even)[None].repeat(2, 1), torch.tensor([1, 0], dtype=torch.int32))
    return mrt


def _bits(allowed: torch.Tensor) -> torch.Tensor:
    """[V] bool -> [ceil(V / 32)] int32 (bit t % 32 of word t // 32)."""
    x = torch.nn.functional.pad(allowed.to(torch.int64), (0, (-V) % 32)).view(-1, 32)
    packed = (x << torch.arange(32)).sum(1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _state(mrt):
    st = mrt.slots
    return [t[:2].clone() for t in (st.seq_lens, st.tokens, st.step, st.proc.counts)]


def test_split_steps_equal_a_whole_block(model):
    whole, split = _loaded(model), _loaded(model)
    want = whole.decode_slots(2, sampled=True, processed=True, filtered=False).clone()     # [K, 2]
    want_lp = [t.clone() for t in whole.logprobs.view(2)]
    got, got_lp = [], []
    for _ in range(K):
        assert split.decode_slots(2, sampled=True, processed=True, filtered=False, part="forward") is None
        got.append(split.decode_slots(2, sampled=True, processed=True, filtered=False, part="draw").clone())
        got_lp.append([t[0].clone() for t in split.logprobs.view(2)])
    assert torch.equal(torch.cat(got), want)
    assert all(int(t) % 2 == 0 for t in want[:, 0])                   # slot 0's mask held
    for j in range(K):
        for a, b in zip(got_lp[j], want_lp):
            torch.testing.assert_close(a, b[j])
    for a, b in zip(_state(split), _state(whole)):
        assert torch.equal(a, b)


def test_the_draw_reads_the_mask_written_after_its_forward(model):
    mrt = _loaded(model)
    mrt.decode_slots(2, sampled=True, processed=True, part="forward")
    only = torch.zeros(V, dtype=torch.bool)
    only[57] = True                                                   # odd: the old mask forbade it
    mrt.token_mask.write([0], _bits(only)[None], torch.tensor([1], dtype=torch.int32))
    out = mrt.decode_slots(2, sampled=True, processed=True, part="draw")
    assert int(out[0, 0]) == 57 and out.shape == (1, 2)


def test_bad_parts_name_the_field(model):
    mrt = _loaded(model)
    with pytest.raises(ValueError, match=r"^part: 'draw' over 2 rows needs the 'forward'"):
        mrt.decode_slots(2, sampled=True, processed=True, part="draw")
    with pytest.raises(ValueError, match=r"^part: expected one of"):
        mrt.decode_slots(2, sampled=True, processed=True, part="both")
    with pytest.raises(ValueError, match=r"^part: 'forward' splits a processed step"):
        mrt.decode_slots(2, sampled=True, part="forward")
    mrt.decode_slots(2, sampled=True, processed=True, part="forward")
    with pytest.raises(ValueError, match=r"^part: 'draw' over 1 rows"):
        mrt.decode_slots(1, sampled=True, processed=True, part="draw")
    mrt.decode_slots(2, sampled=True, processed=True, part="forward")
    mrt.decode_slots(2, sampled=True, processed=True)                 # a whole block: the forward is void
    with pytest.raises(ValueError, match=r"^part: 'draw'"):
        mrt.decode_slots(2, sampled=True, processed=True, part="draw")


def test_a_forward_never_drawn_changes_no_slot(model):
    """The engine may launch a split step's next forward ahead of its draw (Engine.RUN_AHEAD) and
    drops it when a prefill comes first: a forward advances no slot, so after a dropped one the
    next step's tokens and state equal those of a runtime that never ran it; a prefill between a
    forward and its draw voids the forward (the draw is refused)."""
    dropped, clean = _loaded(model), _loaded(model)
    before = _state(dropped)
    dropped.decode_slots(2, sampled=True, processed=True, part="forward")
    assert all(torch.equal(a, b) for a, b in zip(_state(dropped), before))
    for mrt in (dropped, clean):
        mrt.decode_slots(2, sampled=True, processed=True, part="forward")
    assert torch.equal(dropped.decode_slots(2, sampled=True, processed=True, part="draw"),
                       clean.decode_slots(2, sampled=True, processed=True, part="draw"))
    assert all(torch.equal(a, b) for a, b in zip(_state(dropped), _state(clean)))
    dropped.decode_slots(2, sampled=True, processed=True, part="forward")
    dropped.prefill([torch.tensor([3, 4])], torch.tensor([[4]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^part: 'draw' over 2 rows needs the 'forward'"):
        dropped.decode_slots(2, sampled=True, processed=True, part="draw")


def test_the_draw_reports_the_argmax_before_masks(model):
    """split_argmax: each row's argmax of the forward's logits, before the mask and processing
    (slot 0's mask allows only even tokens: its draw is even, its reported argmax need not be)."""
    mrt = _loaded(model)
    for _ in range(3):
        mrt.decode_slots(2, sampled=True, processed=True, part="forward")
        want = mrt.split_logits[:2].argmax(-1)
        out = mrt.decode_slots(2, sampled=True, processed=True, part="draw")
        assert torch.equal(mrt.split_argmax[:2], want)
        assert int(out[0, 0]) % 2 == 0
