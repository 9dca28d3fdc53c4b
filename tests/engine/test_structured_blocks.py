"""How the engine launches blocks around constrained rows, against a pure-Python executor of the
protocol (tests/engine/test_executor_protocol.py's kind, with logits processing and token masks).

The fake draws a constrained slot's token as the allowed token (its last written mask) of the
highest pseudo-random score, and any other slot's as its current token + 1, so a constrained
output is valid only if every mask the engine wrote was filled after the matcher had seen every
earlier token. Checked: while no constrained row decodes, blocks are whole K-step blocks with no
mask written; while one decodes, every block is a split step, launched as forward, then the
masks, then the draw (nothing else between); the scheduler's count of constrained rows follows
the rows; K-step blocks come back once the constrained row is done; outputs validate."""
from __future__ import annotations

import re

import pytest

from _checkpoints import make_checkpoint_module
from graphrt.checkpoint.tokenizer import load_tokenizer
from graphrt.engine.engine import Engine
from graphrt.engine.params import SamplingParams
from graphrt.worker.protocol import Executor
from _masking import MaskingExecutor

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok_blocks")
    make_checkpoint_module().build_tokenizer(out, vocab_size=384, seed=0)
    return load_tokenizer(out)


def _blocks(calls) -> list[str]:
    """The decode launches as letters: W (a whole K-step block), F (forward), M (masks), D (draw)."""
    out = []
    for kind, x in calls:
        if kind == "run":
            out.append({None: "W", "forward": "F", "draw": "D"}[x.part])
        elif kind == "mask":
            out.append("M")
        else:
            out.append("P")
    return out


@pytest.mark.parametrize("overlap,ahead", [(True, False), (True, True), (False, False)])
def test_launch_pattern_around_a_constrained_row(tokenizer, overlap, ahead):
    ex = MaskingExecutor(len(tokenizer))
    assert isinstance(ex, Executor)
    eng = Engine(ex, tokenizer, eos_token_ids=(1,), max_model_len=100, overlap=overlap)
    assert not eng.RUN_AHEAD                                        # the default
    eng.RUN_AHEAD = ahead
    free = eng.add_request([5, 6, 7], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    before = len(ex.calls)
    regex = r"(ab|cd){2,4}-[0-9]"
    con = eng.add_request([9, 10], SamplingParams(max_tokens=30, temperature=0, structured_outputs={"regex": regex}))
    counts = []
    for _ in range(200):
        busy = eng.step()
        counts.append(len(eng.scheduler.constrained))
        if not busy:
            break
    out = con.result().outputs[0]
    text = out.text
    assert re.fullmatch(regex, text), text
    assert len(free.result().outputs[0].token_ids) == 40
    letters = "".join(_blocks(ex.calls))
    head, tail = "".join(_blocks(ex.calls[:before])), "".join(_blocks(ex.calls[before:]))
    assert set(head) <= {"P", "W"} and "W" in head                  # free decoding: K-step blocks, no masks
    # the constrained request: its prefill with its first mask, then split steps (F M D) only (the
    # last one without masks: its row finished while that step's forward ran), then, once it is
    # done, K-step blocks again
    m = re.fullmatch(r"W*MP((?:FMD)+)(?:FD)?(W+)", tail)
    assert m, letters
    assert len(m.group(1)) // 3 == len(out.token_ids) - 1   # a split step per token after the first
    assert max(counts) == 1 and counts[-1] == 0 and not eng.scheduler.constrained
    assert ex.dropped == 0                                          # every forward launched ahead was drawn


def _serve(overlap: bool, tokenizer, late: bool):
    """A free row and a constrained one; late: two more requests (one constrained) arrive while
    the constrained row decodes. -> (outputs' token ids, executor)."""
    ex = MaskingExecutor(len(tokenizer))
    eng = Engine(ex, tokenizer, eos_token_ids=(1,), max_model_len=100, overlap=overlap)
    eng.RUN_AHEAD = True                                            # off by default (no measured gain)
    streams = [eng.add_request([5, 6, 7], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)),
               eng.add_request([9, 10], SamplingParams(max_tokens=40, temperature=0,
                                                        structured_outputs={"regex": r"(ab|cd){4,9}-[0-9]"}))]
    for i in range(300):
        if late and i == 6:
            streams.append(eng.add_request([3], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)))
            streams.append(eng.add_request([4, 4], SamplingParams(max_tokens=30, temperature=0,
                                                                   structured_outputs={"regex": r"[a-c]{5,8}!"})))
        if not eng.step() and i > 6:
            break
    outs = [s.result().outputs[0] for s in streams]
    return [(o.token_ids, o.text) for o in outs], ex


