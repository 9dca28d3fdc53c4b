"""Constrained rows decoding unmasked (engine/structured.py FreeRun) against a scripted executor
of the protocol: the fake "model" prefers, at each position, the next token of a script (the
split draw reports that preference as its argmax); the script follows the grammar for a while,
then strays. Checked: after FreeRun.NEED masked steps whose argmax the grammar allowed the row
runs whole K-step blocks with no mask; at the first token its grammar refuses the row is set back
(Activate + SetToken to its last accepted token, draws in flight discarded) and draws that
position masked; every output equals the always-masked engine's, token for token, and
validates. Also GrammarState.allows / prefix against xgrammar's own masks, the FreeRun rule and
which sampling parameters may run unmasked."""
from __future__ import annotations

import re

import pytest
import torch

from _checkpoints import make_checkpoint_module
from graphrt.checkpoint.tokenizer import load_tokenizer
from graphrt.engine.engine import Engine
from graphrt.engine.params import SamplingParams, StructuredOutputsParams
from graphrt.engine.structured import FreeRun, Grammars, unmasked_ok
from graphrt.engine.token_bytes import token_bytes
from graphrt.kernels.token_mask import reference_mask
from graphrt.worker.changes import Activate, SetToken
from graphrt.worker.launch import Result
from _masking import MaskingExecutor

pytest.importorskip("xgrammar")
REGEX = r"(ab|cd){3,12}-[0-9]"


class ScriptedExecutor(MaskingExecutor):
    """MaskingExecutor whose rows all draw the argmax of a score that puts `script` (token ids,
    indexed by the row's generated position) first, under the row's mask when its flag is on;
    a sampled row's score also gets noise keyed by (seed, draw index, token) times its
    temperature (Gumbel-max's shape: the draw index must be the one of its position); applies
    Activate / SetToken (a set-back row's position, draw index and token); a split draw also
    returns each row's argmax without the mask."""

    def __init__(self, vocab: int, script: list[int], prompt_len: int):
        super().__init__(vocab)
        self.script, self.prompt_len, self.changes = script, prompt_len, []
        self.step, self.temp, self.seed = [0] * len(self.length), [0.0] * len(self.length), [0] * len(self.length)

    def _logits(self, slot: int) -> torch.Tensor:
        """What the "model" computes from the row's position (a forward's work)."""
        score = ((torch.arange(self.vocab) * 7919 + self.length[slot] * 104729) % 1009).float()
        i = self.length[slot] - self.prompt_len
        if 0 <= i < len(self.script):
            score[self.script[i]] += 1500.0
        return score

    def _score(self, slot: int) -> torch.Tensor:
        """The draw's score: a split step's forward's logits (kept from its launch: a draw paired
        with a stale forward draws from the old position), + the sampler's noise."""
        snap = getattr(self, "snap", None)
        score = snap[slot].clone() if snap is not None and slot < len(snap) else self._logits(slot)
        if self.temp[slot] > 0:
            g = torch.Generator().manual_seed(self.seed[slot] * 1000003 + self.step[slot])
            score += self.temp[slot] * 3000.0 * torch.rand(self.vocab, generator=g)
        return score

    def _draw(self, slot: int) -> int:
        score = reference_mask(self._score(slot)[None], self.bits, self.active, torch.tensor([slot]))[0]
        tok = int(score.argmax())
        self.current[slot], self.length[slot] = tok, self.length[slot] + 1
        self.step[slot] += self.temp[slot] > 0
        return tok

    def prefill(self, launch):
        self.snap = None                                # a forward launched ahead: dropped
        if launch.sampling is not None:
            for i, slot in enumerate(launch.slots):
                sp = launch.sampling
                self.temp[slot], self.seed[slot] = float(sp.temperature[i]), int(sp.seed[i])
                self.step[slot] = int(sp.step[i])
        return super().prefill(launch)

    def run(self, block):
        for c in block.changes:
            self.changes.append(c)
            if isinstance(c, Activate):
                self.length[c.slot], self.step[c.slot] = c.seq_len, c.step
                self.temp[c.slot], self.seed[c.slot] = c.temperature, c.seed
            elif isinstance(c, SetToken):
                self.current[c.slot] = c.token
        if block.part == "forward":
            self.snap = [self._logits(s) for s in range(block.n)]
        if block.part == "draw":
            best = torch.tensor([[int(self.snap[s].argmax()) for s in range(block.n)]])
            res = super().run(block)
            self.snap = None
            return Result(res.tokens, argmax=best)
        self.snap = None if block.part is None else self.snap
        return super().run(block)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok_free")
    make_checkpoint_module().build_tokenizer(out, vocab_size=384, seed=0)
    return load_tokenizer(out)


