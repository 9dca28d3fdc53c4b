"""SpeculativeConfig: defaults, the dict form of LLM(speculative=...), and every bad field."""
from __future__ import annotations

import dataclasses

import pytest

from graphrt.speculative import SpeculativeConfig


def test_defaults_and_dict_form():
    c = SpeculativeConfig()
    assert (c.method, c.num_tokens, c.query_len) == ("ngram", 4, 5)
    d = SpeculativeConfig.from_dict({"method": "draft", "model": "/ckpt", "num_tokens": 3})
    assert d.draft_model == "/ckpt" and d.num_tokens == 3
    assert SpeculativeConfig.from_dict(d.to_dict()) == d
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_tokens = 2


@pytest.mark.parametrize("kw,field", [
    (dict(method="eagle"), "method"), (dict(num_tokens=0), "num_tokens"),
    (dict(num_tokens=16), "num_tokens"), (dict(num_tokens=True), "num_tokens"),
    (dict(num_tokens=2.0), "num_tokens"), (dict(ngram_min=0), "ngram_min"),
    (dict(ngram_min=3, ngram_max=2), "ngram_min"), (dict(ngram_max=17), "ngram_max"),
    (dict(method="draft"), "draft_model"), (dict(method="draft", draft_model=""), "draft_model"),
    (dict(draft_model="/x"), "draft_model"),
])
def test_bad_fields(kw, field):
    with pytest.raises(ValueError, match=f"speculative.{field}"):
        SpeculativeConfig(**kw)


def test_bad_dicts():
    with pytest.raises(ValueError, match="unknown keys"):
        SpeculativeConfig.from_dict({"method": "ngram", "k": 4})
    with pytest.raises(ValueError, match="not both"):
        SpeculativeConfig.from_dict({"method": "draft", "model": "a", "draft_model": "b"})
    with pytest.raises(ValueError, match="expected a dict"):
        SpeculativeConfig.from_dict(["ngram"])
