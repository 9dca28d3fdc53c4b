"""Decode plans measured at one start and taken as given by a later one: split-K and K.

    plans = mrt.measured_plans()     # {"splitk": {"1": [1, 2], "4": [1, 1]}, "steps": {"k": 4, "step_us": 812.3}}
    ModelRuntime(..., plans=plans)   # capture() uses them instead of measuring (source "cached")

ModelRuntime.capture measures two choices on CUDA before its first graph: the split-K factors of
the o / down GEMMs per decode bucket (model/splitk.py, about 0.5 s) and, with
steps_per_graph="auto", K from the timed bucket-1 step (model/steps.py). Measured again at every
start they cost start-up time, and where two choices are close they can differ from one start to
the next (another summation order, so greedy output can differ at a near-tie). A model's graph
cache keeps what its capture measured (`graphrt-capture --model`: the manifest's "plans"), and
`graphrt serve --graph-cache` starts from them: the cache is pinned to the checkpoint, the engine
settings, the library versions and the GPU, which are what the measurement depends on.

A plan is used only for what it was measured for: split-K when the setting is "auto" and its
table covers exactly the buckets this runtime would measure; K when steps_per_graph is "auto".
Anything else is measured as usual (and logged). Pure host code; ValueError names the field of a malformed plan.
"""
from __future__ import annotations

import math

SPLITS = (1, 2, 4)


def check_plans(plans) -> dict:
    """A plans dict (JSON's types: string keys) -> {"splitk": {rows: (S_o, S_down)} or None,
    "steps": (k, step_us) or None}; None -> both None. ValueError naming the field."""
    if plans is None:
        return {"splitk": None, "steps": None}
    if not isinstance(plans, dict) or set(plans) - {"splitk", "steps"}:
        raise ValueError(f"plans: expected a dict with 'splitk' and / or 'steps', got {plans!r}")
    out = {"splitk": None, "steps": None}
    table = plans.get("splitk")
    if table is not None:
        if not isinstance(table, dict) or not table:
            raise ValueError(f"plans.splitk: expected {{rows: [S_o, S_down]}}, got {table!r}")
        out["splitk"] = {}
        for rows, pair in table.items():
            try:
                m = int(rows)
            except (TypeError, ValueError):
                m = 0
            if m < 1 or not isinstance(pair, (list, tuple)) or len(pair) != 2 \
                    or any(isinstance(s, bool) or not isinstance(s, int) or s not in SPLITS for s in pair):
                raise ValueError(f"plans.splitk[{rows!r}]: expected rows >= 1 -> two factors in {SPLITS}, "
                                 f"got {pair!r}")
            out["splitk"][m] = (int(pair[0]), int(pair[1]))
    steps = plans.get("steps")
    if steps is not None:
        k = steps.get("k") if isinstance(steps, dict) and set(steps) == {"k", "step_us"} else None
        us = steps.get("step_us") if isinstance(steps, dict) else None
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or isinstance(us, bool) \
                or not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
            raise ValueError(f"plans.steps: expected {{'k': int >= 1, 'step_us': µs > 0}}, got {steps!r}")
        out["steps"] = (k, float(us))
    return out


def plans_dict(splitk_table: dict | None, steps: tuple[int, float] | None) -> dict:
    """The JSON form of a runtime's measured plans (string keys), omitting what was not measured."""
    out = {}
    if splitk_table is not None:
        out["splitk"] = {str(m): list(pair) for m, pair in sorted(splitk_table.items())}
    if steps is not None:
        out["steps"] = {"k": int(steps[0]), "step_us": round(float(steps[1]), 1)}
    return out


__all__ = ["check_plans", "plans_dict", "SPLITS"]
