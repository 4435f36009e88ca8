"""Metrics history in Redis: what each task type did, minute by minute, without Prometheus.

Every worker (unless ``Server(metrics_history=False)``; kept 24 hours, or a timedelta)
counts per minute, queue and task type: runs processed, failed, retried and archived, and a
histogram of their run times, in memory, and adds them every few seconds to the
queue's hash of that minute, ``asynq:{<queue>}:asyncq:metrics:<unix minute>`` (one
script call per queue and minute, not a write per task). Its fields are
``p:<type>``, ``f:<type>``, ``r:<type>``, ``a:<type>`` (counts), ``us:<type>`` (run
time in microseconds) and ``h<k>:<type>`` (runs in bucket k: up to 1 ms for k = 0,
then bounds growing by a factor of the square root of 2). The hash expires the
retention after its minute ends. Go asynq and asynqmon read none of it.

Read it with :meth:`asyncq.Inspector.metrics_history`, ``asyncq metrics top`` or the
web UI's Metrics page.
"""

from __future__ import annotations

from asyncq.history._buckets import BUCKETS, bucket_of, lower_bound, percentile, upper_bound
from asyncq.history._reader import MetricsPoint, TypeMetrics, read_history
from asyncq.history._recorder import DEFAULT_FLUSH_INTERVAL, DEFAULT_RETENTION, HistoryRecorder

__all__ = [
    "BUCKETS",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_RETENTION",
    "HistoryRecorder",
    "MetricsPoint",
    "TypeMetrics",
    "bucket_of",
    "lower_bound",
    "percentile",
    "read_history",
    "upper_bound",
]
