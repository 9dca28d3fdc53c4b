"""What a request asks for (SamplingParams) and what it gets back (RequestOutput)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_SEED = 2**63 - 1        # seeds are int64 rows on the device
MAX_TEMPERATURE = 1e4       # past this the distribution is uniform to float32 precision anyway
MAX_STOP_STRINGS = 256      # stop strings per request
MAX_STOP_CHARS = 16384      # their total length in characters (the held-back tail is the longest - 1)


def _short(value) -> str:
    """repr, cut to 40 characters (a 400-digit int in an error message helps nobody)."""
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def _int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int, got {_short(value)}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}: must be in [{lo}, {hi if hi is not None else 'inf'}], got {_short(value)}")
    return value


def _finite(v) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:                              # an int past float's range
        return False


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request generation settings (vLLM's names and defaults); validated on construction.

    max_tokens >= 1; temperature in [0, MAX_TEMPERATURE] (0 = greedy); top_k 0 or -1 = off,
    else >= 1 (the engine clamps it to the vocabulary: the same distribution); top_p in
    (0, 1]; seed None (the engine draws one) or an int in [0, 2**63); stop: strings that end
    the output (not included in its text), at most MAX_STOP_STRINGS of them and MAX_STOP_CHARS
    characters in all; stop_token_ids: ids that end it (kept in token_ids);
    ignore_eos: do not stop at the model's end-of-sequence ids.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        _int("max_tokens", self.max_tokens, 1)
        _int("top_k", self.top_k, -1)
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
                raise ValueError(f"{name}: expected a finite number, got {_short(v)}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature: must be <= {MAX_TEMPERATURE:g}, got {self.temperature:g}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _int("seed", self.seed, 0, MAX_SEED)
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if isinstance(stop, (list, tuple)) and len(stop) > MAX_STOP_STRINGS:   # before looking at each
            raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop: expected a non-empty string or a list of them, got {_short(self.stop)}")
        chars = sum(map(len, stop))
        if chars > MAX_STOP_CHARS:
            raise ValueError(f"stop: at most {MAX_STOP_CHARS} characters in all, got {chars}")
        object.__setattr__(self, "stop", tuple(stop))
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"stop_token_ids: expected a list of ints, got {ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(_int("stop_token_ids", i, 0) for i in ids))
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


@dataclass
class RequestOutput:
    """One request's result. In a stream, each item carries the new text / token_ids since the
    previous item (a delta); `finish_reason` is None until the last: "stop" (a stop string, stop
    token or end-of-sequence), "length" (max_tokens) or "abort" (cancelled). num_cached_tokens:
    prompt tokens not prefilled because their K/V was found in the prefix cache (counted at the
    request's first admission; every item carries it)."""

    request_id: str
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0        # prompt tokens whose K/V came from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


__all__ = ["SamplingParams", "RequestOutput", "MAX_TEMPERATURE", "MAX_SEED", "MAX_STOP_STRINGS", "MAX_STOP_CHARS"]
