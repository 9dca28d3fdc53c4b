"""The engine against a pure-Python executor that implements only graphrt.worker's protocol.

The fake draws deterministic tokens (a prefill's first token from the context's length and last
token, then +1 a step, mod V), so every request's whole output is known in advance; it has no
attribute beyond the protocol's, so an engine that probed for anything else would fail here. It
keeps its own mirror of the slots from the slot changes each launch carries (the engine writes
no slot state): a prefill's block-table rows are rows of that mirror, every live row of a block
holds the pages the block writes, and once the engine is idle every slot is free again.
What it lacks (logits processing, speculation) is declared in its Capabilities and refused where a
request asks for it, with a ValueError naming the field.
"""
from __future__ import annotations

import pytest
import torch

from graphrt.config import RuntimeConfig
from graphrt.engine.engine import Engine
from graphrt.engine.params import SamplingParams
from graphrt.worker.caps import Capabilities
from graphrt.worker.changes import Activate, Deactivate, SetPages
from graphrt.worker.launch import Block, Draw, Prefill, Result
from graphrt.worker.protocol import Executor

V, K, B, PAGE = 97, 3, 4, 4


def _first(context_len: int, last: int) -> int:
    return (context_len + 7 * last) % V


class FakeExecutor:
    """The Executor protocol with no device: `calls` records (name, launch) per call."""

    def __init__(self, **caps):
        config = RuntimeConfig(num_qo_heads=2, num_kv_heads=2, head_dim=64, page_size=PAGE, max_context_len=64,
                               buckets={"max": B}, dtype="float32", backend="reference")
        self.caps = Capabilities(config=config, device=torch.device("cpu"), num_pages=64, vocab_size=V,
                                 model_key="fake", steps_per_graph=K, **caps)
        self.error_flag = None
        self.calls: list = []
        self._current = [0] * B                       # each slot's current token
        self.seq = [0] * B                            # the slots' mirror, from the launches' changes:
        self.pages: dict[int, list[int]] = {}         # seq_len (0: padding) and pages per slot

    def capture(self) -> dict:
        return {}

    def apply_changes(self, changes) -> None:
        for c in changes:
            if isinstance(c, SetPages):
                row = self.pages.setdefault(c.slot, [])
                assert c.col == len(row), (c, row)    # pages are appended in order
                row.extend(c.pages)
            elif isinstance(c, Activate):
                assert c.slot in self.pages and self.seq[c.slot] == 0, c
                self.seq[c.slot] = c.seq_len
            elif isinstance(c, Deactivate):
                self.seq[c.slot] = 0
                if c.free:
                    self.pages.pop(c.slot, None)
            else:
                raise AssertionError(f"no token history / processing here: {c}")

    def stage_chunk(self, slot, tokens, start, *, table_row=None) -> None:
        raise AssertionError("caps.mixed_tokens is 0: no chunk may be staged")

    def prefill(self, launch: Prefill) -> Result:
        self.calls.append(("prefill", launch))
        self.apply_changes(launch.changes)
        held = {tuple(p) for p in self.pages.values()}
        for row in launch.block_table.tolist():      # each row: a slot's pages, then padding
            pages = [x for x in row if x >= 0]
            assert row[:len(pages)] == pages and tuple(pages) in held, row
        if not launch.draws:
            return Result(None)
        starts = launch.starts or [0] * len(launch.prompts)
        first = []
        for slot, j in zip(launch.slots, launch.sources or range(len(launch.slots))):   # sources: n > 1
            prompt = launch.prompts[j]
            self._current[slot] = _first(starts[j] + prompt.numel(), int(prompt[-1]))
            first.append(self._current[slot])
        return Result(torch.tensor([first], dtype=torch.int64))

    def run(self, block: Block) -> Result:
        self.calls.append(("run", block))
        assert block.k == 0 and not block.chunk and not block.draw.processed
        self.apply_changes(block.changes)
        assert not any(self.seq[block.n:]), (block.n, self.seq)   # rows past n are padding
        out = torch.zeros((K, block.n), dtype=torch.int64)        # a padding row draws nothing (0)
        for s in range(block.n):                      # a live row writes positions seq - 1 .. seq + K - 2
            if self.seq[s]:
                assert len(self.pages[s]) * PAGE >= self.seq[s] + K - 1, (s, self.seq[s], self.pages[s])
                self.seq[s] += K
                for j in range(K):
                    self._current[s] = (self._current[s] + 1) % V
                    out[j, s] = self._current[s]
        return Result(out)

    def write_token_mask(self, slots, bits, active) -> None:
        raise AssertionError("caps.structured is False: no mask may be written")

    def prefill_graphed(self, new_tokens: int) -> bool:
        return False

    def measure_costs(self):
        return None

    def check_device_errors(self) -> None:
        pass


