"""Reading the metrics history: the minute hashes of a window, per queue and task type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from asyncq import _keys as keys
from asyncq._logging import LazyLogger
from asyncq._redis.options import RedisClient
from asyncq.history._buckets import BUCKETS, percentile

__all__ = ["MetricsPoint", "TypeMetrics", "read_history"]

_log = LazyLogger()  # resolved at each use: the application's structlog setup applies

_SCALARS = {"p": 0, "f": 1, "r": 2, "a": 3, "us": 4}
_WIDTH = len(_SCALARS) + BUCKETS


@dataclass(frozen=True, slots=True)
class MetricsPoint:
    """One step of a task type's history (run times in seconds, None without runs)."""

    start: datetime
    processed: int
    failed: int
    retried: int
    archived: int
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class TypeMetrics:
    """A task type's history in one queue over a window.

    ``processed`` counts the handler runs that ended (returned or raised), ``failed``
    those that raised (a cancelled run counts as failed), ``retried`` and ``archived``
    the failures scheduled for another attempt or archived. The percentiles (seconds)
    come from the execution-time histogram: each lies in the histogram bucket of the
    true value (buckets grow by a factor of 1.41). ``buckets`` is that histogram (see
    :mod:`asyncq.history`); ``points`` the window step by step, oldest first.
    """

    queue: str
    task_type: str
    processed: int
    failed: int
    retried: int
    archived: int
    run_seconds: float
    p50: float | None
    p95: float | None
    p99: float | None
    buckets: tuple[int, ...]
    points: tuple[MetricsPoint, ...]

    @property
    def failure_rate(self) -> float:
        """failed / processed (0 without runs)."""
        return self.failed / self.processed if self.processed else 0.0

    @property
    def mean(self) -> float | None:
        """The mean run time in seconds of the timed runs (None without any): a run the
        recoverer counted for a dead worker has no run time."""
        timed = sum(self.buckets)
        return self.run_seconds / timed if timed else None


def _point(start_minute: int, row: list[int]) -> MetricsPoint:
    hist = row[len(_SCALARS) :]
    return MetricsPoint(
        start=datetime.fromtimestamp(start_minute * 60, UTC),
        processed=row[0],
        failed=row[1],
        retried=row[2],
        archived=row[3],
        p50=percentile(hist, 0.50),
        p95=percentile(hist, 0.95),
        p99=percentile(hist, 0.99),
    )


def _parse(raw: dict[bytes, bytes] | Exception, key: str) -> dict[str, list[int]]:
    """{task type: [processed, failed, retried, archived, micros, *buckets]} of one hash.

    *raw* is HGETALL's reply, or the error the pipeline returned for *key*. A key of
    another type, or a count no worker writes (not a whole number, negative), is left
    out with a warning naming the key: one minute's damage must not hide the window.
    """
    if isinstance(raw, Exception):
        if "WRONGTYPE" not in str(raw):
            raise raw
        _log.warning("ignored an asyncq key of the wrong type", key=key, expected="hash")
        return {}
    rows: dict[str, list[int]] = {}
    bad: list[str] = []
    for name, value in raw.items():
        kind, sep, task_type = name.decode("utf-8", "replace").partition(":")
        if not sep:
            continue
        if kind in _SCALARS:
            index = _SCALARS[kind]
        elif kind.startswith("h") and kind[1:].isdigit() and int(kind[1:]) < BUCKETS:
            index = len(_SCALARS) + int(kind[1:])
        else:
            continue  # a field a later asyncq writes: not this reader's to interpret
        count = _count(value)
        if count is None:
            bad.append(name.decode("utf-8", "replace"))
            continue
        row = rows.get(task_type)
        if row is None:
            row = rows[task_type] = [0] * _WIDTH
        row[index] += count
    if bad:
        _log.warning("ignored unreadable metrics history counts", key=key, fields=bad[:10])
    return rows


def _count(value: bytes) -> int | None:
    """A stored count (HINCRBY's text: a whole number from 0 to 2**63 - 1), else None."""
    if not value.isdigit() or len(value) > 19:
        return None
    count = int(value)
    return count if count < 2**63 else None


async def read_history(
    redis: RedisClient,
    queues: Sequence[str],
    *,
    first_minute: int,
    last_minute: int,
    step: int = 1,
) -> list[TypeMetrics]:
    """The history of every task type of *queues* from *first_minute* to *last_minute*
    (unix minutes, both included), in steps of *step* minutes; sorted by queue and type."""
    minutes = list(range(first_minute, last_minute + 1))
    if not queues or not minutes:
        return []
    pipe = redis.pipeline(transaction=False)
    for queue in queues:
        for minute in minutes:
            pipe.hgetall(keys.metrics_history_key(queue, minute))
    replies = await pipe.execute(raise_on_error=False)
    steps = (len(minutes) + step - 1) // step
    result: list[TypeMetrics] = []
    for qi, queue in enumerate(queues):
        series: dict[str, list[list[int]]] = {}
        for mi in range(len(minutes)):
            key = keys.metrics_history_key(queue, minutes[mi])
            for task_type, row in _parse(replies[qi * len(minutes) + mi], key).items():
                rows = series.get(task_type)
                if rows is None:
                    rows = series[task_type] = [[0] * _WIDTH for _ in range(steps)]
                into = rows[mi // step]
                for i, n in enumerate(row):
                    into[i] += n
        for task_type in sorted(series):
            rows = series[task_type]
            total = [sum(col) for col in zip(*rows, strict=True)]
            hist = total[len(_SCALARS) :]
            result.append(
                TypeMetrics(
                    queue=queue,
                    task_type=task_type,
                    processed=total[0],
                    failed=total[1],
                    retried=total[2],
                    archived=total[3],
                    run_seconds=total[4] / 1_000_000,
                    p50=percentile(hist, 0.50),
                    p95=percentile(hist, 0.95),
                    p99=percentile(hist, 0.99),
                    buckets=tuple(hist),
                    points=tuple(
                        _point(first_minute + i * step, row) for i, row in enumerate(rows)
                    ),
                )
            )
    return result