def _script(tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return list(ids.ids if hasattr(ids, "ids") else ids)


def _serve(tokenizer, free: bool, script_text: str, *, temperature=0.0, with_free_row=True):
    prompt = [9, 10]
    ex = ScriptedExecutor(len(tokenizer), _script(tokenizer, script_text) + [1], len(prompt))   # + its end
    eng = Engine(ex, tokenizer, eos_token_ids=(1,), max_model_len=120)
    eng.FREE_RUN = free
    streams = []
    if with_free_row:
        streams.append(eng.add_request([5, 6, 7], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)))
    streams.append(eng.add_request(prompt, SamplingParams(max_tokens=60, temperature=temperature, seed=5,
                                                          structured_outputs={"regex": REGEX})))
    letters = []
    for _ in range(400):
        con = len(eng.scheduler.constrained)
        n = len(ex.calls)
        busy = eng.step()
        letters += [(con, x.part) for kind, x in ex.calls[n:] if kind == "run"]
        if not busy:
            break
    outs = [s.result().outputs[0] for s in streams]
    a = eng.scheduler.allocator                       # every page back, set-backs included
    assert not eng._pending and all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))
    return outs, ex, letters


@pytest.mark.parametrize("script", ["abababcdcdabcdabab-7", "ababcdcdcdabxyabab-7", "abcdzz"])
def test_unmasked_runs_equal_masked_decoding(tokenizer, script):
    """A script that follows the grammar to its end (free blocks kept whole), one that strays in
    the middle (set back, masked, then free again or not) and one that strays early: the
    outputs equal the always-masked engine's; K-step blocks ran while the constrained row
    decoded where the script agreed long enough."""
    got, ex, letters = _serve(tokenizer, True, script)
    want, ex0, letters0 = _serve(tokenizer, False, script)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    text = got[-1].text
    assert re.fullmatch(REGEX, text), text
    whole = sum(1 for con, part in letters if con and part is None)
    assert sum(1 for con, part in letters0 if con and part is None) == 0      # masked: split steps only
    backs = [c for c in ex.changes if isinstance(c, SetToken)]
    if script.startswith("abababcd"):
        assert whole >= 2 and not backs                                          # free to the end
    elif "xy" in script:
        assert whole >= 1 and backs                                              # free, refused, set back


@pytest.mark.parametrize("temperature", [0.3, 0.8])
def test_sampled_rows_equal_too(tokenizer, temperature):
    """A temperature row (no top-k / top-p), its noise keyed by its draw index: the same tokens
    with and without unmasked runs, set-backs included (a set-back row draws its refused
    position again with that position's index)."""
    got, ex, _ = _serve(tokenizer, True, "ababcdcdcdabxyabab-7", temperature=temperature)
    want, _, _ = _serve(tokenizer, False, "ababcdcdcdabxyabab-7", temperature=temperature)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert re.fullmatch(REGEX, got[-1].text), got[-1].text


def test_free_run_rule():
    f = FreeRun()
    for _ in range(FreeRun.NEED - 1):
        f.masked(True)
    assert not f.free
    f.masked(False)
    f.masked(True)
    assert not f.free and f.agreed == 1
    for _ in range(FreeRun.NEED - 1):
        f.masked(True)
    assert f.free
    f.refused()
    assert not f.free and f.need == 2 * FreeRun.NEED
    for _ in range(20):
        f.refused()
    assert f.need == FreeRun.NEED_MAX
    f.kept()
    assert f.need == FreeRun.NEED_MAX // 2


def test_which_params_may_run_unmasked():
    so = {"regex": "a+"}
    assert unmasked_ok(SamplingParams(temperature=0, structured_outputs=so))
    assert unmasked_ok(SamplingParams(temperature=0.7, structured_outputs=so))
    assert unmasked_ok(SamplingParams(temperature=0, top_p=0.5, structured_outputs=so))      # greedy anyway
    for bad in (dict(temperature=0.7, top_p=0.9), dict(temperature=0.7, top_k=5), dict(min_p=0.1),
                dict(logprobs=2), dict(presence_penalty=0.5), dict(repetition_penalty=1.2),
                dict(logit_bias={3: 1.0}), dict(bad_words=["x"])):
        assert not unmasked_ok(SamplingParams(**({"temperature": 0} | bad), structured_outputs=so)), bad


