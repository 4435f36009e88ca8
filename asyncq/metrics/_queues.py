"""Queue metrics with asynq ``x/metrics`` names and labels, read through the Inspector.

The same families as Go's ``QueueMetricsCollector`` (namespace ``asynq``), so
Grafana dashboards built for asynq work unchanged:

======================================  =======  ============  ==========================
metric                                  type     labels        value
======================================  =======  ============  ==========================
asynq_tasks_enqueued_total              gauge    queue, state  tasks in the state
asynq_queue_size                        gauge    queue         tasks in every state
asynq_queue_latency_seconds             gauge    queue         age of oldest pending task
asynq_queue_memory_usage_approx_bytes   gauge    queue         sampled memory
asynq_tasks_processed_total             counter  queue         all-time processed
asynq_tasks_failed_total                counter  queue         all-time failed
asynq_queue_paused_total                gauge    queue         1 if paused else 0
asyncq_queue_concurrency_limit          gauge    queue         stored limit (queues with one)
asyncq_queue_running                    gauge    queue         tasks holding a live lease
asyncq_queue_held_back                  gauge    queue         pending beyond the limit's room
======================================  =======  ============  ==========================

As in asynq, ``asynq_tasks_enqueued_total`` covers active, pending, scheduled,
retry, archived and completed (not aggregating). The Inspector is async and a
prometheus collector is not, so a scrape takes a snapshot first
(:func:`collect_queue_metrics`) and renders it (:func:`render`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from asyncq import Inspector, QueueInfo, QueueNotFoundError

__all__ = ["ENQUEUED_STATES", "collect_queue_metrics", "queue_families", "render"]

NAMESPACE = "asynq"
ENQUEUED_STATES = ("active", "pending", "scheduled", "retry", "archived", "completed")
_CONCURRENCY = 16


async def _infos(inspector: Inspector) -> list[QueueInfo]:
    names = await inspector.queues()
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def one(name: str) -> QueueInfo | None:
        async with limit:
            try:
                return await inspector.queue_info(name)
            except QueueNotFoundError:  # removed between the listing and the read
                return None

    results = await asyncio.gather(*(one(n) for n in names))
    return [info for info in results if info is not None]


def queue_families(infos: Sequence[QueueInfo]) -> list[Metric]:
    """The x/metrics families for these queue snapshots."""
    enqueued = GaugeMetricFamily(
        f"{NAMESPACE}_tasks_enqueued_total",
        "Number of tasks enqueued; broken down by queue and state.",
        labels=["queue", "state"],
    )
    size = GaugeMetricFamily(
        f"{NAMESPACE}_queue_size", "Number of tasks in a queue", labels=["queue"]
    )
    latency = GaugeMetricFamily(
        f"{NAMESPACE}_queue_latency_seconds",
        "Number of seconds the oldest pending task is waiting in pending state to be processed.",
        labels=["queue"],
    )
    memory = GaugeMetricFamily(
        f"{NAMESPACE}_queue_memory_usage_approx_bytes",
        "Number of memory used by a given queue (approximated number by sampling).",
        labels=["queue"],
    )
    processed = CounterMetricFamily(
        f"{NAMESPACE}_tasks_processed",
        "Number of tasks processed (both succeeded and failed); broken down by queue",
        labels=["queue"],
    )
    failed = CounterMetricFamily(
        f"{NAMESPACE}_tasks_failed",
        "Number of tasks failed; broken down by queue",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        f"{NAMESPACE}_queue_paused_total",
        "Number of queues paused",
        labels=["queue"],
    )
    for info in infos:
        q = info.queue
        for state in ENQUEUED_STATES:
            enqueued.add_metric([q, state], getattr(info, state))
        size.add_metric([q], info.size)
        latency.add_metric([q], info.latency.total_seconds())
        memory.add_metric([q], info.memory_usage)
        processed.add_metric([q], info.processed_total)
        failed.add_metric([q], info.failed_total)
        paused.add_metric([q], 1 if info.paused else 0)
    limit = GaugeMetricFamily(
        "asyncq_queue_concurrency_limit",
        "Fleet-wide concurrency limit stored for the queue (asyncq; only queues with one)",
        labels=["queue"],
    )
    running = GaugeMetricFamily(
        "asyncq_queue_running",
        "Tasks of the queue holding a live lease (what a concurrency limit counts; asyncq)",
        labels=["queue"],
    )
    held = GaugeMetricFamily(
        "asyncq_queue_held_back",
        "Pending tasks the stored concurrency limit keeps waiting (asyncq)",
        labels=["queue"],
    )
    for info in infos:
        running.add_metric([info.queue], info.running)
        if info.concurrency_limit is not None:
            limit.add_metric([info.queue], info.concurrency_limit)
            held.add_metric([info.queue], info.held_back)
    return [enqueued, size, latency, memory, processed, failed, paused, limit, running, held]


class _Snapshot(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def collect_queue_metrics(inspector: Inspector) -> list[Metric]:
    """Read every queue through *inspector* and return the x/metrics families."""
    return queue_families(await _infos(inspector))


def render(families: Iterable[Metric], *extra: Collector) -> bytes:
    """The Prometheus text exposition of *families* plus any *extra* collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
