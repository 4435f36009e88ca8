"""The execution-time histogram of the metrics history: fixed, logarithmic buckets.

Bucket ``k`` holds the runs that took more than :func:`upper_bound` ``(k - 1)`` and at
most ``upper_bound(k)`` seconds; the bounds grow by a factor of the square root of 2
from 1 ms (bucket 0 holds everything up to 1 ms), and the last bucket also holds
everything longer. The bounds never change, so the buckets written by every worker,
in every minute, add up, and a percentile read from them lies in the bucket of the
true value.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["BUCKETS", "UPPER_BOUNDS", "bucket_of", "lower_bound", "percentile", "upper_bound"]

_FIRST = 0.001
"""The upper bound of bucket 0, in seconds."""
BUCKETS = 50
"""Number of buckets: the last regular bound is 1 ms * 2**24.5 (6.6 hours)."""


def upper_bound(k: int) -> float:
    """The longest run time (seconds) of bucket *k*."""
    return _FIRST * math.pow(2.0, k / 2)


def lower_bound(k: int) -> float:
    """The run time (seconds) bucket *k* starts above (0 for bucket 0)."""
    return 0.0 if k == 0 else upper_bound(k - 1)


UPPER_BOUNDS = tuple(upper_bound(k) for k in range(BUCKETS - 1))
"""The upper bounds of every bucket but the last (which has none)."""


def bucket_of(seconds: float) -> int:
    """The bucket of a run that took *seconds*."""
    return bisect_left(UPPER_BOUNDS, seconds)  # the first bound at or above *seconds*


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The *q*-quantile (0 < q <= 1) of the runs counted in *counts* (one count per
    bucket), in seconds: interpolated inside the bucket holding it, None without runs."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for k, n in enumerate(counts):
        if n and seen + n >= rank:
            low, high = lower_bound(k), upper_bound(k)
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return upper_bound(len(counts) - 1)
