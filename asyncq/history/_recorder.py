"""The worker side of the metrics history: count in memory, flush in aggregate.

The processor reports each attempt's outcome once, where it decides it
(:meth:`HistoryRecorder.record`): processed, failed, retried or archived, the run
time and its histogram bucket, added to an in-memory cell per (minute, queue, task
type). The cells of the current minute are looked up by (queue, task type) alone, so
a run costs one small dict lookup and a few list increments, with no wrapper around
the handler (a wrapper's extra coroutine frame cost more than the counting itself).
Every ``flush_interval`` the worker's history role (``asyncq._worker.history_flusher``,
one of the server's supervised roles) writes the cells with one script call per
(queue, minute) hash, whatever the number of tasks, so the writes per flush are
bounded by the queues with work times the minutes the interval spans (one or two). A
flush that fails keeps its cells for the next one; the last flush runs at shutdown,
after the processor has stopped.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from asyncq.history._buckets import BUCKETS, UPPER_BOUNDS

__all__ = ["DEFAULT_FLUSH_INTERVAL", "DEFAULT_RETENTION", "HistoryRecorder", "HistoryStore"]

DEFAULT_RETENTION = timedelta(hours=24)
"""How long a minute of history is kept by default."""
DEFAULT_FLUSH_INTERVAL = timedelta(seconds=5)
"""How often a worker writes what it counted by default."""

_PROCESSED, _FAILED, _RETRIED, _ARCHIVED, _MICROS = range(5)
_FIRST_BUCKET = 5
_FIELDS = ("p", "f", "r", "a", "us")

Cell = list[int]
"""processed, failed, retried, archived, run time in microseconds, then one count per bucket."""


def _new_cell() -> Cell:
    return [0] * (_FIRST_BUCKET + BUCKETS)


class HistoryStore(Protocol):
    """Where the counts go: the worker's broker (:mod:`asyncq._broker.observations`)."""

    async def write_history(
        self, queue: str, minute: int, expire_at: int, counts: Sequence[str | int]
    ) -> None: ...


class HistoryRecorder:
    """Counts a worker's runs per minute, queue and task type and flushes them to Redis.

    *retention*: how long each minute is kept (its hash expires that long after the
    minute ends). *flush_interval*: how often the counts are written. *log*: where a
    failed flush is reported (the counts are kept and written by the next flush).
    """

    def __init__(
        self,
        store: HistoryStore,
        *,
        retention: timedelta = DEFAULT_RETENTION,
        flush_interval: timedelta = DEFAULT_FLUSH_INTERVAL,
        log: Any,
    ) -> None:
        for name, value in (("retention", retention), ("flush_interval", flush_interval)):
            if not isinstance(value, timedelta):
                raise TypeError(
                    f"{name} must be a datetime.timedelta, got {value.__class__.__name__}"
                )
        if retention < timedelta(minutes=1):
            raise ValueError(
                f"metrics history retention must be at least 1 minute, got {retention}"
            )
        if flush_interval <= timedelta(0) or flush_interval > timedelta(minutes=1):
            raise ValueError(f"flush_interval must be in (0, 1 min], got {flush_interval}")
        self._store = store
        self._retention = int(retention.total_seconds())
        self._interval = flush_interval.total_seconds()
        self._log = log
        self._cells: dict[tuple[int, str, str], Cell] = {}
        # the cells of the minute [_since, _until) by (queue, task type): the same lists
        # as in _cells, found without building the minute into the key
        self._now: dict[tuple[str, str], Cell] = {}
        self._since = self._until = 0.0
        self._minute = 0
        self._flushing = asyncio.Lock()

    @property
    def retention(self) -> timedelta:
        """How long each minute of history is kept."""
        return timedelta(seconds=self._retention)

    @property
    def flush_interval(self) -> timedelta:
        """How often the counts are written (by the worker's history role)."""
        return timedelta(seconds=self._interval)

    def _cell_at(self, key: tuple[int, str, str]) -> Cell:
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _new_cell()
        return cell

    def record(  # noqa: PLR0917 - called once per task: keywords cost more per call
        self,
        queue: str,
        task_type: str,
        began: float,
        ended: float,
        failed: bool,
        retried: bool,
        archived: bool,
        /,
    ) -> None:
        """Count one run of a handler, from *began* to *ended* (unix time, seconds), in
        the minute it ended: *failed* it raised (or was stopped), *retried* and
        *archived* what the processor decided to write for it. Positional only, and
        without branches on the flags: it runs once per task."""
        if self._since <= ended < self._until:
            cells = self._now
            cell = cells.get((queue, task_type))
            if cell is None:
                cell = cells[queue, task_type] = self._cell_at((self._minute, queue, task_type))
        elif ended >= self._until:  # a new minute: its cells start empty
            self._minute = int(ended) // 60
            self._since = self._minute * 60.0
            self._until = self._since + 60.0
            self._now = {}
            cell = self._now[queue, task_type] = self._cell_at((self._minute, queue, task_type))
        else:  # reported after a run of the next minute: counted in its own
            cell = self._cell_at((int(ended) // 60, queue, task_type))
        seconds = ended - began
        cell[_PROCESSED] += 1
        cell[_FAILED] += failed
        cell[_RETRIED] += retried
        cell[_ARCHIVED] += archived
        cell[_MICROS] += int(seconds * 1_000_000)
        cell[_FIRST_BUCKET + bisect_left(UPPER_BOUNDS, seconds)] += 1

    def record_recovered(
        self,
        queue: str,
        task_type: str,
        at: float,
        *,
        ran_here: bool,
        retried: bool,
        archived: bool,
    ) -> None:
        """Count the recoverer's decision for a task whose lease expired, at *at* (unix s).

        It is retried or archived (asynq's stats count it as failed too). A run this
        worker's processor still holds (*ran_here*: its local lease ran out) is counted
        by the processor when its handler ends, so only the decision is added here;
        otherwise the run (a killed or unreachable worker's) never reports, and it is
        counted here as a processed, failed run without a run time: it has none to
        give, and the mean and percentiles are those of the timed runs."""
        cell = self._cell_at((int(at) // 60, queue, task_type))
        if not ran_here:
            cell[_PROCESSED] += 1
            cell[_FAILED] += 1
        cell[_RETRIED] += retried
        cell[_ARCHIVED] += archived

    # -- flushing ------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write the counts taken since the last flush; on a Redis error keep them."""
        async with self._flushing:
            # taken with no await in between; the current minute's lookup starts afresh
            cells, self._cells = self._cells, {}
            self._now = {}
            if not cells:
                return
            writes: dict[tuple[str, int], list[str | int]] = {}
            for (minute, queue, task_type), cell in cells.items():
                args = writes.setdefault((queue, minute), [])
                for i, name in enumerate(_FIELDS):
                    if cell[i]:
                        args += (f"{name}:{task_type}", cell[i])
                for k in range(BUCKETS):
                    if cell[_FIRST_BUCKET + k]:
                        args += (f"h{k}:{task_type}", cell[_FIRST_BUCKET + k])
            written: set[tuple[str, int]] = set()
            try:
                for (queue, minute), args in writes.items():
                    expire_at = (minute + 1) * 60 + self._retention
                    await self._store.write_history(queue, minute, expire_at, args)
                    written.add((queue, minute))
            except Exception as exc:
                self._log.warning(
                    "metrics history flush failed; the counts are kept for the next one",
                    error=f"{exc.__class__.__name__}: {exc}",
                )
                for key, cell in cells.items():
                    if (key[1], key[0]) not in written:
                        mine = self._cell_at(key)
                        for i, n in enumerate(cell):
                            mine[i] += n
