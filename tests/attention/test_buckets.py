"""pick_bucket: smallest bucket >= n, against a brute-force oracle."""
from __future__ import annotations

import re

import pytest

from graphrt import BatchTooLargeError, pick_bucket
from graphrt.config import bucket_rule

BUCKET_LISTS = [
    (1,),
    (2,),
    (1, 2, 4, 8),
    (3, 5, 17, 100),
    (1, 7, 8, 9, 64),
    bucket_rule(256),
]
IDS = ["one", "only-2", "pow2", "odd", "dense", "vllm-256"]


def brute(buckets, n):
    return min(b for b in buckets if b >= n)


@pytest.mark.parametrize("buckets", BUCKET_LISTS, ids=IDS)
def test_smallest_bucket_that_fits(buckets):
    for n in range(1, buckets[-1] + 1):
        got = pick_bucket(buckets, n)
        assert got == brute(buckets, n), (buckets, n, got)
        assert got in buckets and got >= n


@pytest.mark.parametrize("buckets", BUCKET_LISTS, ids=IDS)
def test_exact_sizes_pick_themselves(buckets):
    for b in buckets:
        assert pick_bucket(buckets, b) == b


@pytest.mark.parametrize("buckets", BUCKET_LISTS, ids=IDS)
@pytest.mark.parametrize("extra", [1, 2, 1000])
def test_too_large_names_largest_bucket(buckets, extra):
    n = buckets[-1] + extra
    with pytest.raises(BatchTooLargeError, match=rf"batch size {n} exceeds the largest bucket "
                                                 rf"{buckets[-1]}\b") as info:
        pick_bucket(buckets, n)
    assert "buckets" in str(info.value)  # points at the config key to change


@pytest.mark.parametrize("n", [0, -1, -100])
def test_below_one_is_value_error(n):
    with pytest.raises(ValueError, match=re.escape(f"must be >= 1, got {n}")) as info:
        pick_bucket((1, 2, 4), n)
    assert not isinstance(info.value, BatchTooLargeError)


def test_error_hierarchy():
    assert issubclass(BatchTooLargeError, ValueError)
