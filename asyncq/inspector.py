"""The Inspector: see and steer queues, tasks, servers and schedulers (asynq's Inspector).

It works on any Redis written by asyncq or Go asynq::

    async with Inspector("redis://localhost:6379/0") as inspector:
        for name in await inspector.queues():
            info = await inspector.queue_info(name)
            print(name, info.pending, info.latency)
        await inspector.run_all("default", "archived")

Every per-queue method first checks that the queue is registered in
``asynq:queues`` and raises :class:`~asyncq.errors.QueueNotFoundError`
otherwise. Operations refused in a task's current state raise
:class:`~asyncq.errors.FailedPreconditionError` with asynq's messages.

Deliberate differences from asynq:

* trimming the archive (more than 9,999 archived tasks, or older than 90 days)
  deletes the trimmed tasks' hashes; released asynq leaves them in Redis where
  nothing can reach them;
* ``delete_queue`` treats completed and aggregating tasks as tasks: without
  ``force`` it refuses a queue that still holds any, with ``force`` it deletes
  them too (asynq leaves them behind, unreachable once the queue is gone), as
  well as the queue's groups, aggregation sets and paused flag;
* ``pause`` and ``resume`` raise QueueNotFoundError for an unknown queue
  (asynq would silently create a paused flag for a mistyped name);
* tasks moved to pending by ``run_task``/``run_all`` get ``pending_since`` so the
  queue latency counts from then, and idle asyncq workers are woken at once;
* deleting all pending tasks releases their uniqueness locks, as deleting one
  task does;
* a task whose stored message cannot be decoded is listed (its raw bytes as the
  payload, the decoding error as ``last_error``) instead of being hidden.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from asyncq import _keys as keys
from asyncq._broker.inspect import InspectBroker, StoredTask
from asyncq._broker.workflow import (
    WorkflowInfo,
    WorkflowNotFoundError,
    cancel_workflow,
    is_workflow_step,
    member_gone,
    read_workflow,
)
from asyncq._codec import decode_task_message
from asyncq._redis.connection import Connection
from asyncq._redis.options import RedisTarget
from asyncq._time import GO_ZERO_TIME, utc_from_timestamp
from asyncq.errors import FailedPreconditionError, QueueNotEmptyError, QueueNotFoundError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import TaskInfo, TaskState

__all__ = [
    "ClusterNode",
    "DailyStats",
    "GroupInfo",
    "Inspector",
    "QueueInfo",
    "SchedulerEnqueueEvent",
    "SchedulerEntry",
    "ServerInfo",
    "TypeRateInfo",
    "WorkerInfo",
]

DEFAULT_PAGE_SIZE = 30

_RUNNABLE = (TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED, TaskState.AGGREGATING)
_ARCHIVABLE = (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY, TaskState.AGGREGATING)
_DELETABLE = (
    TaskState.PENDING,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
    TaskState.AGGREGATING,
)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A snapshot of one queue (asynq's QueueInfo)."""

    queue: str
    memory_usage: int
    """Approximate bytes used by the queue's tasks (sampled, asynq's estimate)."""
    latency: timedelta
    """Age of the oldest pending task (0 when none or when it has no pending_since)."""
    size: int
    """Tasks in every state, completed and aggregating included."""
    groups: int
    pending: int
    active: int
    scheduled: int
    retry: int
    archived: int
    completed: int
    aggregating: int
    processed: int
    """Tasks processed today (UTC), successes and failures."""
    failed: int
    """Tasks failed today (UTC)."""
    processed_total: int
    failed_total: int
    paused: bool
    timestamp: datetime
    """When the snapshot was taken."""
    concurrency_limit: int | None = None
    """asyncq: the fleet-wide concurrency limit stored in Redis (:meth:`Inspector.set_limit`);
    None when unset (servers may still apply their own ``queue_concurrency``)."""
    running: int = 0
    """asyncq: active tasks holding a live lease, what a concurrency limit counts."""
    held_back: int = 0
    """asyncq: pending tasks the stored limit keeps waiting now (pending beyond the room)."""
    rate_limit: str | None = None
    """asyncq: the rate the workers' ``rate_limits`` bucket runs at (e.g. ``"50/s"``), as
    last written by a worker that took a task (kept an hour); None when no bucket exists."""
    rate_tokens: int | None = None
    """asyncq: tasks the rate bucket lets start now (Redis TIME); None without a bucket."""
    ordered: bool = False
    """asyncq: the queue is ordered (:meth:`Inspector.set_ordered`)."""

    @property
    def rate_per_second(self) -> float | None:
        """asyncq: :attr:`rate_limit` in tasks per second (``"600/min"`` is 10.0)."""
        return None if self.rate_limit is None else _per_second(self.rate_limit)


