"""Start-up objects out of the garbage collector's way.

A full (generation 2) collection walks every tracked Python object. After start-up that is
every module, class and function of torch (and of transformers where it was imported), about
200 thousand objects: one collection takes 100-250 ms, and it falls inside whatever call
allocated the object that crossed the threshold, such as a prefill (a first long prompt with
the prefix cache on measured 250-300 ms against 25 ms afterwards). `freeze_heap()` moves every
object alive at that moment into the permanent generation (`gc.freeze`), so later collections
walk only what serving creates (requests, their pages' hashes, outputs). It does not collect
first: a collection at start-up would cost the same 100-250 ms, and the start-up garbage it would
free is small and allocated once.
"""
from __future__ import annotations

import gc


def freeze_heap() -> int:
    """gc.freeze() the objects alive now (called when LLM() is ready and in each worker rank
    before it serves) -> how many objects the permanent generation holds."""
    gc.freeze()
    return gc.get_freeze_count()


__all__ = ["freeze_heap"]
