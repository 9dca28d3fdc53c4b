"""The speculative-decoding configuration: a frozen dataclass, validated on construction.

    SpeculativeConfig(method="ngram", num_tokens=4)                 # prompt lookup on the device
    SpeculativeConfig(method="draft", num_tokens=4, draft_model=DIR)  # a smaller checkpoint
    SpeculativeConfig(method="eagle3", num_tokens=4, draft_model=DIR)  # an EAGLE-3 head directory
    SpeculativeConfig.from_dict({"method": "ngram", "num_tokens": 4})  # the LLM(speculative=...) form
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

METHODS = ("ngram", "draft", "eagle3")
MAX_NUM_TOKENS = 15       # k + 1 query tokens per request must fit the verify kernel's tile (16)
MAX_NGRAM = 16


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"speculative.{name}: must be an int in [{lo}, {hi}], got {value!r}")
    return value


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: "ngram" (prompt lookup over the request's own tokens), "draft" (draft_model) or
    "eagle3" (an EAGLE-3 head reading the target's hidden states, draft_model);
    num_tokens: k, tokens proposed per round (the target verifies k + 1 per request);
    ngram_min / ngram_max: the n-gram lengths tried, longest first; draft_model: checkpoint
    directory of the draft model or the EAGLE-3 head (methods "draft" / "eagle3" only; same
    tokenizer as the target)."""

    method: str = "ngram"
    num_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative.method: must be one of {METHODS}, got {self.method!r}")
        _int("num_tokens", self.num_tokens, 1, MAX_NUM_TOKENS)
        _int("ngram_min", self.ngram_min, 1, MAX_NGRAM)
        _int("ngram_max", self.ngram_max, 1, MAX_NGRAM)
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"speculative.ngram_min: {self.ngram_min} exceeds ngram_max="
                             f"{self.ngram_max}")
        if self.method in ("draft", "eagle3"):
            if not isinstance(self.draft_model, str) or not self.draft_model:
                raise ValueError(f"speculative.draft_model: method {self.method!r} needs a checkpoint "
                                 f"directory, got {self.draft_model!r}")
        elif self.draft_model is not None:
            raise ValueError(f"speculative.draft_model: only used with methods 'draft' and 'eagle3', got "
                             f"{self.draft_model!r} with method {self.method!r}")

    @property
    def query_len(self) -> int:
        """Query tokens per request in a verify forward: the current token + k proposals."""
        return self.num_tokens + 1

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpeculativeConfig":
        """From a mapping; "model" is accepted as an alias of draft_model (the API's spelling)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"speculative: expected a dict, got {type(data).__name__}")
        data = dict(data)
        if "model" in data:
            if "draft_model" in data:
                raise ValueError("speculative.model: give 'model' or 'draft_model', not both")
            data["draft_model"] = data.pop("model")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"speculative: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


__all__ = ["SpeculativeConfig", "METHODS", "MAX_NUM_TOKENS"]
