"""What a request asks for (SamplingParams) and what it gets back (RequestOutput of CompletionOutput).

Both follow vLLM's names, so code written for vLLM's `LLM` runs unchanged where graphrt has the
feature. A vLLM SamplingParams field graphrt does not implement is a ValueError naming it,
unless it is given vLLM's default (that value changes nothing, so it is accepted):
`VLLM_DEFAULTS` lists them; a field defined on the class always wins over that list.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields

MAX_SEED = 2**63 - 1        # seeds are int64 rows on the device
MAX_TEMPERATURE = 1e4       # past this the distribution is uniform to float32 precision anyway
MAX_STOP_STRINGS = 256      # stop strings per request
MAX_STOP_CHARS = 16384      # their total length in characters (the held-back tail is the longest - 1)
MAX_BEST_OF = 128           # samples of one prompt (n, best_of)
MAX_STOP_TOKEN_IDS = 1024   # stop_token_ids per request (each sample builds a set of them on the engine's thread)

# vLLM SamplingParams fields graphrt does not implement (yet), with vLLM's default: accepted
# only at that value (it changes nothing); any other value is a ValueError naming the field.
VLLM_DEFAULTS = {
    "allowed_token_ids": None, "logits_processors": None,
    "truncate_prompt_tokens": None, "guided_decoding": None,
    "skip_special_tokens": True, "spaces_between_special_tokens": True, "detokenize": True,
    "include_stop_str_in_output": False, "extra_args": None,
}
MAX_LOGPROBS = 20           # top alternatives per position (the graphs' captured width)
MAX_LOGIT_BIAS = 64         # logit_bias entries per request
MAX_BAD_WORDS = 64          # bad_words per request
MAX_PENALTY = 2.0           # |presence_penalty|, |frequency_penalty| (OpenAI's range)
MAX_REPETITION_PENALTY = 10.0
MAX_BIAS = 100.0            # |logit_bias value| (OpenAI's range)
MAX_GRAMMAR_CHARS = 65536   # a structured-output constraint's text (schema JSON, regex, EBNF, choices)
MAX_CHOICES = 1024          # structured_outputs.choice entries


def short_repr(value) -> str:
    """repr, cut to 40 characters (a 400-digit int in an error message helps nobody)."""
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def _int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int, got {short_repr(value)}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}: must be in [{lo}, {hi if hi is not None else 'inf'}], got {short_repr(value)}")
    return value


def _finite(v) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:                              # an int past float's range
        return False


def _is_default(value, default) -> bool:
    if default is None or isinstance(default, bool):
        return value is default
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == default


def _vllm_names(cls):
    """Class decorator: the dataclass's __init__ behind a check of the keyword names. A name
    that is a field passes; a VLLM_DEFAULTS name at its default is dropped; any other name is a
    ValueError naming it (not the bare TypeError of an unexpected keyword)."""
    init, own = cls.__init__, {f.name for f in fields(cls)}

    @functools.wraps(init)
    def __init__(self, **kwargs):
        for name in [k for k in kwargs if k not in own]:
            if name not in VLLM_DEFAULTS:
                raise ValueError(f"{name}: not a SamplingParams field (fields: {', '.join(sorted(own))})")
            value, default = kwargs.pop(name), VLLM_DEFAULTS[name]
            if not _is_default(value, default):
                raise ValueError(f"{name}: not supported by graphrt yet (got {short_repr(value)}; only "
                                 f"vLLM's default {default!r} is accepted)")
        init(self, **kwargs)

    cls.__init__ = __init__
    return cls


@dataclass(frozen=True, kw_only=True)
class StructuredOutputsParams:
    """A constraint on the output's text (vLLM's StructuredOutputsParams); exactly one of:
    json: a JSON schema (a dict, or its JSON text); regex: a regular expression the whole output
    matches; choice: the output is one of these strings; grammar: an EBNF grammar (xgrammar's
    GBNF dialect, root rule `root`); json_object=True: any JSON object. At most
    MAX_GRAMMAR_CHARS characters of constraint text. Validated on construction (ValueError
    naming `structured_outputs.<field>`); whether the constraint compiles is checked when the
    request is added (engine/structured.py)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self):
        import json as _json
        given = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs: give exactly one of json, regex, choice, grammar, "
                             f"json_object, got {', '.join(given) or 'none'}")
        if self.json is not None:
            if isinstance(self.json, dict):
                text = _json.dumps(self.json)
            elif isinstance(self.json, str):
                try:
                    obj = _json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json: not valid JSON: {e}") from None
                if not isinstance(obj, (dict, bool)):
                    raise ValueError("structured_outputs.json: a JSON schema is an object")
                text = self.json
            else:
                raise ValueError(f"structured_outputs.json: expected a schema (dict or JSON text), got "
                                 f"{type(self.json).__name__}")
            _size("json", len(text))
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None:
                if not isinstance(v, str) or not v:
                    raise ValueError(f"structured_outputs.{name}: expected a non-empty string, got {short_repr(v)}")
                _size(name, len(v))
        if self.choice is not None:
            c = self.choice
            if not isinstance(c, (list, tuple)) or not c or not all(isinstance(x, str) and x for x in c):
                raise ValueError(f"structured_outputs.choice: expected a non-empty list of non-empty strings, "
                                 f"got {short_repr(c)}")
            if len(c) > MAX_CHOICES:
                raise ValueError(f"structured_outputs.choice: at most {MAX_CHOICES} choices, got {len(c)}")
            _size("choice", sum(map(len, c)))
            object.__setattr__(self, "choice", tuple(c))
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object: expected true, got {short_repr(self.json_object)}")

    @property
    def kind(self) -> str:
        """Which constraint: "json" | "regex" | "choice" | "grammar" | "json_object"."""
        return next(f.name for f in fields(self) if getattr(self, f.name) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): the compiled-grammar cache's key."""
        import json as _json
        kind, v = self.kind, getattr(self, self.kind)
        if kind == "json":
            v = _json.dumps(v if isinstance(v, dict) else _json.loads(v), sort_keys=True)
        elif kind == "choice":
            v = _json.dumps(list(v))
        elif kind == "json_object":
            v = ""
        return kind, v