@pytest.mark.parametrize("late", [False, True])
def test_forwards_launched_ahead_change_no_token(tokenizer, late):
    """With overlap, a split step's next forward is launched right after its draw and the next
    block draws it; a prefill drops it (the step never happened: a forward advances no slot).
    Every output equals the engine's without overlap (no forward ahead); constrained outputs
    validate."""
    got, ex = _serve(True, tokenizer, late)
    want, ex0 = _serve(False, tokenizer, late)
    assert got == want
    assert ex0.dropped == 0
    ahead = sum(1 for (k1, a), (k2, b) in zip(ex.calls, ex.calls[1:])
                if k1 == "run" and a.part == "draw" and k2 == "run" and b.part == "forward")
    assert ahead >= 5                                               # forwards launched right after a draw
    assert ex.dropped == (1 if late else 0)                         # the late prefill dropped one
    if late:
        assert re.fullmatch(r"[a-c]{5,8}!", got[3][1]), got[3][1]
    text = got[1][1]
    assert re.fullmatch(r"(ab|cd){4,9}-[0-9]", text), text


def test_two_constrained_rows_and_a_finished_one(tokenizer):
    """Two constrained rows of different lengths beside a free one: the count drops to 1, then 0;
    split steps continue while one is left; every output validates."""
    ex = MaskingExecutor(len(tokenizer))
    eng = Engine(ex, tokenizer, eos_token_ids=(1,), max_model_len=100)
    streams = [eng.add_request([4, 4], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)),
               eng.add_request([8], SamplingParams(max_tokens=30, temperature=0, structured_outputs={"choice": ["yes", "no"]})),
               eng.add_request([8, 9], SamplingParams(max_tokens=30, temperature=0,
                                                       structured_outputs={"regex": r"[a-c]{6,9}!"}))]
    seen = set()
    for _ in range(200):
        busy = eng.step()
        seen.add(len(eng.scheduler.constrained))
        if not busy:
            break
    outs = [s.result().outputs[0] for s in streams]
    assert outs[1].text in ("yes", "no") and re.fullmatch(r"[a-c]{6,9}!", outs[2].text)
    assert {0, 1, 2} <= seen
    masks = [x for kind, x in ex.calls if kind == "mask"]
    assert masks and all(set(m) <= {1, 2} for m in masks)           # only constrained slots get masks


def test_no_forward_ahead_while_a_prompt_prefills_in_chunks(tokenizer):
    """A long prompt prefilled in chunks beside a constrained row: each chunk's prefill would drop
    a forward launched ahead, so none is launched while a prompt is being prefilled (at most the
    one in flight when the prompt arrived is dropped); the outputs validate."""
    ex = MaskingExecutor(len(tokenizer))
    eng = Engine(ex, tokenizer, eos_token_ids=(1,), max_model_len=100, max_num_batched_tokens=4)
    eng.RUN_AHEAD = True
    con = eng.add_request([9, 10], SamplingParams(max_tokens=30, temperature=0,
                                                   structured_outputs={"regex": r"(ab|cd){6,12}-[0-9]"}))
    for _ in range(4):
        eng.step()
    long = eng.add_request(list(range(20, 60)), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    for _ in range(300):
        if not eng.step():
            break
    assert re.fullmatch(r"(ab|cd){6,12}-[0-9]", con.result().outputs[0].text)
    assert len(long.result().outputs[0].token_ids) == 4
    prefills = sum(1 for kind, x in ex.calls if kind == "prefill")
    assert prefills >= 8 and ex.dropped <= 1                        # 40 tokens in chunks of 4