def test_allows_and_prefix_agree_with_the_masks(tokenizer, capfd):
    """allows(t) reads the mask fill() wrote last (the one a masked step was drawn under);
    prefix() accepts exactly the tokens those masks allow, in order (xgrammar's mask and, for
    JSON, the control-byte rule), stops at the first refused one (special tokens refused on
    sight, without xgrammar's warning), counts everything after the grammar's end, and leaves
    the matcher where it was."""
    vocab = 400
    table = token_bytes(tokenizer, vocab)
    grammars = Grammars(tokenizer, table, vocab=vocab, eos_ids=[1])
    for so in (StructuredOutputsParams(regex=REGEX), StructuredOutputsParams(json={"type": "object", "properties": {
            "a": {"type": "string"}}, "required": ["a"]})):
        st = grammars.state(grammars.compile(so), so.kind, free=True)
        assert not any(st.allows(t) for t in range(vocab))                 # no mask filled yet
        bits = torch.empty((1, (vocab + 31) // 32), dtype=torch.int32)
        g = torch.Generator().manual_seed(1)
        toks = []
        for _ in range(40):
            st.fill(bits, 0)
            allowed = [(int(bits[0, t >> 5]) >> (t & 31)) & 1 == 1 for t in range(vocab)]
            assert [st.allows(t) for t in range(vocab)] == allowed
            choice = [t for t in range(vocab) if allowed[t]]
            tok = choice[int(torch.randint(len(choice), (1,), generator=g))]
            probe = grammars.state(grammars.compile(so), so.kind, free=True)
            assert probe.prefix(toks + [tok]) == len(toks) + 1                 # what the masks allow
            refused = next(t for t in range(vocab) if not allowed[t])
            assert probe.prefix(toks + [refused]) == len(toks)
            toks.append(tok)
            st.advance([tok])
            if st.done:
                break
        fresh = grammars.state(grammars.compile(so), so.kind, free=True)
        before = torch.empty_like(bits)
        fresh.fill(before, 0)
        assert fresh.prefix(toks) == len(toks)
        assert fresh.prefix(toks + [5, 6, 7]) == len(toks) + 3 if st.done else True
        for special in (0, 5, 390):                                        # bos, a special, past the tokenizer
            assert fresh.prefix([special] + toks) == 0
        after = torch.empty_like(bits)
        fresh.fill(after, 0)
        assert torch.equal(before, after)
    assert "cannot accept" not in capfd.readouterr().err


TINY = dict(device="cpu", backend="reference", max_batch=2, max_model_len=96, page_size=4, steps_per_graph=4)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    pytest.importorskip("transformers")
    from _checkpoints import write
    return write(tmp_path_factory, "free_run", shape="tiny", arch="llama")


@pytest.fixture(scope="module")
def tiny_llm(tiny_path):
    from graphrt import LLM
    return LLM(tiny_path, **TINY)


def test_the_model_runtime_path(tiny_llm):
    """Through LLM on CPU (the runtime's split draw reports its argmax; Activate / SetToken set a
    row back in the real slots): a grammar the random model's greedy output mostly follows (its
    own text, then a forced end), greedy and sampled, beside a free row: the same tokens as the
    always-masked engine's."""
    eng = tiny_llm.engine
    own = tiny_llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].text
    forced = own[:len(own) // 2] + "zz"

    def run(flag, so, temperature):
        eng.FREE_RUN = flag
        ps = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=temperature, seed=3, structured_outputs=so)]
        kinds = []
        inner = eng.runtime.run
        eng.runtime.run = lambda b: kinds.append(b.part) or inner(b)
        try:
            outs = tiny_llm.generate([[1, 2, 3], [5, 6, 7, 8]], ps, use_tqdm=False)
        finally:
            eng.runtime.run = inner
            eng.FREE_RUN = True
        return [o.outputs[0].token_ids for o in outs], kinds
    for so in ({"choice": [forced, "other"]}, {"regex": "[a-z ]{5,60}"}):
        for t in (0.0, 0.9):
            got, kinds = run(True, so, t)
            want, kinds0 = run(False, so, t)
            assert got == want, (so, t)
            if "regex" in so and t == 0:                  # the model's words fit it: unmasked blocks ran
                assert kinds.count(None) > kinds0.count(None), (kinds, kinds0)


def test_a_forward_ahead_is_drawn_only_for_its_own_step():
    """ConstrainedMixin._matching_ahead: the forward launched ahead is taken up only by a split
    step over the same rows at the same epochs with no slot change recorded since (a set-back
    or any other change after it would make its logits stale); otherwise it is dropped."""
    from types import SimpleNamespace
    from graphrt.engine.constrained import ConstrainedMixin, _Ahead
    a, b = SimpleNamespace(epoch=0), SimpleNamespace(epoch=0)
    eng = SimpleNamespace(scheduler=SimpleNamespace(changes=[]))
    match = lambda ahead, rows, split=True: ConstrainedMixin._matching_ahead(eng, ahead, rows, split=split)  # noqa: E731
    ahead = _Ahead(((id(a), 0), (id(b), 0)))
    assert match(ahead, [a, b]) is ahead
    assert match(None, [a, b]) is None
    assert match(ahead, [a, b], split=False) is None                  # a K-step, chunk or speculative block
    assert match(ahead, [a]) is None and match(ahead, [b, a]) is None   # other rows
    b.epoch = 1
    assert match(ahead, [a, b]) is None                               # b set back or preempted since
    b.epoch = 0
    eng.scheduler.changes.append(SetToken(1, 5))
    assert match(ahead, [a, b]) is None                               # a slot change recorded since