class _Tokenizer:
    """Token ids as words: enough for the engine's detokenizer and stop checks."""

    def __call__(self, text, add_special_tokens=True):
        return type("Enc", (), {"input_ids": [int(w[1:]) for w in text.split()]})()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" t{i}" for i in ids)

    def __len__(self):
        return V


def _engine(ex, **kw):
    return Engine(ex, _Tokenizer(), eos_token_ids=(V - 1,), max_model_len=48, **kw)


def _expected(prompt: list[int], n: int) -> list[int]:
    first = _first(len(prompt), prompt[-1])
    return [(first + i) % V for i in range(n)]


def _drain(engine, streams) -> list:
    for _ in range(200):
        if not engine.step():
            break
    return [s.result() for s in streams]


@pytest.mark.parametrize("overlap", [True, False])
def test_requests_run_to_completion_through_the_protocol_only(overlap):
    ex = FakeExecutor()
    assert isinstance(ex, Executor)
    eng = _engine(ex, overlap=overlap)
    prompts = [[5, 6, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19], [40], [3, 3, 3, 3, 3]]
    maxes = [5, 7, 1, 9]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in maxes]
    params[1] = SamplingParams(max_tokens=7, temperature=0.8, seed=3, ignore_eos=True)   # one samples
    streams = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    outs = _drain(eng, streams)
    for p, m, out in zip(prompts, maxes, outs):
        assert out.token_ids == _expected(p, m), (p, out.token_ids)
        assert out.finish_reason == "length"
    names = {name for name, _ in ex.calls}
    assert names == {"prefill", "run"}
    blocks = [b for name, b in ex.calls if name == "run"]
    assert any(b.draw.sampled for b in blocks)              # the sampling request's blocks
    assert any(b.changes for b in blocks) and any(launch.changes for name, launch in ex.calls if name == "prefill")
    assert eng.stats()["running"] == 0 and eng.stats()["pages_used"] == 0
    ex.apply_changes(eng.scheduler.take_changes())          # what the next launch would carry
    assert ex.seq == [0] * B and ex.pages == {}             # every slot freed


def test_a_stop_token_ends_a_request_inside_a_block():
    ex = FakeExecutor()
    eng = _engine(ex)
    prompt = [2, 9]                              # first = (2 + 63) % 97 = 65, then 66, 67, ...
    want = _expected(prompt, 10)
    stream = eng.add_request(prompt, SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[want[4]]))
    out = _drain(eng, [stream])[0]
    assert out.token_ids == want[:5] and out.finish_reason == "stop"


@pytest.mark.parametrize("shared", [True, False])
def test_samples_share_a_prefill_only_where_the_executor_can(shared):
    """n > 1: the samples' prompt is prefilled once and drawn from by each (Prefill.sources) only
    where caps.shared_prefill says the executor can (an EAGLE-3 head prefills every sample)."""
    ex = FakeExecutor(shared_prefill=shared)
    eng = _engine(ex)
    prompt = [4, 5, 6, 7, 8]
    out = _drain(eng, [eng.add_request(prompt, SamplingParams(n=2, max_tokens=4, temperature=0.0,
                                                              ignore_eos=True))])[0]
    assert [c.token_ids for c in out.outputs] == [_expected(prompt, 4)] * 2
    drawing = [launch for name, launch in ex.calls if name == "prefill" and launch.draws]
    assert any(launch.sources is not None for launch in drawing) == shared


@pytest.mark.parametrize("field,params", [
    ("logprobs", dict(logprobs=2)),
    ("presence_penalty", dict(presence_penalty=0.5)),
    ("prompt_logprobs", dict(prompt_logprobs=1)),
])
def test_a_capability_the_executor_lacks_is_refused_naming_the_field(field, params):
    eng = _engine(FakeExecutor())                # caps.processing False
    with pytest.raises(ValueError, match=rf"^{field}: needs logits processing"):
        eng.add_request([1, 2, 3], SamplingParams(max_tokens=2, **params))


def test_log_probs_wider_than_the_executor_keeps_are_refused():
    eng = _engine(FakeExecutor(processing=True, logprobs_width=2))
    with pytest.raises(ValueError, match=r"^logprobs: at most 2"):
        eng.add_request([1, 2, 3], SamplingParams(max_tokens=2, logprobs=3))


