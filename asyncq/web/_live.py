"""What the dashboard's live charts show at first load: the samples this web process took.

Every dashboard render (a first view or a refresh, by anyone) records the queues'
sizes by state and the all-time processed/failed counters. A new page starts its
live charts from these instead of from nothing; the process keeps the last
:data:`KEEP_SECONDS` only, in memory (no Redis write, nothing to configure).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from asyncq import QueueInfo

__all__ = ["KEEP_SECONDS", "LiveSamples"]

KEEP_SECONDS = 30 * 60
"""Age of the oldest sample kept."""
MIN_SPACING = 1.0
"""Seconds between two kept samples: renders closer to the last one add none (several
viewers refreshing at once add at most one sample a second)."""
_STATES = ("active", "pending", "aggregating", "scheduled", "retry", "archived", "completed")


class LiveSamples:
    """A time-ordered ring of ``[unix time, processed_total, failed_total, *sizes by state]``."""

    __slots__ = ("_clock", "_samples")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._samples: deque[list[float]] = deque(maxlen=int(KEEP_SECONDS / MIN_SPACING))

    def record(self, infos: Iterable[QueueInfo]) -> None:
        """Add a sample of *infos* (every queue) taken now."""
        now = self._clock()
        if self._samples and now - self._samples[-1][0] < MIN_SPACING:
            return
        rows = list(infos)
        sample: list[float] = [
            round(now, 3),
            sum(q.processed_total for q in rows),
            sum(q.failed_total for q in rows),
            *(sum(getattr(q, s) for q in rows) for s in _STATES),
        ]
        self._samples.append(sample)
        while self._samples and now - self._samples[0][0] > KEEP_SECONDS:
            self._samples.popleft()

    def as_json(self) -> dict[str, Any]:
        """The samples and the server's clock (the page maps them onto the browser's)."""
        return {"now": round(self._clock(), 3), "states": _STATES, "samples": list(self._samples)}
