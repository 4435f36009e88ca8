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
asyncq_queue_concurrency_limit          gauge    queue         stored, else configured limit
asyncq_queue_running                    gauge    queue         tasks holding a live lease
asyncq_queue_held_back                  gauge    queue         pending beyond the limit's room
asyncq_queue_rate_limit_per_second      gauge    queue         the queue bucket's rate
asyncq_queue_rate_tokens                gauge    queue         tasks that may start now
asyncq_queue_ordered                    gauge    queue         1 if ordered else 0
asyncq_queue_flow_servers               gauge    queue,        live servers configuring
                                                 setting,      the setting (limit, local,
                                                 value         rate, ordered) at the value
asyncq_type_rate_limit_per_second       gauge    task_type     the type's rate
asyncq_type_rate_tokens                 gauge    task_type     tasks that may start now
asyncq_type_rate_limited_total          counter  task_type     tasks the rate put back
asyncq_type_rate_servers                gauge    task_type,    live servers configuring
                                                 rate          the type at the rate
======================================  =======  ============  ==========================

The queue rate families cover queues with a rate bucket (a worker with
``rate_limits`` took a task in the last hour); the type rate families cover
the types :meth:`Inspector.type_rates` lists (configured by a live server),
tokens and the counter only once the type has a bucket. The counter counts
since the bucket was created and restarts from 0 when an idle bucket expires
(an hour after it was last full), which Prometheus' ``rate()`` handles.

As in asynq, ``asynq_tasks_enqueued_total`` covers active, pending, scheduled,
retry, archived and completed (not aggregating). The Inspector is async and a
prometheus collector is not, so a scrape takes a snapshot first
(:func:`collect_queue_metrics`) and renders it (:func:`render`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import ResponseError

from asyncq import BrokerError, Inspector, QueueInfo, QueueNotFoundError, TypeRateInfo

__all__ = [
    "ENQUEUED_STATES",
    "collect_queue_metrics",
    "queue_families",
    "render",
    "type_rate_families",
]

_log = structlog.get_logger("asyncq.metrics")

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
            except (ResponseError, BrokerError):  # a damaged queue: the others still count
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
        "Fleet-wide concurrency limit of the queue: stored, else the smallest live servers "
        "configure (asyncq; only queues with one)",
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
    rate = GaugeMetricFamily(
        "asyncq_queue_rate_limit_per_second",
        "Tasks per second the queue's rate bucket lets start (asyncq; queues with a bucket)",
        labels=["queue"],
    )
    tokens = GaugeMetricFamily(
        "asyncq_queue_rate_tokens",
        "Tasks of the queue the rate bucket lets start now (asyncq; queues with a bucket)",
        labels=["queue"],
    )
    ordered = GaugeMetricFamily(
        "asyncq_queue_ordered",
        "1 if the queue is ordered, one task at a time fleet-wide (asyncq)",
        labels=["queue"],
    )
    configured = GaugeMetricFamily(
        "asyncq_queue_flow_servers",
        "Live servers configuring a flow-control setting of the queue (limit, local, rate, "
        "ordered) by code or flag, by value (asyncq; several values mean they disagree)",
        labels=["queue", "setting", "value"],
    )
    for info in infos:
        for setting, values in sorted(info.configured_by.items()):
            for value, n in sorted(values.items()):
                configured.add_metric([info.queue, setting, value], n)
        running.add_metric([info.queue], info.running)
        ordered.add_metric([info.queue], 1 if info.ordered else 0)
        if info.concurrency_limit is not None:
            limit.add_metric([info.queue], info.concurrency_limit)
            held.add_metric([info.queue], info.held_back)
        per_second = info.rate_per_second
        if per_second is not None and info.rate_tokens is not None:
            rate.add_metric([info.queue], per_second)
            tokens.add_metric([info.queue], info.rate_tokens)
    return [
        enqueued, size, latency, memory, processed, failed, paused, limit, running, held,
        rate, tokens, ordered, configured,
    ]  # fmt: skip


def type_rate_families(infos: Sequence[TypeRateInfo]) -> list[Metric]:
    """The asyncq families of per-task-type rate limits (:meth:`Inspector.type_rates`)."""
    rate = GaugeMetricFamily(
        "asyncq_type_rate_limit_per_second",
        "Tasks per second of the type the fleet-wide rate lets start (asyncq)",
        labels=["task_type"],
    )
    tokens = GaugeMetricFamily(
        "asyncq_type_rate_tokens",
        "Tasks of the type the rate lets start now (asyncq; types with a bucket)",
        labels=["task_type"],
    )
    limited = CounterMetricFamily(
        "asyncq_type_rate_limited",
        "Tasks of the type the rate put back to the retry set, unrun (asyncq; since the "
        "bucket was created)",
        labels=["task_type"],
    )
    servers = GaugeMetricFamily(
        "asyncq_type_rate_servers",
        "Live servers configuring a rate for the type, by rate (asyncq; more than one "
        "rate per type means they disagree)",
        labels=["task_type", "rate"],
    )
    for info in infos:
        t = info.task_type
        if info.per_second is not None:
            rate.add_metric([t], info.per_second)
        if info.tokens is not None:
            tokens.add_metric([t], info.tokens)
            limited.add_metric([t], info.limited)
        for text, n in info.servers.items():
            servers.add_metric([t, text], n)
    return [rate, tokens, limited, servers]


class _Snapshot(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def collect_queue_metrics(inspector: Inspector) -> list[Metric]:
    """Read every queue and type rate through *inspector*: the x/metrics families
    and asyncq's own."""
    families = queue_families(await _infos(inspector))
    try:
        rates = await inspector.type_rates()
    except (ResponseError, BrokerError, ValueError) as exc:
        # Damaged server records: the queue metrics still stand, without the type rates.
        _log.warning("type rate metrics left out", error=f"{type(exc).__name__}: {exc}")
        return families
    return families + type_rate_families(rates)


def render(families: Iterable[Metric], *extra: Collector) -> bytes:
    """The Prometheus text exposition of *families* plus any *extra* collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
