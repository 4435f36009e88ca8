"""Prometheus metrics: asynq ``x/metrics`` queue metrics and worker-side metrics.

Needs the ``metrics`` extra: ``pip install 'asyncq[metrics]'``.
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "asyncq.metrics needs prometheus-client: pip install 'asyncq[metrics]'"
    ) from exc

from asyncq.metrics._exporter import MetricsExporter
from asyncq.metrics._queues import (
    ENQUEUED_STATES,
    collect_queue_metrics,
    queue_families,
    render,
    type_rate_families,
)
from asyncq.metrics._worker import DEFAULT_BUCKETS, WorkerMetrics

__all__ = [
    "DEFAULT_BUCKETS",
    "ENQUEUED_STATES",
    "MetricsExporter",
    "WorkerMetrics",
    "collect_queue_metrics",
    "queue_families",
    "render",
    "type_rate_families",
]
