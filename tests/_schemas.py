"""Test helper: random JSON schemas of varied features (nested objects, arrays with bounds, enums,
patterns, optional fields, anyOf, bounded numbers, consts, nulls) for the structured-output tests.

    from _schemas import random_object
    schema = random_object(random.Random(0))      # a dict: {"type": "object", ...}
"""
from __future__ import annotations

import random


def _leaf(rng: random.Random, depth: int):
    kind = rng.choice(["int", "num", "str", "bool", "enum", "pattern", "const", "null"]
                      + (["obj", "arr", "anyof"] if depth < 2 else []))
    if kind == "int":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "num":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if kind == "str":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 8)}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "x y", "a\"b", "ü", "1"], rng.randint(1, 4))}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice([r"^[a-z]{2,5}$", r"^\d{3}-\d{2}$", r"^(ab|cd)+x$",
                                                         r"^[A-F0-9]{4}$"])}
    if kind == "const":
        return {"const": rng.choice(["k", 7, True])}
    if kind == "null":
        return {"type": "null"}
    if kind == "obj":
        return random_object(rng, depth + 1)
    if kind == "arr":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": _leaf(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 3)}
    return {"anyOf": [_leaf(rng, depth + 1) for _ in range(rng.randint(2, 3))]}


def random_object(rng: random.Random, depth: int = 0) -> dict:
    names = rng.sample(["id", "name", "tags", "price", "ok", "sub", "n", "kind", "when", "meta"], rng.randint(1, 4))
    props = {n: _leaf(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.6]         # the rest optional
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
