"""A server's validated settings and its in-process counters, shared by every role."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeAlias

from asyncq._worker.flow import Rate
from asyncq.task import Task

__all__ = [
    "ErrorHandler",
    "GroupAggregator",
    "HealthCheck",
    "IsFailure",
    "RetryDelay",
    "ServerConfig",
    "ServerStats",
]

RetryDelay: TypeAlias = Callable[[int, BaseException, Task], timedelta]
"""``retry_delay(n, exc, task) -> timedelta``; *n* = retries so far (0 on the first failure)."""
IsFailure: TypeAlias = Callable[[BaseException], bool]
"""``is_failure(exc) -> bool``; False: retried without counting a retry or a failure."""
ErrorHandler: TypeAlias = Callable[[Task, BaseException], "Awaitable[None] | None"]
"""``error_handler(task, exc)``, sync or async; called on every failure before the retry."""
HealthCheck: TypeAlias = Callable[["BaseException | None"], "Awaitable[None] | None"]
"""``health_check(exc_or_none)``, sync or async; called every ``health_check_interval``."""

GroupAggregator: TypeAlias = Callable[[str, Sequence[Task]], "Task | Awaitable[Task]"]
"""``aggregator(group, tasks) -> Task``, sync or async: turns a group's tasks into one task.

*tasks* come in the order they joined the group, to the second: asynq scores a
group's tasks by the whole second they were added, so tasks that joined within
the same second come in task-id order, not necessarily in enqueue order.
"""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A server's validated settings; durations in seconds."""

    concurrency: int
    queues: Mapping[str, int]
    strict_priority: bool
    retry_delay: RetryDelay
    is_failure: IsFailure
    error_handler: ErrorHandler | None
    shutdown_timeout: float
    health_check: HealthCheck | None
    health_check_interval: float
    task_check_interval: float
    delayed_task_check_interval: float
    janitor_interval: float
    janitor_batch_size: int
    heartbeat_interval: float
    lease_duration: float
    recoverer_interval: float
    recoverer_cutoff: float
    syncer_interval: float
    group_aggregator: GroupAggregator | None
    group_grace_period: float
    group_max_delay: float
    group_max_size: int
    group_check_interval: float
    burst: bool
    sync_concurrency: int
    max_inflight_bytes: int
    queue_concurrency: Mapping[str, int] = field(default_factory=dict)
    """Fleet-wide limit per queue (live leases); see :mod:`asyncq._worker.flow`."""
    local_queue_concurrency: Mapping[str, int] = field(default_factory=dict)
    """Limit per queue for this server alone."""
    ordered_queues: tuple[str, ...] = ()
    """Queues this server marks ordered in Redis when it starts."""
    rate_limits: Mapping[str, Rate] = field(default_factory=dict)
    """Fleet-wide token bucket per queue (Redis TIME); see :mod:`asyncq._worker.flow`."""
    type_rate_limits: Mapping[str, Rate] = field(default_factory=dict)
    """Fleet-wide token bucket per task type, taken after the dequeue; see
    :mod:`asyncq._broker.typerate`."""
    queue_refresh_interval: float = 1.0
    """How often a server with queue patterns re-reads ``asynq:queues``."""


@dataclass(slots=True)
class ServerStats:
    """Counters of what this server did since it started (in-process only)."""

    succeeded: int = 0
    """Handlers that returned (or raised RevokeTask)."""
    failed: int = 0
    """Handlers that raised, timed out, were cancelled or lost their lease."""
    requeued: int = 0
    """Tasks put back to pending at shutdown."""
    type_rate_limited: int = 0
    """Tasks put back to the retry set, unrun, because their type's rate had no token."""
    recovered: int = 0
    """Tasks with an expired lease retried or archived by this server's recoverer."""
    forwarded: int = 0
    """Scheduled/retry tasks moved to pending by this server's forwarder."""
    wakeups: int = 0
    """Idle waits ended by a wake-up (Pub/Sub message or forwarder) rather than a timeout."""
    wakeup_messages: int = 0
    """Wake-up messages received on the queues' channels."""
    invalidations: int = 0
    """Key-tracking invalidations received (a served queue's pending list or paused flag
    written by anyone, Go asynq included; see :mod:`asyncq._worker.wakeup`)."""
    idle_timeouts: int = 0
    """Idle waits that ran the full ``task_check_interval``."""
    empty_fetches: int = 0
    """Fetches that found every queue empty (or paused)."""
    fetch_errors: int = 0
    """Fetches that failed (Redis unreachable...)."""
    janitor_deleted: int = 0
    """Completed tasks deleted after their retention."""
    aggregated: int = 0
    """Aggregated tasks enqueued."""
    aggregation_errors: int = 0
    """Aggregations that failed (their tasks return to the group later)."""
    loop_stalls: int = 0
    """Times a handler (or other code) blocked the event loop longer than the watchdog's
    threshold (see the WARNING "event loop blocked")."""
    loop_stalled_seconds: float = 0.0
    """Total seconds the event loop was blocked in those stalls."""
    role_restarts: Counter[str] = field(default_factory=Counter)
    """Crashes per role (each followed by a restart)."""