def test_an_object_without_the_protocol_is_refused():
    class NotAnExecutor:
        caps = None
    with pytest.raises(ValueError, match=r"^executor: NotAnExecutor does not implement graphrt.worker.Executor"):
        _engine(NotAnExecutor())


@pytest.mark.parametrize("kw,field", [
    (dict(steps_per_graph=0), "steps_per_graph"),
    (dict(spec_ks=(2,)), "spec_ks"),
    (dict(logprobs_width=4), "logprobs_width"),
    (dict(mixed_tokens=-1), "mixed_tokens"),
    (dict(history_width=0), "history_width"),
    (dict(tensor_parallel=0), "tensor_parallel"),
    (dict(structured=True), "structured"),                  # masks without processing
    (dict(processing=True, structured=True, spec_grammar=True), "spec_grammar"),   # without speculation
    (dict(kernels="cuda"), "kernels"),
])
def test_capabilities_refuse_bad_fields(kw, field):
    base = dict(config=FakeExecutor().caps.config, device=torch.device("cpu"), num_pages=8, vocab_size=V,
                model_key="x", steps_per_graph=1)
    with pytest.raises(ValueError, match=rf"^{field}:"):
        Capabilities(**{**base, **kw})


@pytest.mark.parametrize("kw,field", [
    (dict(n=0), "n"), (dict(n=2, k=-1), "k"), (dict(n=2, k=2, chunk=True), "chunk"),
    (dict(n=2, logprobs=True), "logprobs"), (dict(n=2, draw="greedy"), "draw"),
    (dict(n=2, part="forward"), "part"),                                  # a split step: processed only
    (dict(n=2, part="both", draw=Draw(True, True)), "part"), (dict(n=2, k=1, part="draw", draw=Draw(True, True)), "part"),
    (dict(n=2, part="forward", logprobs=True, draw=Draw(True, True)), "logprobs"),   # the draw records them
    (dict(n=2, rounds=1, draw=Draw(True, True)), "rounds"),               # one round: speculative only
    (dict(n=2, k=2, rounds=2, draw=Draw(True, True)), "rounds"), (dict(n=2, k=2, rounds=1), "rounds"),
    (dict(n=2, changes=(3,)), "changes"), (dict(n=2, changes="SetPages"), "changes"),
])
def test_block_launches_refuse_bad_fields(kw, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        Block(**kw)


def test_prefill_launches_refuse_bad_fields():
    table = torch.zeros((1, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^after: 2 tokens for 1 prompts"):
        Prefill([torch.tensor([1, 2])], table, after=[1, 2])
    with pytest.raises(ValueError, match=r"^sampling:"):
        Prefill([torch.tensor([1, 2])], table, slots=[0])
    with pytest.raises(ValueError, match=r"^starts: 2 for 1 prompts"):
        Prefill([torch.tensor([1, 2])], table, starts=[0, 1])
    with pytest.raises(ValueError, match=r"^slots: a prefill that draws nothing"):
        Prefill([torch.tensor([1, 2])], table, copies=((1, 2),))
    with pytest.raises(ValueError, match=r"^changes: dict is not a slot change"):
        Prefill([torch.tensor([1, 2])], table, changes=[{"slot": 0}])


def test_a_prefill_that_raises_leaves_its_slot_changes_to_the_next_launch():
    """One request's prefill fails before the executor applied what the launch carried: the
    engine gives the changes back to the scheduler, the next launch carries them, and the
    executor's mirror stays what the scheduler holds (a slot is activated only once freed)."""
    ex = FakeExecutor()
    real = ex.prefill

    def prefill(launch):
        if any(p.numel() == 6 for p in launch.prompts):
            raise ValueError("prompt: refused for the test")
        return real(launch)
    ex.prefill = prefill
    ex.prefill_graphed = lambda new_tokens: True         # one launch per request: A's, then B's
    eng = _engine(ex)
    params = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
    a, b = eng.add_request([5, 6, 7], params), eng.add_request([1, 2, 3, 4, 5, 6], params)
    eng.step()                                           # B's launch carries A's activation, and raises
    c = eng.add_request([9, 9], params)
    outs = _drain(eng, [a, c])
    with pytest.raises(ValueError, match="refused for the test"):
        b.result()
    assert [o.token_ids for o in outs] == [_expected([5, 6, 7], 7), _expected([9, 9], 7)]
    ex.apply_changes(eng.scheduler.take_changes())
    assert ex.seq == [0] * B and ex.pages == {}
