"""The worker side of the metrics history: count in memory, flush in aggregate.

A :class:`HistoryRecorder` is a :class:`~asyncq.hooks.WorkerHooks`: its wrapped handler
adds each run to an in-memory cell per (minute, queue, task type): processed, failed,
the run time and its histogram bucket; the processor's retry and archive reports add
to the same cells. Every ``flush_interval`` the cells are written with one script call
per (queue, minute) hash, whatever the number of tasks, so the writes per flush are
bounded by the queues with work times the minutes the interval spans (one or two).
A flush that fails keeps its cells for the next one; the last flush runs at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from bisect import bisect_left
from datetime import timedelta
from typing import Any

from asyncq import _keys as keys
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import load_script
from asyncq.history._buckets import BUCKETS, UPPER_BOUNDS
from asyncq.mux import Handler
from asyncq.task import Task

__all__ = ["DEFAULT_FLUSH_INTERVAL", "DEFAULT_RETENTION", "HistoryRecorder"]

DEFAULT_RETENTION = timedelta(hours=24)
"""How long a minute of history is kept by default."""
DEFAULT_FLUSH_INTERVAL = timedelta(seconds=5)
"""How often a worker writes what it counted by default."""

_RECORD = load_script("asyncq.history", "record_metrics")

_PROCESSED, _FAILED, _RETRIED, _ARCHIVED, _MICROS = range(5)
_FIRST_BUCKET = 5
_FIELDS = ("p", "f", "r", "a", "us")

Cell = list[int]
"""processed, failed, retried, archived, run time in microseconds, then one count per bucket."""


def _new_cell() -> Cell:
    return [0] * (_FIRST_BUCKET + BUCKETS)


def _minute() -> int:
    return int(time.time()) // 60


class HistoryRecorder:
    """Counts a worker's runs per minute, queue and task type and flushes them to Redis.

    *retention*: how long each minute is kept (its hash expires that long after the
    minute ends). *flush_interval*: how often the counts are written. *log*: where a
    failed flush is reported (the counts are kept and written by the next flush).
    """

    def __init__(
        self,
        redis: RedisClient,
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
        self._redis = redis
        self._retention = int(retention.total_seconds())
        self._interval = flush_interval.total_seconds()
        self._log = log
        self._cells: dict[tuple[int, str, str], Cell] = {}
        # wall time = perf_counter() + this: a clock read less per task (a clock read is
        # a tenth of the recorder's cost); set again at each flush, so it never drifts far
        self._to_wall = [time.time() - time.perf_counter()]
        self._loop_task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()

    @property
    def retention(self) -> timedelta:
        """How long each minute of history is kept."""
        return timedelta(seconds=self._retention)

    def _cell(self, queue: str, task_type: str) -> Cell:
        return self._cell_at((_minute(), queue, task_type))

    def _cell_at(self, key: tuple[int, str, str]) -> Cell:
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _new_cell()
        return cell

    # -- WorkerHooks ---------------------------------------------------------------------

    def instrument(self, handler: Handler) -> Handler:
        cells = self._cells
        new_cell = self._cell_at
        clock = time.perf_counter
        to_wall = self._to_wall

        async def recorded(task: Task) -> None:
            start = clock()
            failed = 1
            try:
                await handler(task)
                failed = 0
            finally:
                end = clock()
                elapsed = end - start
                key = (int(end + to_wall[0]) // 60, task.queue or "", task.type)
                cell = cells.get(key) or new_cell(key)
                cell[_PROCESSED] += 1
                cell[_FAILED] += failed
                cell[_MICROS] += int(elapsed * 1_000_000)
                cell[_FIRST_BUCKET + bisect_left(UPPER_BOUNDS, elapsed)] += 1

        return recorded

    def attach(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(
                self._run(), name="asyncq-metrics-history"
            )

    def detach(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    def task_retried(self, queue: str, task_type: str) -> None:
        self._cell(queue, task_type)[_RETRIED] += 1

    def task_archived(self, queue: str, task_type: str) -> None:
        self._cell(queue, task_type)[_ARCHIVED] += 1

    def lease_expired(self, queue: str, task_type: str) -> None:
        return None

    def loop_stalled(self, seconds: float) -> None:
        return None

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        return None  # counted by the handler wrapper (instrument), which times the run

    # -- flushing ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()

    async def aclose(self) -> None:
        """Stop the periodic flush and write what is left (the server's shutdown)."""
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()

    async def flush(self) -> None:
        """Write the counts taken since the last flush; on a Redis error keep them."""
        async with self._flushing:
            self._to_wall[0] = time.time() - time.perf_counter()
            # emptied in place (the wrappers hold the dict), with no await in between
            cells = dict(self._cells)
            self._cells.clear()
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
                    await _RECORD(
                        self._redis,
                        [keys.metrics_history_key(queue, minute)],
                        [expire_at, *args],
                    )
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
