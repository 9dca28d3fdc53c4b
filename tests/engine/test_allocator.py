"""engine/allocator.py: pages are never handed out twice, double frees are refused, all come back."""
from __future__ import annotations

import random

import pytest

from graphrt.engine.allocator import PageAllocator


def test_random_allocate_free_never_hands_a_page_out_twice():
    rng = random.Random(0)
    alloc = PageAllocator(40)
    held: list[list[int]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            alloc.free(held.pop(rng.randrange(len(held))))
        else:
            n = rng.randint(0, 9)
            got = alloc.allocate(n)
            owned = sum(len(h) for h in held)
            if got is None:
                assert n > 40 - owned and alloc.num_free == 40 - owned   # refused: nothing taken
            else:
                held.append(got)
        flat = [p for h in held for p in h]
        assert len(flat) == len(set(flat)) and all(0 <= p < 40 for p in flat)
        assert alloc.num_free == 40 - len(flat)
    for h in held:
        alloc.free(h)
    assert alloc.num_free == 40


def test_double_free_and_bad_pages_are_refused_without_freeing():
    alloc = PageAllocator(4)
    a = alloc.allocate(2)
    alloc.free(a)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(a)
    b = alloc.allocate(3)
    with pytest.raises(ValueError, match="double free"):
        alloc.free([b[0], b[0]])
    with pytest.raises(ValueError, match="outside the pool"):
        alloc.free([b[1], 4])
    assert alloc.num_free == 1                      # nothing was freed by the refused calls
    with pytest.raises(ValueError, match="pages"):
        alloc.allocate(5)
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(0)
