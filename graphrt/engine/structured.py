"""Constrained decoding on the host: grammars compiled off the engine thread, one matcher per
request, the allowed-token masks filled for the engine to write through its executor
(Executor.write_token_mask -> model/token_mask.py).

    grammars = Grammars(tokenizer, table, vocab=V, eos_ids=(2,))   # one per engine
    compiled = grammars.compile(params.structured_outputs)    # add_request's thread; cached;
                                                              # ValueError naming the field
    fut = grammars.submit(params.structured_outputs)          # the same compile, not waited for
    state = grammars.state(compiled, kind)                    # per request (each of n samples)
    state.advance(tokens)                                     # after a block's tokens are read
    bits, active = fill_masks(reqs, vocab)                    # [m, W] / [m] int32: next masks

Library: xgrammar (GrammarCompiler / GrammarMatcher): the ecosystem's standard (vLLM's and
SGLang's default), installed with graphrt; its bitmask layout is the one the device applies
(kernels/token_mask.py). The vocabulary is the model's logits width (ids past the tokenizer's
are never allowed).

Compilation runs on a small thread pool with a time bound (COMPILE_TIMEOUT_S, from the compile's
submission): a request whose grammar does not compile in time fails alone (ValueError naming the
field; a compile that never started is cancelled, one that runs keeps its worker until it ends
(xgrammar cannot be interrupted) and its result is cached for a later request). `submit` starts
a compile without waiting: a caller that must not hold a thread meanwhile (the HTTP server's
event loop) waits on its Future, then `compile` finds it done or late. Compiled grammars are kept
in an LRU of CACHE_SIZE entries keyed by the constraint's canonical text.

How the engine draws (engine/constrained.py `_split_step`): a block with a constrained row runs ONE
step (the mask changes with every token), in two launches: the step's forward, then its draw.
While the forward runs the host reads the previous step's tokens back, advances each matcher
(`advance`), fills the next masks (`fill_masks`: tens of microseconds on xgrammar's precomputed
per-state masks) and writes them ([m, W] int32, one copy); the draw that follows reads them.
The matcher's work is thus off the device's critical path while it is shorter than a forward.
With overlap and Engine.RUN_AHEAD (off by default: no measured gain), the next step's forward is
launched right after the draw (`_run_ahead`), so the device also runs through the host's loop
between two steps; a prefill drops it (a forward advances no slot: the step never happened).
Under n-gram speculation (engine/constrained.py `_grammar_round`) a block with constrained rows runs
one round instead: each row's predicted proposal is walked by its matcher (`fill_along`: the
masks before each proposal the grammar accepts and after the last, then rolled back) and the
row's proposals are capped at the first one it refuses.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, TimeoutError as FutureTimeout

import torch

from graphrt.engine.params import StructuredOutputsParams

COMPILE_TIMEOUT_S = 10.0     # a grammar compiling longer fails its request (400 over HTTP)
COMPILE_WORKERS = 2
CACHE_SIZE = 256             # compiled grammars kept (LRU)


def _one_line(e: BaseException, limit: int = 200) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


class Grammars:
    """The engine's grammar compiler: xgrammar's TokenizerInfo over the model's vocabulary
    (table: each id's bytes, engine/token_bytes.py, b"" for special tokens, which a grammar never
    allows; None: xgrammar reads a transformers tokenizer itself; vocab: the logits width;
    eos_ids: the ids that end an output once the grammar is complete), a compile pool and an
    LRU of compiled grammars. Thread-safe. ValueError when the tokenizer is of a kind neither
    path reads."""

    def __init__(self, tokenizer, table: list[bytes] | None, *, vocab: int, eos_ids,
                 timeout_s: float = COMPILE_TIMEOUT_S):
        try:
            import xgrammar as xgr
        except ImportError:
            raise ValueError("structured_outputs: needs the xgrammar package (pip install "
                             "'graphrt[structured]')") from None
        self._xgr = xgr
        if table is not None:
            info = xgr.TokenizerInfo(table, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=list(eos_ids))
        else:
            try:
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=list(eos_ids))
            except ValueError as e:
                raise ValueError(f"structured_outputs: not supported for this tokenizer ({_one_line(e)})") from None
        self.vocab, self.timeout_s = vocab, timeout_s
        # ids the matcher never accepts (special tokens but the stop ids, ids past the tokenizer's):
        # unmasked tokens are refused on sight (xgrammar warns on each one it is given)
        self._never = frozenset(info.special_token_ids) - frozenset(info.stop_token_ids)
        self.words = (vocab + 31) // 32
        # JSON forbids raw control characters (U+0000..U+001F) in strings, which xgrammar's JSON
        # grammar lets through; compact JSON has none outside strings either: JSON constraints
        # also ban every token holding such a byte ([W] int32, the same bit layout)
        self._json_bits = _without_control_bytes(table, vocab) if table is not None else None
        self._json_ok = None                          # the same as a list of bools (unmasked runs)
        self._compiler = xgr.GrammarCompiler(info, max_threads=COMPILE_WORKERS, cache_enabled=False)
        self._pool = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="graphrt-grammar")
        self._cache: OrderedDict = OrderedDict()      # key -> (Future[CompiledGrammar], monotonic start)
        self._lock = threading.Lock()

    def submit(self, so: StructuredOutputsParams) -> Future:
        """`so`'s compile, without waiting: started now, or the one already started (cached)."""
        return self._entry(so)[0]

    def _entry(self, so: StructuredOutputsParams) -> tuple[Future, float]:
        key = so.key
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = (self._pool.submit(self._compile, so), time.monotonic())
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        return entry

    def compile(self, so: StructuredOutputsParams, *, field: str = "structured_outputs"):
        """The compiled grammar of `so` (cached). ValueError naming `field` (and the constraint's
        kind) when it is malformed, unsupported, or did not compile within timeout_s of its
        compile's start (a caller that already waited for it, e.g. on an event loop, waits no more;
        one that never started by then is cancelled: a backlog of slow grammars is not kept)."""
        fut, started = self._entry(so)
        name = field if field != "structured_outputs" else f"structured_outputs.{so.kind}"
        late = ValueError(f"{name}: the grammar did not compile within {self.timeout_s:g} s")
        try:
            return fut.result(timeout=max(0.0, started + self.timeout_s - time.monotonic()))
        except (FutureTimeout, CancelledError):
            if fut.cancel():
                self._forget(so.key, fut)
            raise late from None
        except Exception as e:
            self._forget(so.key, fut)                 # not cached: a failure is cheap to repeat
            raise ValueError(f"{name}: {_one_line(e)}") from None

    def _forget(self, key, fut: Future) -> None:
        with self._lock:
            if key in self._cache and self._cache[key][0] is fut:
                del self._cache[key]

    def _compile(self, so: StructuredOutputsParams):
        c, kind = self._compiler, so.kind
        if kind == "json":
            schema = so.json if isinstance(so.json, str) else json.dumps(so.json)
            return c.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
        if kind == "json_object":
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if kind == "regex":
            return c.compile_regex(so.regex)
        if kind == "choice":
            return c.compile_grammar("root ::= " + " | ".join(json.dumps(x) for x in so.choice))
        return c.compile_grammar(so.grammar)

    def state(self, compiled, kind: str = "", *, free: bool = False) -> "GrammarState":
        """A fresh matcher over `compiled` (kind: the constraint's, StructuredOutputsParams.kind;
        free: the request's row may decode unmasked once its model agrees with its grammar,
        FreeRun: see `unmasked_ok`)."""
        extra = self._json_bits if kind in ("json", "json_object") else None
        ok = None
        if free and extra is not None:                # per-token checks of unmasked tokens: built once
            with self._lock:
                if self._json_ok is None:
                    self._json_ok = _bit_list(extra)
            ok = self._json_ok
        return GrammarState(self._xgr, compiled, self.words, extra, free=FreeRun() if free else None, extra_ok=ok,
                            never=self._never)