def _size(name: str, n: int) -> None:
    if n > MAX_GRAMMAR_CHARS:
        raise ValueError(f"structured_outputs.{name}: {n} characters, at most {MAX_GRAMMAR_CHARS}")


@_vllm_names
@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request generation settings (vLLM's names and defaults); validated on construction.

    max_tokens >= 1; temperature in [0, MAX_TEMPERATURE] (0 = greedy); top_k 0 or -1 = off,
    else >= 1 (the engine clamps it to the vocabulary: the same distribution); top_p in
    (0, 1]; seed None (the engine draws one) or an int in [0, 2**63); stop: strings that end
    the output (not included in its text), at most MAX_STOP_STRINGS of them and MAX_STOP_CHARS
    characters in all; stop_token_ids: ids that end it (kept in token_ids), at most MAX_STOP_TOKEN_IDS;
    ignore_eos: do not stop at the model's end-of-sequence ids.

    Log-probabilities (RequestOutput.logprobs / .prompt_logprobs): logprobs None (off) or n in
    [0, MAX_LOGPROBS]: each generated token's log-probability and its top n alternatives;
    prompt_logprobs the same for every prompt token after the first (computed from the prefill).
    Logits processing, applied in this order to the model's float32 logits of every draw:
    repetition_penalty in (0, MAX_REPETITION_PENALTY] (1 = off; HF's rule over prompt + output
    tokens: a positive logit divided by it, a negative one multiplied), presence_penalty and
    frequency_penalty in [-2, 2] (OpenAI's rule over output tokens: logit -= presence * (count > 0)
    + frequency * count), logit_bias {token id: value in [-100, 100]} (at most MAX_LOGIT_BIAS,
    added), bad_words (at most MAX_BAD_WORDS strings, each one token: that token is never drawn),
    min_tokens in [0, max_tokens] (stop_token_ids and end-of-sequence ids are not drawn before
    min_tokens tokens), then temperature, min_p in [0, 1] (sampled rows: tokens whose probability
    is under min_p times the largest are dropped), top_k, top_p.

    n: completions returned for the prompt; best_of (None = n): completions generated, of which
    the n with the highest cumulative log-probability are returned (best_of > n runs the
    samples with logprobs=0 when logprobs is None; it cannot be streamed). The prompt is prefilled once and
    its KV pages shared (engine/group.py); with a seed, completion i uses seed + i (vLLM's rule),
    so it equals SamplingParams(n=1, seed=seed + i) alone; n > 1 needs temperature > 0 unless
    the completions should be identical.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict | None = None
    min_tokens: int = 0
    bad_words: tuple[str, ...] = ()
    # ---- n > 1 (engine/group.py): pure API, no per-token processing ----
    n: int = 1
    best_of: int | None = None
    # ---- constrained decoding (engine/structured.py) ----
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        _int("n", self.n, 1, MAX_BEST_OF)
        if self.best_of is not None:
            _int("best_of", self.best_of, 1, MAX_BEST_OF)
            if self.best_of < self.n:
                raise ValueError(f"best_of: must be >= n={self.n}, got {self.best_of}")
        _int("max_tokens", self.max_tokens, 1)
        _int("top_k", self.top_k, -1)
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
                raise ValueError(f"{name}: expected a finite number, got {short_repr(v)}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature: must be <= {MAX_TEMPERATURE:g}, got {self.temperature:g}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _int("seed", self.seed, 0, MAX_SEED)
            if self.seed + self.samples - 1 > MAX_SEED:
                raise ValueError(f"seed: completion i uses seed + i, so seed must be <= {MAX_SEED} - "
                                 f"{self.samples - 1} for best_of={self.samples}, got {short_repr(self.seed)}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if isinstance(stop, (list, tuple)) and len(stop) > MAX_STOP_STRINGS:   # before looking at each
            raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop: expected a non-empty string or a list of them, got {short_repr(self.stop)}")
        chars = sum(map(len, stop))
        if chars > MAX_STOP_CHARS:
            raise ValueError(f"stop: at most {MAX_STOP_CHARS} characters in all, got {chars}")
        object.__setattr__(self, "stop", tuple(stop))
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"stop_token_ids: expected a list of ints, got {short_repr(ids)}")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}")
        object.__setattr__(self, "stop_token_ids", tuple(_int("stop_token_ids", i, 0) for i in ids))
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        self._check_processing()

    def _check_processing(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _int(name, getattr(self, name), 0, MAX_LOGPROBS)
        for name, lo, hi in (("presence_penalty", -MAX_PENALTY, MAX_PENALTY),
                             ("frequency_penalty", -MAX_PENALTY, MAX_PENALTY),
                             ("repetition_penalty", 0.0, MAX_REPETITION_PENALTY), ("min_p", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
                raise ValueError(f"{name}: expected a finite number, got {short_repr(v)}")
            if not lo <= v <= hi or (name == "repetition_penalty" and v == 0):
                raise ValueError(f"{name}: must be in {'(' if name == 'repetition_penalty' else '['}"
                                 f"{lo:g}, {hi:g}], got {v}")
        _int("min_tokens", self.min_tokens, 0, self.max_tokens)
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, dict):
                raise ValueError(f"logit_bias: expected a dict {{token id: bias}}, got {short_repr(bias)}")
            if len(bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
            for tok, v in bias.items():
                _int("logit_bias", tok, 0)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) \
                        or abs(v) > MAX_BIAS:
                    raise ValueError(f"logit_bias: values must be numbers in [-{MAX_BIAS:g}, {MAX_BIAS:g}], "
                                     f"got {short_repr(v)} for token {tok}")
            object.__setattr__(self, "logit_bias", {int(t): float(v) for t, v in bias.items()} or None)
        words = (self.bad_words,) if isinstance(self.bad_words, str) else self.bad_words
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) and w for w in words):
            raise ValueError(f"bad_words: expected a list of non-empty strings, got {short_repr(self.bad_words)}")
        if len(words) > MAX_BAD_WORDS:
            raise ValueError(f"bad_words: at most {MAX_BAD_WORDS} words, got {len(words)}")
        object.__setattr__(self, "bad_words", tuple(words))
        so = self.structured_outputs
        if isinstance(so, dict):
            unknown = sorted(set(so) - {f.name for f in fields(StructuredOutputsParams)})
            if unknown:
                raise ValueError(f"structured_outputs: unknown field {short_repr(unknown[0])} (fields: json, regex, "
                                 f"choice, grammar, json_object)")
            so = StructuredOutputsParams(**{k: v for k, v in so.items() if v is not None})
            object.__setattr__(self, "structured_outputs", so)
        if so is not None:
            if not isinstance(so, StructuredOutputsParams):
                raise ValueError(f"structured_outputs: expected StructuredOutputsParams, got {type(so).__name__}")
            if self.min_tokens:
                raise ValueError("structured_outputs: not with min_tokens (the grammar decides where the "
                                 "output may end)")
            if self.ignore_eos:
                raise ValueError("structured_outputs: not with ignore_eos (a constrained output ends with an "
                                 "end-of-sequence token once its grammar is complete)")

        object.__setattr__(self, "_processed", self._needs_processing())

    @property
    def processed(self) -> bool:
        """Whether the draws need the logits-processing graphs (penalties, bias, bans, min_p,
        min_tokens, log-probabilities); plain rows keep the cheap greedy / sampled graphs."""
        return self._processed

    def _needs_processing(self) -> bool:
        return (self.logprobs is not None or self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1 or self.min_p > 0 or bool(self.logit_bias)
                or self.min_tokens > 0 or bool(self.bad_words) or self.structured_outputs is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def samples(self) -> int:
        """Completions generated: best_of, or n."""
        return self.n if self.best_of is None else self.best_of


def check_prompt_len(n: int, *, max_tokens: int, max_model_len: int) -> None:
    """ValueError naming the field when a prompt of `n` tokens cannot run in max_model_len:
    `prompt` when it leaves no room to generate, `max_tokens` when that many more do not fit. A
    count alone: the engine checks it on a prompt's ids, the server before it hands a prompt to the
    engine (no pass over ids that cannot run) and on the count its tokenizer process returns in
    place of a long text's ids."""
    if n >= max_model_len:
        raise ValueError(f"prompt: {n} tokens leave no room to generate in max_model_len {max_model_len}")
    if n + max_tokens > max_model_len:
        raise ValueError(f"max_tokens: {max_tokens} + the prompt's {n} tokens exceed max_model_len {max_model_len}")


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability at one position: logprob (natural log), rank (1 = the most
    likely; None where unknown), decoded_token (its text alone)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a request (vLLM's CompletionOutput). index: its place among the
    request's n completions; text / token_ids: the whole output, or in a stream the part new
    since the previous item; finish_reason: None until the last item, then "stop" (a stop
    string, stop token or end-of-sequence), "length" (max_tokens) or "abort" (cancelled);
    stop_reason: the stop token id or stop string that ended it (None for end-of-sequence or
    length). With SamplingParams.logprobs: logprobs holds one dict per token of token_ids,
    {token id: Logprob} (the generated token and the top-n alternatives, vLLM's shape), and
    cumulative_logprob the sum of the generated tokens' log-probabilities so far (the whole
    completion's, also on a stream's deltas); both None otherwise."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def join_deltas(index: int, deltas: list[CompletionOutput]) -> CompletionOutput:
    """One completion's deltas, in order, as the whole completion `index` (text, ids and
    logprobs concatenated once: appending each delta to a running total copies it again per
    delta, O(length^2); the latest cumulative / finish / stop)."""
    ids, entries = [], None
    for d in deltas:
        ids += d.token_ids
        if d.logprobs is not None:
            entries = [] if entries is None else entries
            entries += d.logprobs
    last = deltas[-1] if deltas else CompletionOutput(index)
    cumulative = next((d.cumulative_logprob for d in reversed(deltas) if d.cumulative_logprob is not None), None)
    return CompletionOutput(index, "".join(d.text for d in deltas), ids, cumulative, entries,
                            last.finish_reason, last.stop_reason)


class RequestOutput:
    """One request's result (vLLM's RequestOutput): `outputs` holds its completions (n of them,
    by index); in a stream, each item carries the completions that changed, each a delta.

        out.outputs[i].text, out.outputs[i].token_ids, out.outputs[i].finish_reason
        out.prompt (the prompt string, None for token ids), out.prompt_token_ids, out.finished
        out.text, out.token_ids, out.finish_reason     # shortcuts to outputs[0] (n = 1)

    The positional form `RequestOutput(request_id, prompt_token_ids, text, token_ids,
    finish_reason, stop_reason=..., logprobs=...)` builds one completion (index 0), as the
    engine's per-sequence deltas do.
    finished: every completion finished (default: those in `outputs`).
    prompt_logprobs (with SamplingParams.prompt_logprobs; a stream's first item only): one entry
    per prompt token, None for the first. num_cached_tokens: prompt tokens not prefilled because
    their K/V was found in the prefix cache (counted at the first admission; every item has it)."""

    __slots__ = ("request_id", "prompt", "prompt_token_ids", "prompt_logprobs", "outputs", "finished",
                 "num_cached_tokens")

    def __init__(self, request_id: str, prompt_token_ids: list[int], text: str = "",
                 token_ids: list[int] | None = None, finish_reason: str | None = None, *,
                 outputs: list[CompletionOutput] | None = None, prompt: str | None = None,
                 prompt_logprobs: list | None = None, finished: bool | None = None,
                 stop_reason: int | str | None = None, logprobs: list | None = None,
                 cumulative_logprob: float | None = None, num_cached_tokens: int = 0):
        if outputs is None:                       # one completion (every engine delta): finished is its own
            outputs = [CompletionOutput(0, text, [] if token_ids is None else token_ids, cumulative_logprob,
                                        logprobs, finish_reason=finish_reason, stop_reason=stop_reason)]
            if finished is None:
                finished = finish_reason is not None
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.prompt_logprobs, self.outputs, self.num_cached_tokens = prompt_logprobs, outputs, num_cached_tokens
        self.finished = all(o.finished for o in outputs) if finished is None else finished

    # ---- shortcuts to the first completion (the only one with n = 1) ----
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list | None:
        return self.outputs[0].logprobs

    @logprobs.setter
    def logprobs(self, value: list | None) -> None:
        self.outputs[0].logprobs = value

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids!r}, outputs={self.outputs!r}, "
                f"finished={self.finished}, num_cached_tokens={self.num_cached_tokens})")


__all__ = ["SamplingParams", "check_prompt_len", "StructuredOutputsParams", "MAX_GRAMMAR_CHARS", "RequestOutput", "CompletionOutput", "Logprob", "join_deltas", "MAX_TEMPERATURE",
           "MAX_SEED", "MAX_STOP_STRINGS", "MAX_STOP_CHARS", "MAX_STOP_TOKEN_IDS", "MAX_BEST_OF", "MAX_LOGPROBS", "MAX_LOGIT_BIAS",
           "VLLM_DEFAULTS"]