def test_a_grammar_check_that_raises_fails_its_request_alone(tokenizer, monkeypatch):
    """One constrained request whose unmasked tokens' check raises (a matcher fault) fails with
    that error while a free request and another constrained one stream on to their ends; the
    engine keeps serving and every page comes back."""
    from graphrt.engine.structured import GrammarState
    prompt = [9, 10]
    ex = ScriptedExecutor(len(tokenizer), _script(tokenizer, "abababcdcdabcdabab-7") + [1], len(prompt))
    eng = Engine(ex, tokenizer, eos_token_ids=(1,), max_model_len=120)
    real = GrammarState.prefix
    victims = []

    def prefix(self, tokens):
        if self is victims[0]:
            raise RuntimeError("matcher fault")
        return real(self, tokens)
    monkeypatch.setattr(GrammarState, "prefix", prefix)
    so = {"regex": REGEX}
    free = eng.add_request([5, 6, 7], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    bad = eng.add_request(prompt, SamplingParams(max_tokens=40, temperature=0, structured_outputs=so))
    good = eng.add_request(prompt, SamplingParams(max_tokens=40, temperature=0, structured_outputs=so))
    eng._drain_inbox()
    victims.append(next(r for r in eng.scheduler.waiting if r.request_id == bad.request_id).grammar)
    for _ in range(400):
        if not eng.step():
            break
    with pytest.raises(RuntimeError, match="matcher fault"):
        bad.result()
    assert len(free.result().outputs[0].token_ids) == 30
    assert re.fullmatch(REGEX, good.result().outputs[0].text)
    a = eng.scheduler.allocator
    assert all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))
    again = eng.add_request(prompt, SamplingParams(max_tokens=40, temperature=0, structured_outputs=so))
    while eng.step():
        pass
    assert re.fullmatch(REGEX, again.result().outputs[0].text)


def _launches(eng, fn):
    """fn()'s result and the (k, rounds, part) of every launch the engine made meanwhile."""
    kinds, inner = [], eng.runtime.run
    eng.runtime.run = lambda b: kinds.append((b.k, b.rounds, b.part)) or inner(b)
    try:
        return fn(), kinds
    finally:
        eng.runtime.run = inner


def test_ngram_speculation_keeps_the_tokens_and_runs_unmasked(tiny_llm, tiny_path):
    """Under n-gram speculation a constrained row's grammar rounds cap its proposals (SetSpecK)
    on rows whose seq_len the device advanced: greedy and sampled constrained output equals the
    engine's without speculation (it once drew from the activation's position after a cap
    changed). With unmasked runs the grammar rounds' raw argmax per verified position moves a
    row that follows its grammar to whole R-round speculative blocks, the same tokens."""
    from graphrt import LLM
    spec = LLM(tiny_path, speculative={"method": "ngram", "num_tokens": 3}, **TINY)
    eng = spec.engine
    assert eng.caps.spec_grammar
    prompts = [[1, 2, 3], [5, 6, 7, 8], [9, 10]]
    for regex in (r"[ -~]{5,60}", r"[a-z ]{5,60}"):
        for t in (0.0, 0.9):
            p = [SamplingParams(max_tokens=16, temperature=t, seed=5, structured_outputs={"regex": regex})] * 3
            want = [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, p, use_tqdm=False)]
            for flag in (False, True):
                eng.FREE_RUN = flag
                try:
                    outs, kinds = _launches(eng, lambda: spec.generate(prompts, p, use_tqdm=False))
                finally:
                    eng.FREE_RUN = True
                assert [o.outputs[0].token_ids for o in outs] == want, (regex, t, flag)
                assert all(re.fullmatch(regex, o.outputs[0].text) for o in outs)
    # one row whose greedy text fits [a-z ]: agreement read from grammar rounds, then R-round blocks
    p = SamplingParams(max_tokens=40, temperature=0, structured_outputs={"regex": "[a-z ]{5,60}"})
    want = tiny_llm.generate([[5, 6, 7, 8]], p, use_tqdm=False)[0].outputs[0].token_ids
    runs = {}
    for flag in (False, True):
        eng.FREE_RUN = flag
        try:
            out, kinds = _launches(eng, lambda: spec.generate([[5, 6, 7, 8]], p, use_tqdm=False)[0].outputs[0])
        finally:
            eng.FREE_RUN = True
        assert out.token_ids == want, flag
        runs[flag] = sum(1 for k, rounds, _ in kinds if k and rounds is None)
    assert runs[True] > runs[False], runs