def unmasked_ok(params) -> bool:
    """Whether a constrained request's row may decode unmasked (FreeRun): its tokens are then
    exactly the masked ones wherever its grammar accepts them. True when the draw is the argmax
    (greedy), or a plain temperature draw (the sampler's Gumbel-max over all tokens picks an
    allowed token exactly when the masked draw, with the same noise, picks the same one), and
    nothing else reads the unmasked logits or depends on discarded tokens: no top-k / top-p /
    min_p (they renormalise over what the mask leaves), log-probabilities, penalties, logit
    bias, bad words or min_tokens (SamplingParams.processed but for the constraint)."""
    p = params
    plain = p.greedy or (p.top_k <= 0 and p.top_p >= 1.0)
    return (plain and p.logprobs is None and p.presence_penalty == 0 and p.frequency_penalty == 0
            and p.repetition_penalty == 1 and p.min_p <= 0 and not p.logit_bias and not p.bad_words
            and p.min_tokens == 0)


class FreeRun:
    """When a constrained row decodes unmasked (host; one per eligible request).

    Masked (split steps, one token a step), each step's raw argmax is checked against the mask it
    was drawn under (`GrammarState.allows`): after `need` steps in a row whose argmax the grammar
    allowed, the row runs free: whole K-step blocks with no mask, no split launches, beside the
    other rows; its matcher then checks each block's tokens (`GrammarState.prefix`), keeps the
    longest prefix the grammar accepts and, at a refused token, the engine sets the row back to
    it (its tokens in flight discarded) and the row draws that position masked. Each refusal
    doubles `need` (NEED .. NEED_MAX), so a model that keeps straying from its grammar stays
    masked; a free block kept whole halves it again."""

    NEED, NEED_MAX = 4, 256

    def __init__(self):
        self.free = False
        self.need = self.NEED
        self.agreed = 0                       # masked steps in a row whose argmax was allowed

    def masked(self, agreed: bool) -> None:
        """A masked step's token read back; agreed: its raw argmax was allowed."""
        self.agreed = self.agreed + 1 if agreed else 0
        if self.agreed >= self.need:
            self.free = True

    def kept(self) -> None:
        """A free block's tokens were all accepted."""
        self.need = max(self.NEED, self.need // 2)

    def refused(self) -> None:
        """A free block's token was refused: masked again, for longer before the next try."""
        self.free, self.agreed = False, 0
        self.need = min(self.NEED_MAX, self.need * 2)


def _bit_list(bits: torch.Tensor) -> list[bool]:
    """[W] int32 bits -> a list of 32 W bools (token t allowed), for per-token checks."""
    words = bits.to(torch.int64) & 0xFFFFFFFF
    return ((words[:, None] >> torch.arange(32)) & 1).view(-1).bool().tolist()


def _without_control_bytes(table: list[bytes], vocab: int) -> torch.Tensor:
    """[ceil(vocab / 32)] int32: bit t set unless token t's bytes hold one below 0x20."""
    ok = torch.tensor([not any(b < 0x20 for b in tok) for tok in table] + [False] * (vocab - len(table)),
                      dtype=torch.int64)
    words = (vocab + 31) // 32
    ok = torch.nn.functional.pad(ok, (0, words * 32 - vocab)).view(words, 32)
    packed = (ok << torch.arange(32, dtype=torch.int64)).sum(1)                   # [W] in [0, 2**32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


class GrammarState:
    """One request's matcher over its compiled grammar (host); `failed` once a token was refused
    (the mask makes that impossible unless a logit_bias banned every allowed token)."""

    def __init__(self, xgr, compiled, words: int, extra: torch.Tensor | None = None, *,
                 free: FreeRun | None = None, extra_ok: list | None = None, never: frozenset = frozenset()):
        self.matcher = xgr.GrammarMatcher(compiled)
        self.words, self.extra = words, extra  # extra: [W] int32 bits AND-ed into every mask
        self.accepted = 0                     # tokens the matcher has taken
        self.free = free                      # FreeRun, or None: always masked
        self._extra_ok = extra_ok             # `extra` as [V] bools (built on first use when not given)
        self._never = never                   # ids the matcher never accepts (Grammars._never)
        self._bits: torch.Tensor | None = None    # [W] int32: the mask `fill` wrote last
        self._along: torch.Tensor | None = None   # [j + 1, W] int32: the masks `fill_along` wrote last

    @property
    def unmasked(self) -> bool:
        """Whether the row's next block runs unmasked (FreeRun)."""
        return self.free is not None and self.free.free

    def allows(self, token: int, position: int | None = None) -> bool:
        """Whether the mask `fill` wrote last allows `token` (a masked step's raw argmax, read
        back before the matcher takes the step's token: the mask it was drawn under); position j:
        the mask of verified position j that `fill_along` wrote last (a grammar-checked round's,
        j <= the proposals it kept)."""
        bits = self._bits if position is None else (self._along[position] if self._along is not None
                                                    and position < len(self._along) else None)
        return bits is not None and (int(bits[token >> 5]) >> (token & 31)) & 1 == 1

    def prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` (an unmasked block's, in order) the grammar accepts before the
        first it refuses (all of them when it ends meanwhile: the tokens after its end are the
        request's stop and beyond). The matcher ends where it began."""
        m, ok, j, ended = self.matcher, self._ok(), 0, False
        for t in tokens:
            if m.is_terminated():
                ended = True
                break
            if t in self._never or (ok is not None and not ok[t]) or not m.accept_token(t):
                break
            j += 1
        if j:
            m.rollback(j)
        return len(tokens) if ended else j

    def _ok(self) -> list | None:
        if self._extra_ok is None and self.extra is not None:
            self._extra_ok = _bit_list(self.extra)
        return self._extra_ok

    def advance(self, tokens: list[int]) -> None:
        """Feed the request's new tokens; ValueError when the grammar refuses one."""
        m = self.matcher
        for t in tokens:
            if m.is_terminated():
                return                        # tokens after the end-of-sequence: the request stops
            if not m.accept_token(t):
                raise ValueError(f"structured_outputs: token {t} refused by the grammar after "
                                 f"{self.accepted} tokens")
            self.accepted += 1

    def fill(self, out: torch.Tensor, row: int) -> None:
        """out[row] <- the next token's allowed-token bits (out: [m, W] int32 CPU). A terminated
        matcher allows only its stop tokens (xgrammar's rule)."""
        self.matcher.fill_next_token_bitmask(out, row)
        if self.extra is not None:
            out[row].bitwise_and_(self.extra)
        self._bits = out[row]

    def fill_along(self, drafts: list[int], out: torch.Tensor) -> int:
        """Speculation: the masks along proposed tokens -> j, how many of them the grammar
        accepts (those after the first it refuses are dropped). out [>= j + 1, W] int32 CPU:
        row i <- the mask before drafts[i] (i < j), row j <- the mask after the j accepted ones
        (the next token's: a rejection's or the bonus draw's); rows past j untouched. The
        matcher ends where it began (rolled back)."""
        m, j = self.matcher, 0
        for t in drafts:
            self.fill(out, j)
            if m.is_terminated() or not (int(out[j, t >> 5]) >> (t & 31)) & 1 or not m.accept_token(t):
                break
            j += 1
        else:
            self.fill(out, j)
        if j:
            m.rollback(j)
        self._along = out[:j + 1]             # the round's masks (`allows` at a position)
        return j

    @property
    def done(self) -> bool:
        return self.matcher.is_terminated()


def fill_masks(reqs, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token masks of `reqs` (requests: `.grammar` a GrammarState or None) -> (bits
    [m, W] int32, active [m] int32), CPU: a constrained request's row filled by its matcher and
    flag 1, any other request's row all ones and flag 0 (vocab: the model's logits width). The
    engine writes them through its executor (Executor.write_token_mask)."""
    bits = torch.full((len(reqs), (vocab + 31) // 32), -1, dtype=torch.int32)
    active = torch.zeros(len(reqs), dtype=torch.int32)
    for i, r in enumerate(reqs):
        if r.grammar is not None:
            r.grammar.fill(bits, i)
            active[i] = 1
    return bits, active


__all__ = ["Grammars", "GrammarState", "FreeRun", "unmasked_ok", "fill_masks", "COMPILE_TIMEOUT_S", "CACHE_SIZE"]