@dataclass(frozen=True, slots=True)
class DailyStats:
    """Processed and failed counts of one UTC day."""

    queue: str
    processed: int
    failed: int
    date: date


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """An aggregation group and the number of tasks waiting in it."""

    group: str
    size: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A task being processed by a server."""

    task_id: str
    task_type: str
    task_payload: bytes
    queue: str
    started: datetime | None
    deadline: datetime | None


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A live worker server (Go asynq or asyncq) and the tasks it is running."""

    id: str
    host: str
    pid: int
    concurrency: int
    queues: dict[str, int]
    strict_priority: bool
    started: datetime | None
    status: str
    active_workers: list[WorkerInfo] = field(default_factory=list)
    type_rate_limits: dict[str, str] = field(default_factory=dict)
    """asyncq: the server's ``type_rate_limits`` (``{task type: "600/min"}``); empty for
    Go asynq servers and asyncq servers without any."""


@dataclass(frozen=True, slots=True)
class TypeRateInfo:
    """asyncq: one task type's fleet-wide rate limit (``Server(type_rate_limits=...)``).

    A type is known from the live servers that configure it and from its
    Redis bucket, which the first token taken creates and which expires an
    hour after it was last full.
    """

    task_type: str
    rate: str | None
    """The rate the bucket runs at, as last written by a worker that took a token
    (e.g. ``"600/min"``); without a bucket, the rate the live servers configure
    (the first, sorted, when they disagree); None when neither is known."""
    per_second: float | None
    """:attr:`rate` in tasks per second (``"600/min"`` is 10.0)."""
    tokens: int | None
    """Tasks of the type that may start now (Redis TIME); None without a bucket."""
    next_token: timedelta | None
    """When :attr:`tokens` is 0, how long until the next token; else 0; None
    without a bucket."""
    limited: int
    """Tasks the rate put back to the retry set (unrun, no retry used) since the
    bucket was created; 0 without a bucket."""
    servers: dict[str, int] = field(default_factory=dict)
    """Live servers configuring the type, by the rate they configure
    (``{"600/min": 3}``); more than one key means they disagree, and the bucket
    runs at whichever rate its last taker had."""


@dataclass(frozen=True, slots=True)
class SchedulerEntry:
    """A periodic task registered by a live scheduler.

    ``options`` are the option strings exactly as the scheduler stored them,
    in Go syntax (``Queue("critical")``, ``MaxRetry(3)``, ``Timeout(30m0s)``...).
    """

    id: str
    spec: str
    task_type: str
    task_payload: bytes
    options: list[str]
    next: datetime | None
    prev: datetime | None
    """None when the entry has never enqueued a task."""


@dataclass(frozen=True, slots=True)
class SchedulerEnqueueEvent:
    """One task enqueued by a scheduler entry."""

    task_id: str
    enqueued_at: datetime | None


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A Redis Cluster node serving a queue's slot."""

    id: str
    addr: str


def _state(state: TaskState | str) -> TaskState:
    try:
        return TaskState(state)
    except ValueError:
        valid = ", ".join(s.value for s in TaskState)
        raise ValueError(f"unknown task state {state!r} (expected one of: {valid})") from None


def _check_paging(page: int, size: int) -> None:
    if page < 1:
        raise ValueError(f"page must be 1 or more, got {page}")
    if size < 1:
        raise ValueError(f"page size must be 1 or more, got {size}")


def _check_group(state: TaskState, group: str | None) -> str | None:
    if state is TaskState.AGGREGATING:
        if group is None or not group.strip():
            raise ValueError("a group is required for aggregating tasks")
        return group
    if group is not None:
        raise ValueError(f"group applies to aggregating tasks only, not to {state.value} tasks")
    return None


def _proto_time(value: datetime | None) -> datetime | None:
    # Go writes its zero time for "never"; an absent Timestamp means the same.
    if value is None or value == GO_ZERO_TIME:
        return None
    return value


