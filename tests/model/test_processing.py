"""model/processing.py + model/logprobs.py on CPU: the processing of a row equals HF's
RepetitionPenaltyLogitsProcessor and OpenAI's presence / frequency rule on random logits of both
signs; token rules expire at their draw index; min_p at the temperature; the processed
distribution (drawn_from) is the sampler's kept set; counts advance per drawn token."""
from __future__ import annotations

import pytest
import torch

from graphrt.model.logprobs import LogprobBuffers, token_logprobs
from graphrt.model.processing import FOREVER, ProcessRows, ProcessState, drawn_from

transformers = pytest.importorskip("transformers")
V = 50


def _state(rows):
    st = ProcessState.allocate(4, V, "cpu", width=8)
    st.write_rows(torch.tensor([2, 0]), ProcessRows.build(rows, V, width=8))
    return st


def test_penalties_match_hf_and_openai():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, V, generator=g) * 3
    prompt, out = [[3, 4, 5], [7]], [[4, 9, 9, 9], []]
    st = _state([{"params": [0.6, 0.3, 1.7, 0.0], "rules": [], "prompt": prompt[0], "output": out[0]},
                 {"params": [0.0, 0.0, 1.0, 0.0], "rules": [], "prompt": prompt[1], "output": out[1]}])
    got = st.process(logits, torch.tensor([2, 0]), torch.zeros(2, dtype=torch.int32), torch.zeros(2))
    want = transformers.RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt[0] + out[0]]), logits[:1].clone())[0]
    counts = torch.bincount(torch.tensor(out[0]), minlength=V).float()
    want = want - 0.6 * (counts > 0) - 0.3 * counts
    torch.testing.assert_close(got[0], want)
    torch.testing.assert_close(got[1], logits[1])                          # a neutral row: unchanged
    st.count(torch.tensor([0]), torch.tensor([11]), torch.tensor([True]))
    assert int(st.counts[0, 11]) == 1 and int(st.counts[2].sum()) == 4


def test_rules_expire_and_min_p_uses_the_temperature():
    logits = torch.linspace(0, 4, V)[None].repeat(2, 1)
    st = _state([{"params": [0.0, 0.0, 1.0, 0.0], "rules": [(1, 100.0, FOREVER), (2, float("-inf"), 3)],
                  "prompt": [], "output": []},
                 {"params": [0.0, 0.0, 1.0, 0.5], "rules": [], "prompt": [], "output": []}])
    sel = torch.tensor([2, 0])
    for t, temp in ((2, 0.0), (3, 0.0), (3, 2.0)):
        x = st.process(logits, sel, torch.tensor([t, t], dtype=torch.int32), torch.tensor([temp, temp]))
        assert float(x[0, 1]) == pytest.approx(float(logits[0, 1]) + 100)
        assert (float(x[0, 2]) == -torch.inf) == (t < 3)
        if temp == 0:
            torch.testing.assert_close(x[1], logits[1])                   # greedy: min_p not applied
        else:                                                             # p / p_max >= 0.5 at T = 2
            keep = (logits[1] - logits[1].max()) / temp >= torch.log(torch.tensor(0.5))
            assert torch.equal(torch.isfinite(x[1]), keep) and 1 < int(keep.sum()) < V


def test_drawn_from_is_the_kept_set_at_the_temperature():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, V, generator=g)
    temp = torch.tensor([0.0, 0.5, 1.0])
    out = drawn_from(x, temp, torch.tensor([0, 5, 0], dtype=torch.int32), torch.tensor([1.0, 1.0, 0.5]))
    torch.testing.assert_close(out[0], x[0])                              # greedy: whole, unscaled
    top5 = torch.topk(x[1], 5).indices
    assert set(torch.isfinite(out[1]).nonzero().flatten().tolist()) == set(top5.tolist())
    torch.testing.assert_close(out[1, top5], x[1, top5] / 0.5)
    p = torch.softmax(x[2], -1)
    order = torch.argsort(p, descending=True)
    need = int((torch.cumsum(p[order], 0) - p[order] < 0.5).sum())
    assert int(torch.isfinite(out[2]).sum()) == need


def test_token_logprobs_and_buffers():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, V, generator=g)
    tok = torch.tensor([0, 5, 7])
    lp, rank, ids, vals = token_logprobs(x, tok, 4)
    ref = torch.log_softmax(x, -1)
    torch.testing.assert_close(lp, ref.gather(1, tok[:, None])[:, 0])
    assert rank.tolist() == [int((ref[i] > ref[i, tok[i]]).sum()) + 1 for i in range(3)]
    torch.testing.assert_close(vals, torch.topk(ref, 4).values)
    buf = LogprobBuffers.allocate(steps=2, max_batch=4, width=4, device="cpu")
    buf.record(1, 3, x, tok)
    assert torch.equal(buf.view(3)[2][1], ids)


def test_process_verify_counts_the_proposals_before_each_position():
    g = torch.Generator().manual_seed(3)
    st = _state([{"params": [0.4, 0.3, 1.5, 0.0], "rules": [(6, float("-inf"), 2)], "prompt": [1, 2], "output": [4]},
                 {"params": [0.0, 0.0, 1.0, 0.0], "rules": [], "prompt": [3], "output": []}])
    q, size = 3, 3                                   # slots 0..2 (slot 2 and 0 written above)
    logits = torch.randn(size * q, V, generator=g)
    proposals = torch.tensor([[4, 9], [9, 9], [5, 4]])
    step = torch.tensor([1, 0, 5], dtype=torch.int32)
    temp = torch.zeros(size)
    got = st.process_verify(logits, size, proposals, step, temp)
    for b in range(size):
        for j in range(q):
            ref = ProcessState(st.counts.clone(), st.prompt, st.params, st.rule_ids, st.rule_vals, st.rule_until)
            for x in proposals[b, :j].tolist():
                ref.count(torch.tensor([b]), torch.tensor([x]), torch.tensor([True]))
            want = ref.process(logits[b * q + j][None], torch.tensor([b]), step[b:b + 1] + j, temp[b:b + 1])[0]
            torch.testing.assert_close(got[b * q + j], want)
