"""Bucket choice: a pure function over a sorted tuple of batch sizes (testable without a GPU)."""
from __future__ import annotations

import bisect


class BatchTooLargeError(ValueError):
    """The batch does not fit the largest captured bucket."""


def pick_bucket(buckets: tuple[int, ...], batch_size: int) -> int:
    """Smallest bucket >= batch_size. `buckets` must be sorted ascending (RuntimeConfig ensures it).

    Raises BatchTooLargeError naming the largest bucket when none fits, ValueError for batch_size < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch size: must be >= 1, got {batch_size}")
    i = bisect.bisect_left(buckets, batch_size)
    if i == len(buckets):
        raise BatchTooLargeError(
            f"batch size {batch_size} exceeds the largest bucket {buckets[-1]} "
            f"(config key 'buckets'); capture a larger bucket or split the batch")
    return buckets[i]