class Inspector:
    """Inspect and manage queues and tasks on a Redis shared with asyncq or Go asynq.

    *redis* is a URI (``redis://host:6379/0``, ``rediss://``, ``redis-sentinel://``,
    ``redis-cluster://``...), parsed connection options, or a ready
    ``redis.asyncio`` client created with ``decode_responses=False`` (a client
    passed in stays open after :meth:`aclose`).
    """

    def __init__(self, redis: RedisTarget, *, clock: Callable[[], float] = time.time) -> None:
        self._conn = Connection(redis)
        pool = getattr(self._conn.redis, "connection_pool", None)
        if pool is not None and pool.connection_kwargs.get("decode_responses"):
            raise ValueError(
                "the Inspector needs a Redis client with decode_responses=False: "
                "task messages are binary protobufs"
            )
        self._clock = clock
        self._rdb = InspectBroker(self._conn.redis, clock=clock)

    @property
    def redis(self) -> Any:
        """The underlying redis-py client."""
        return self._conn.redis

    async def aclose(self) -> None:
        """Close the connection if the Inspector created it."""
        await self._conn.aclose()

    async def __aenter__(self) -> Inspector:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _require_queue(self, queue: str) -> None:
        keys.validate_queue_name(queue)
        if not await self._rdb.queue_exists(queue):
            raise QueueNotFoundError(queue)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    # -- queues ------------------------------------------------------------------------------

    async def queues(self) -> list[str]:
        """Names of every known queue, sorted."""
        return await self._rdb.all_queues()

    async def queue_info(self, queue: str) -> QueueInfo:
        """Sizes by state, today's and all-time counters, latency, memory and paused flag."""
        await self._require_queue(queue)
        stats = await self._rdb.current_stats(queue)
        limit = await self._rdb.queue_limit(queue)
        running = await self._rdb.live_leases(queue)
        bucket = await self._rdb.queue_rate(queue)
        ordered = await self._rdb.queue_ordered(queue)
        now = self._now()
        latency = timedelta(0)
        if stats.oldest_pending_since_ns > 0:
            # Clamped: a pending_since beyond datetime's range (garbage) must not fail the read.
            since = utc_from_timestamp(stats.oldest_pending_since_ns / 1e9)
            latency = max(now - since, timedelta(0))
        size = (
            stats.pending
            + stats.active
            + stats.scheduled
            + stats.retry
            + stats.archived
            + stats.completed
            + stats.aggregating
        )
        return QueueInfo(
            queue=queue,
            memory_usage=stats.memory_usage,
            latency=latency,
            size=size,
            groups=stats.groups,
            pending=stats.pending,
            active=stats.active,
            scheduled=stats.scheduled,
            retry=stats.retry,
            archived=stats.archived,
            completed=stats.completed,
            aggregating=stats.aggregating,
            processed=stats.processed,
            failed=stats.failed,
            processed_total=stats.processed_total,
            failed_total=stats.failed_total,
            paused=stats.paused,
            timestamp=now,
            concurrency_limit=limit,
            running=running,
            held_back=0 if limit is None else max(0, stats.pending - max(0, limit - running)),
            rate_limit=None if bucket is None else _rate_text(bucket.burst, bucket.period_us),
            rate_tokens=None if bucket is None else bucket.tokens,
            ordered=ordered,
        )

    async def history(self, queue: str, days: int = 10) -> list[DailyStats]:
        """Processed/failed counts of the last *days* UTC days, today first."""
        if days < 1:
            raise ValueError(f"days must be 1 or more, got {days}")
        await self._require_queue(queue)
        rows = await self._rdb.historical_stats(queue, days)
        return [DailyStats(queue, p, f, day.date()) for day, p, f in rows]

    async def groups(self, queue: str) -> list[GroupInfo]:
        """The queue's aggregation groups with their sizes, sorted by name."""
        await self._require_queue(queue)
        return [GroupInfo(g, n) for g, n in await self._rdb.group_stats(queue)]

    async def pause(self, queue: str) -> None:
        """Stop workers (asyncq and Go) from taking tasks from *queue*.

        Raises FailedPreconditionError when the queue is already paused.
        """
        await self._require_queue(queue)
        await self._rdb.pause(queue)

    async def resume(self, queue: str) -> None:
        """Resume a paused queue. Raises FailedPreconditionError when it is not paused."""
        await self._require_queue(queue)
        await self._rdb.unpause(queue)
        await self._rdb.publish_wakeup(queue)

    async def delete_queue(self, queue: str, *, force: bool = False) -> None:
        """Remove a queue and its keys.

        Without *force* the queue must hold no task in any state
        (QueueNotEmptyError); with *force* its tasks are deleted too, unless some
        are active (FailedPreconditionError). Daily and total counters stay.
        """
        await self._require_queue(queue)
        code = await self._rdb.remove_queue(queue, force=force)
        if code == -1:
            raise QueueNotEmptyError(queue)
        if code == -2:
            raise FailedPreconditionError("cannot remove queue with active tasks")

    # -- flow control --------------------------------------------------------------------

    async def type_rates(self) -> list[TypeRateInfo]:
        """Every task type with a rate limit that a live server configures, sorted.

        A bucket left by servers that have stopped is not listed (finding it
        would mean scanning the keyspace); :meth:`type_rate` still reads it.
        """
        configured: dict[str, dict[str, int]] = {}
        for s in await self._rdb.list_servers():
            rates = await self._rdb.server_type_rates(s.host, s.pid, s.server_id)
            for task_type, rate in rates.items():
                by_rate = configured.setdefault(task_type, {})
                by_rate[rate] = by_rate.get(rate, 0) + 1
        out = []
        for task_type in sorted(configured):
            if "{" in task_type or "}" in task_type:
                continue  # not a name a server accepts: nothing to read
            out.append(await self._type_rate(task_type, configured[task_type]))
        return out

    async def type_rate(self, task_type: str) -> TypeRateInfo | None:
        """*task_type*'s fleet-wide rate limit: its rate, the tasks of the type
        that may start now (Redis TIME), the tasks it put back, and the live
        servers configuring it. None when no live server configures the type
        and it has no bucket (the bucket expires an hour after it was last full).
        """
        if not isinstance(task_type, str) or not task_type:
            raise ValueError(f"task type must be a non-empty string, got {task_type!r}")
        keys.refuse_braces("task type", task_type)
        configured: dict[str, int] = {}
        for s in await self._rdb.list_servers():
            rate = (await self._rdb.server_type_rates(s.host, s.pid, s.server_id)).get(task_type)
            if rate is not None:
                configured[rate] = configured.get(rate, 0) + 1
        info = await self._type_rate(task_type, configured)
        return None if info.rate is None and not configured else info

    async def _type_rate(self, task_type: str, configured: dict[str, int]) -> TypeRateInfo:
        bucket = await self._rdb.type_rate(task_type)
        servers = dict(sorted(configured.items()))
        if bucket is not None:
            return TypeRateInfo(
                task_type=task_type,
                rate=_rate_text(bucket.burst, bucket.period_us),
                per_second=bucket.burst * 1_000_000 / bucket.period_us,
                tokens=bucket.tokens,
                next_token=timedelta(microseconds=bucket.next_us),
                limited=bucket.limited,
                servers=servers,
            )
        rate = next(iter(servers), None)
        return TypeRateInfo(
            task_type=task_type,
            rate=rate,
            per_second=None if rate is None else _per_second(rate),
            tokens=None,
            next_token=None,
            limited=0,
            servers=servers,
        )

    async def limit(self, queue: str) -> int | None:
        """The fleet-wide concurrency limit stored for *queue*, or None when unset.

        A limit may be stored before the queue has any task (see :meth:`set_limit`).
        """
        keys.validate_queue_name(queue)
        return await self._rdb.queue_limit(queue)

    async def set_limit(self, queue: str, limit: int | None) -> None:
        """Store a fleet-wide concurrency limit for *queue* (None removes it).

        Every asyncq server serving the queue honours it from its next fetch,
        without a restart; it overrides the servers' ``queue_concurrency`` for
        that queue. 0 stops the queue's tasks from starting (like a pause that
        only asyncq servers see). Go asynq servers ignore it. The queue need not
        exist yet: a limit set before the first task is there when it comes.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be 0 or more, got {limit}")
        keys.validate_queue_name(queue)
        await self._rdb.set_queue_limit(queue, limit)
        if limit is None or limit > 0:
            await self._rdb.publish_wakeup(queue)

    async def ordered(self, queue: str) -> bool:
        """Whether *queue* is ordered (see :meth:`set_ordered`)."""
        keys.validate_queue_name(queue)
        return await self._rdb.queue_ordered(queue)

    async def set_ordered(self, queue: str, ordered: bool) -> None:
        """Make *queue* ordered (or not) for every asyncq server, from its next fetch.

        An ordered queue runs one task at a time across the fleet, in enqueue
        order, and a failed task runs again before anything behind it (see
        docs/flow-control.md). Go asynq servers ignore it. The queue need not
        exist yet: the flag is there when its first task comes.
        """
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be a bool, got {type(ordered).__name__}")
        keys.validate_queue_name(queue)
        await self._rdb.set_queue_ordered(queue, ordered)
        await self._rdb.publish_wakeup(queue)

    # -- tasks -------------------------------------------------------------------------------

    def _info(self, task: StoredTask, *, is_orphaned: bool = False) -> TaskInfo:
        return TaskInfo.from_message(
            task.message, task.state, task.next_process_at, task.result, is_orphaned=is_orphaned
        )

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task by ID. Raises TaskNotFoundError."""
        keys.refuse_braces("task ID", task_id)
        await self._require_queue(queue)
        return self._info(await self._rdb.get_task(queue, task_id))

    async def list_tasks(
        self,
        queue: str,
        state: TaskState | str,
        *,
        page: int = 1,
        size: int = DEFAULT_PAGE_SIZE,
        group: str | None = None,
    ) -> list[TaskInfo]:
        """One page (1-based) of the queue's tasks in *state*.

        Pending and active tasks come next-to-run first; the sorted-set states
        come in ascending score order (scheduled/retry: soonest first; archived:
        oldest first; completed: soonest to expire first). Aggregating tasks need
        *group*. Active tasks whose lease has expired have ``is_orphaned`` set.
        """
        st = _state(state)
        _check_paging(page, size)
        group = _check_group(st, group)
        await self._require_queue(queue)
        if st in (TaskState.PENDING, TaskState.ACTIVE):
            tasks = await self._rdb.list_list(queue, st, page - 1, size)
            if st is TaskState.ACTIVE:
                orphans = await self._rdb.lease_expired_ids(queue)
                return [self._info(t, is_orphaned=t.message.id in orphans) for t in tasks]
        else:
            tasks = await self._rdb.list_zset(queue, st, page - 1, size, group)
        return [self._info(t) for t in tasks]

    async def list_pending(
        self, queue: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Pending tasks, next to run first."""
        return await self.list_tasks(queue, TaskState.PENDING, page=page, size=size)

    async def list_active(
        self, queue: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Active tasks, oldest first; ``is_orphaned`` marks those with an expired lease."""
        return await self.list_tasks(queue, TaskState.ACTIVE, page=page, size=size)

    async def list_scheduled(
        self, queue: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Scheduled tasks, soonest first."""
        return await self.list_tasks(queue, TaskState.SCHEDULED, page=page, size=size)

    async def list_retry(
        self, queue: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Tasks waiting for a retry, soonest first."""
        return await self.list_tasks(queue, TaskState.RETRY, page=page, size=size)

    async def list_archived(
        self, queue: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Archived tasks, oldest archive time first (as asynq)."""
        return await self.list_tasks(queue, TaskState.ARCHIVED, page=page, size=size)

    async def list_completed(
        self, queue: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Completed tasks, soonest to expire first (as asynq)."""
        return await self.list_tasks(queue, TaskState.COMPLETED, page=page, size=size)

    async def list_aggregating(
        self, queue: str, group: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[TaskInfo]:
        """Tasks waiting in *group*, by the second they joined it (ties in task-id order)."""
        return await self.list_tasks(
            queue, TaskState.AGGREGATING, page=page, size=size, group=group
        )

    async def delete_task(self, queue: str, task_id: str) -> None:
        """Delete a task in any state but active, releasing its uniqueness lock."""
        keys.refuse_braces("task ID", task_id)
        await self._require_queue(queue)
        step = await self._workflow_step(queue, task_id)
        await self._rdb.delete_task(queue, task_id)
        if step is not None:  # a workflow's member: the workflow resolves it as failed
            await member_gone(self._conn.redis, step, "deleted", self._clock())

    async def run_task(self, queue: str, task_id: str) -> None:
        """Move a scheduled, retry, archived, completed or aggregating task to pending."""
        keys.refuse_braces("task ID", task_id)
        await self._require_queue(queue)
        await self._rdb.run_task(queue, task_id)

    async def archive_task(self, queue: str, task_id: str) -> None:
        """Archive a task that is neither active nor archived already."""
        keys.refuse_braces("task ID", task_id)
        await self._require_queue(queue)
        step = await self._workflow_step(queue, task_id)
        await self._rdb.archive_task(queue, task_id)
        if step is not None:  # a workflow's member: the workflow resolves it as failed
            await member_gone(self._conn.redis, step, "archived", self._clock())

    async def _workflow_step(self, queue: str, task_id: str) -> TaskMessage | None:
        """The task's message when it is a workflow step (else None)."""
        raw = await self._conn.redis.hget(keys.task_key(queue, task_id), "msg")
        if not isinstance(raw, bytes):
            return None
        try:
            msg = decode_task_message(raw)
        except ValueError:
            return None
        return msg if is_workflow_step(msg) else None

    async def delete_all(
        self, queue: str, state: TaskState | str, *, group: str | None = None
    ) -> int:
        """Delete every task in *state* (pending, scheduled, retry, archived, completed,
        or aggregating with *group*); returns how many were deleted."""
        st = _state(state)
        if st not in _DELETABLE:
            raise ValueError(
                "cannot delete all active tasks; cancel them instead (asyncq task cancel)"
            )
        group = _check_group(st, group)
        await self._require_queue(queue)
        return await self._rdb.delete_all(queue, st, group)

    async def run_all(self, queue: str, state: TaskState | str, *, group: str | None = None) -> int:
        """Move every scheduled, retry, archived (or one group's aggregating) task to
        pending; returns how many were moved."""
        st = _state(state)
        if st not in _RUNNABLE:
            raise ValueError(
                f"cannot run all {st.value} tasks "
                "(expected scheduled, retry, archived or aggregating)"
            )
        group = _check_group(st, group)
        await self._require_queue(queue)
        return await self._rdb.run_all(queue, st, group)

    async def archive_all(
        self, queue: str, state: TaskState | str, *, group: str | None = None
    ) -> int:
        """Archive every pending, scheduled, retry (or one group's aggregating) task;
        returns how many were archived.

        As in asynq the archive keeps at most 9,999 tasks and none older than 90
        days; tasks trimmed beyond that are deleted.
        """
        st = _state(state)
        if st not in _ARCHIVABLE:
            raise ValueError(
                f"cannot archive all {st.value} tasks "
                "(expected pending, scheduled, retry or aggregating)"
            )
        group = _check_group(st, group)
        await self._require_queue(queue)
        return await self._rdb.archive_all(queue, st, group)

    async def update_task_payload(self, queue: str, task_id: str, payload: bytes) -> TaskInfo:
        """Replace the payload of a scheduled task; returns the updated task."""
        keys.refuse_braces("task ID", task_id)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, got {payload.__class__.__name__}")
        await self._require_queue(queue)
        task = await self._rdb.get_task(queue, task_id)
        if task.state is not TaskState.SCHEDULED:
            raise FailedPreconditionError(
                f"cannot update payload of a task in {task.state.value} state; "
                "only scheduled tasks can be updated"
            )
        if not task.decodable:
            # Writing the placeholder back would replace the stored bytes (asynq refuses too).
            raise FailedPreconditionError(
                f"cannot update payload of task {task_id!r}: its stored message cannot be "
                f"decoded ({task.message.error_msg})"
            )
        task.message.payload = bytes(payload)
        await self._rdb.update_task_message(queue, task.message)
        return self._info(await self._rdb.get_task(queue, task_id))

    async def cancel(self, task_id: str) -> None:
        """Ask every server to cancel the running task *task_id* (best effort, Pub/Sub).

        A canceled task fails with a cancellation error and is retried, as in asynq.
        """
        keys.refuse_braces("task ID", task_id)
        if not task_id.strip():
            raise ValueError("task ID cannot be empty")
        await self._rdb.publish_cancelation(task_id)

    # -- workflows (asyncq extension) --------------------------------------------------------

    async def get_workflow(self, queue: str, workflow_id: str) -> WorkflowInfo:
        """A workflow's state and its steps; *queue* is its first step's queue.

        Raises WorkflowNotFoundError when it does not exist (never started, or
        its state expired with the retention of its last step).
        """
        info = await read_workflow(self._conn.redis, queue, workflow_id)
        if info is None:
            raise WorkflowNotFoundError(queue, workflow_id)
        return info

    async def cancel_workflow(self, queue: str, workflow_id: str) -> str:
        """Cancel a running workflow: no further hand-off, not-started steps deleted.

        Steps already running finish (cancel them with :meth:`cancel`). Returns
        the workflow's state before the call (only ``running`` changes);
        raises WorkflowNotFoundError when it does not exist.
        """
        state = await cancel_workflow(self._conn.redis, queue, workflow_id, self._clock())
        if state is None:
            raise WorkflowNotFoundError(queue, workflow_id)
        return state

    # -- servers and schedulers --------------------------------------------------------------

    async def servers(self) -> list[ServerInfo]:
        """Live servers with their active workers, sorted by host and PID."""
        servers: dict[str, ServerInfo] = {}
        for s in await self._rdb.list_servers():
            servers[s.server_id] = ServerInfo(
                id=s.server_id,
                host=s.host,
                pid=s.pid,
                concurrency=s.concurrency,
                queues=dict(s.queues),
                strict_priority=s.strict_priority,
                started=_proto_time(s.start_time),
                status=s.status,
                type_rate_limits=await self._rdb.server_type_rates(s.host, s.pid, s.server_id),
            )
        for w in await self._rdb.list_workers():
            server = servers.get(w.server_id)
            if server is None:
                continue
            server.active_workers.append(
                WorkerInfo(
                    task_id=w.task_id,
                    task_type=w.task_type,
                    task_payload=w.task_payload,
                    queue=w.queue,
                    started=_proto_time(w.start_time),
                    deadline=_proto_time(w.deadline),
                )
            )
        for server in servers.values():
            server.active_workers.sort(key=lambda w: (w.started or GO_ZERO_TIME, w.task_id))
        return sorted(servers.values(), key=lambda s: (s.host, s.pid, s.id))

    async def scheduler_entries(self) -> list[SchedulerEntry]:
        """Periodic task entries of every live scheduler, soonest next run first."""
        entries = [
            SchedulerEntry(
                id=e.id,
                spec=e.spec,
                task_type=e.task_type,
                task_payload=e.task_payload,
                options=list(e.enqueue_options),
                next=_proto_time(e.next_enqueue_time),
                prev=_proto_time(e.prev_enqueue_time),
            )
            for e in await self._rdb.list_scheduler_entries()
        ]
        entries.sort(key=lambda e: (e.next or GO_ZERO_TIME, e.id))
        return entries

    async def scheduler_enqueue_events(
        self, entry_id: str, *, page: int = 1, size: int = DEFAULT_PAGE_SIZE
    ) -> list[SchedulerEnqueueEvent]:
        """Tasks enqueued by a scheduler entry, newest first."""
        _check_paging(page, size)
        events = await self._rdb.list_scheduler_enqueue_events(entry_id, page - 1, size)
        return [SchedulerEnqueueEvent(e.task_id, _proto_time(e.enqueue_time)) for e in events]

    # -- Redis -------------------------------------------------------------------------------

    async def cluster_key_slot(self, queue: str) -> int:
        """The Redis Cluster hash slot of the queue's keys."""
        await self._require_queue(queue)
        return await self._rdb.cluster_key_slot(queue)

    async def cluster_nodes(self, queue: str) -> list[ClusterNode]:
        """The cluster nodes (master first) serving the queue's slot."""
        await self._require_queue(queue)
        return [ClusterNode(i, a) for i, a in await self._rdb.cluster_nodes(queue)]

    async def redis_info(self) -> dict[str, Any]:
        """Redis ``INFO``, parsed."""
        return await self._rdb.redis_info()


_PERIOD_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_PERIOD_S |= {"h": 3600.0, "hour": 3600.0}


def _per_second(rate: str) -> float | None:
    """Tasks per second of a rate text a server wrote (``"600/min"`` is 10.0); None
    for text that is not a rate (a record written by something else)."""
    count, _, period = rate.partition("/")
    try:
        n = int(count)
    except ValueError:
        return None
    seconds = _PERIOD_S.get(period.strip().lower())
    if seconds is None:
        try:
            seconds = float(period.removesuffix("s"))  # _rate_text's "7/2.5s"
        except ValueError:
            return None
    return n / seconds if seconds > 0 else None


def _rate_text(count: int, period_us: int) -> str:
    """``50/s``, ``600/min``, ``10/h``; another period in seconds (``7/2.5s``)."""
    for unit, size in (("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000)):
        if abs(period_us - size) < count:  # the interval is rounded down to a µs
            return f"{count}/{unit}"
    return f"{count}/{period_us / 1_000_000:g}s"
