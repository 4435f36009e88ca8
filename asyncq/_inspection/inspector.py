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

import asyncio
import fnmatch
import time
import types
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pydantic_core
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import encode_with
from asyncq._broker.durable import FAILED_RUN_KEPT, read_run, send_signal
from asyncq._broker.durable_cancel import CANCELED_ERROR, cancel_run
from asyncq._broker.inspect import InspectBroker, RateBucket, StoredTask
from asyncq._broker.triage import FailedTask, TriageBroker
from asyncq._broker.workflow import (
    WorkflowInfo,
    WorkflowNotFoundError,
    cancel_workflow,
    is_workflow_step,
    member_gone,
    read_workflow,
    workflow_key,
)
from asyncq._codec import decode_task_message
from asyncq._errsig import ErrorSignature, error_signature
from asyncq._inspection.durable_runs import (
    open_signal_wait,
    run_info,
    run_state,
    run_summary,
    signal_splits,
)
from asyncq._inspection.records import (
    ArchiveReport,
    ClusterNode,
    DailyStats,
    DurableRunInfo,
    DurableRunPage,
    DurableRunSummary,
    ErrorGroup,
    ErrorGroupResult,
    ErrorReport,
    GroupInfo,
    QueueInfo,
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    SkippedQueue,
    TypeRateInfo,
    WorkerInfo,
    WorkflowPage,
    WorkflowSummary,
    per_second_of,
)
from asyncq._redis.connection import Connection
from asyncq._redis.options import RedisTarget
from asyncq._time import GO_ZERO_TIME, utc_from_timestamp
from asyncq.errors import (
    AmbiguousIdError,
    BrokerError,
    DurableRunNotFoundError,
    FailedPreconditionError,
    QueueNotEmptyError,
    QueueNotFoundError,
    TaskNotFoundError,
)
from asyncq.history import TypeMetrics, read_history
from asyncq.progress import progress_key, progress_of, read_progress, settled
from asyncq.proto.asynq import TaskMessage
from asyncq.task import TaskInfo, TaskState

__all__ = ["DEFAULT_PAGE_SIZE", "ERROR_SCAN_LIMIT", "MAX_HISTORY_MINUTES", "Inspector"]

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 30

_SCAN_COUNT = 1000
"""Keys SCAN examines per call when listing workflows or durable runs."""
_SCAN_CALLS = 20
"""SCAN calls one page of workflows (or durable runs) may make per queue before it returns
what it has (with a cursor to go on): a page never walks more than about 20,000 keys of a queue."""
_FINISHED_STEPS = ("succeeded", "failed", "canceled")
_LOOKUP_CONCURRENCY = 16
"""Queues asked at once when looking an ID up in every queue."""
_MAX_CANDIDATES = 10
"""Matches of an ID prefix named in an AmbiguousIdError (the SCAN stops after one more)."""


def _glob_escape(text: str) -> str:
    """*text* as a literal in a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def _scan_node(redis: Any, cursor: int, match: str, key: str) -> tuple[int, list[Any]]:
    """One SCAN call; on a cluster, on the node that holds *key*'s slot (a queue's keys
    share its hash tag, so one node holds all of its workflows and runs)."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(key)
        reply = await redis.scan(cursor, match=match, count=_SCAN_COUNT, target_nodes=node)
        cursors, data = reply
        if isinstance(cursors, dict):
            return int(next(iter(cursors.values()), 0)), list(data)
        return int(cursors), list(data)
    next_cursor, data = await redis.scan(cursor, match=match, count=_SCAN_COUNT)
    return int(next_cursor), list(data)


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="surrogateescape") if isinstance(raw, bytes) else raw


def _workflow_kind(info: WorkflowInfo) -> str:
    sizes = [len(stage) for stage in info.stages]
    if len(sizes) == 1 and sizes[0] > 1:
        return "group"
    if len(sizes) == 2 and sizes[0] > 1 and sizes[1] == 1:
        return "chord"
    return "chain"


def _summary(info: WorkflowInfo) -> WorkflowSummary:
    steps = [step for stage in info.stages for step in stage]
    return WorkflowSummary(
        id=info.id,
        queue=info.queue,
        kind=_workflow_kind(info),
        state=info.state,
        steps_done=sum(step.state in _FINISHED_STEPS for step in steps),
        steps_total=len(steps),
        created=utc_from_timestamp(info.created),
        finished=None if info.finished is None else utc_from_timestamp(info.finished),
    )


_log = structlog.get_logger("asyncq.inspector")

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


def _classify_queue_name(raw: bytes) -> str | SkippedQueue:
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        return SkippedQueue(raw.decode("utf-8", "backslashreplace"), "not UTF-8")
    if not name.strip():
        return SkippedQueue(name, "blank")
    if "{" in name or "}" in name:
        return SkippedQueue(name, "holds '{' or '}', which delimit the queue name in asynq's keys")
    return name


_TRIAGE_STATES = (TaskState.RETRY, TaskState.ARCHIVED)
ERROR_SCAN_LIMIT = 20_000
"""Default number of failed tasks :meth:`Inspector.error_groups` reads (newest first)."""
_SAMPLE = 5


def _given_id(kind: str, text: str) -> str:
    """An ID as typed (surrounding blanks dropped), refused when empty or holding a brace."""
    if not isinstance(text, str):
        raise TypeError(f"{kind} ID must be a str, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise ValueError(f"{kind} ID cannot be empty")
    keys.refuse_braces(f"{kind} ID", text)
    return text


def _triage_states(states: Iterable[TaskState | str]) -> tuple[TaskState, ...]:
    if isinstance(states, str):
        states = (states,)
    out: list[TaskState] = []
    for s in states:
        st = _state(s)
        if st not in _TRIAGE_STATES:
            raise ValueError(f"error groups cover retry and archived tasks, not {st.value}")
        if st not in out:
            out.append(st)
    if not out:
        raise ValueError("states must name at least one of retry, archived")
    return tuple(out)


def _task_signature(task: FailedTask) -> ErrorSignature:
    if task.message is None:
        return ErrorSignature("", "undecodable task message")
    return error_signature(task.message.error_msg)


def _most_first(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(slots=True)
class _GroupAcc:
    sig: ErrorSignature
    example: str = ""
    newest: int = -1
    count: int = 0
    first: int | None = None
    last: int | None = None
    task_types: dict[str, int] = field(default_factory=dict)
    queues: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    sample: list[tuple[int, str, str]] = field(default_factory=list)

    def add(self, task: FailedTask) -> None:
        msg = task.message
        failed_at = msg.last_failed_at if msg is not None and msg.last_failed_at > 0 else 0
        if not failed_at and task.state is TaskState.ARCHIVED:
            failed_at = task.score
        self.count += 1
        if failed_at:
            self.first = failed_at if self.first is None else min(self.first, failed_at)
            self.last = failed_at if self.last is None else max(self.last, failed_at)
        ttype = msg.type if msg is not None else ""
        self.task_types[ttype] = self.task_types.get(ttype, 0) + 1
        self.queues[task.queue] = self.queues.get(task.queue, 0) + 1
        self.states[task.state.value] = self.states.get(task.state.value, 0) + 1
        if failed_at >= self.newest:
            self.newest = failed_at
            self.example = msg.error_msg if msg is not None else "undecodable task message"
        self.sample.append((failed_at, task.queue, task.id))
        if len(self.sample) > _SAMPLE * 4:
            self.sample.sort(reverse=True)
            del self.sample[_SAMPLE:]

    def result(self) -> ErrorGroup:
        self.sample.sort(reverse=True)
        return ErrorGroup(
            key=self.sig.key,
            kind=self.sig.kind,
            message=self.sig.message,
            example=self.example,
            count=self.count,
            first_seen=None if self.first is None else utc_from_timestamp(self.first),
            last_seen=None if self.last is None else utc_from_timestamp(self.last),
            task_types=_most_first(self.task_types),
            queues=_most_first(self.queues),
            states=_most_first(self.states),
            sample=[(q, i) for _, q, i in self.sample[:_SAMPLE]],
        )


def _state(state: TaskState | str) -> TaskState:
    try:
        return TaskState(state)
    except ValueError:
        valid = ", ".join(s.value for s in TaskState)
        raise ValueError(f"unknown task state {state!r} (expected one of: {valid})") from None


_MAX_POSITION = 2**63 - 1  # Redis' index range (LRANGE, ZRANGE)


def _check_paging(page: int, size: int) -> None:
    if page < 1:
        raise ValueError(f"page must be 1 or more, got {page}")
    if size < 1:
        raise ValueError(f"page size must be 1 or more, got {size}")
    if page * size > _MAX_POSITION:
        raise ValueError(
            f"page {page} of {size} tasks is past the last position Redis can address "
            f"({_MAX_POSITION}); ask for a smaller page number"
        )


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


MAX_HISTORY_MINUTES = 7 * 24 * 60
"""The longest window :meth:`Inspector.metrics_history` reads (one hash per queue and
minute: a week is 10,080 reads per queue)."""


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
        self._flow_cache: tuple[float, list[dict[str, str]]] | None = None
        self._skipped: tuple[SkippedQueue, ...] = ()
        self._warned: set[str] = set()

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
        """Names of every known queue, sorted.

        A member of ``asynq:queues`` that is not a usable queue name (not UTF-8,
        blank, or holding a brace; another client may have written it) is left out,
        logged once per Inspector and listed in :attr:`skipped_queues`.
        """
        names: list[str] = []
        skipped: list[SkippedQueue] = []
        for raw in await self._rdb.raw_queue_names():
            got = _classify_queue_name(raw)
            if isinstance(got, str):
                names.append(got)
                continue
            skipped.append(got)
            if got.name not in self._warned:
                self._warned.add(got.name)
                _log.warning(
                    "unusable queue name skipped",
                    key=keys.ALL_QUEUES,
                    name=got.name,
                    reason=got.reason,
                )
        self._skipped = tuple(skipped)
        return names

    @property
    def skipped_queues(self) -> tuple[SkippedQueue, ...]:
        """The members of ``asynq:queues`` the last :meth:`queues` call left out, and why."""
        return self._skipped

    async def queue_info(self, queue: str) -> QueueInfo:
        """Sizes by state, today's and all-time counters, latency, memory and paused flag."""
        await self._require_queue(queue)
        stats = await self._rdb.current_stats(queue)
        limit = await self._rdb.queue_limit(queue)
        running = await self._rdb.live_leases(queue)
        bucket = await self._rdb.queue_rate(queue)
        ordered = await self._rdb.queue_ordered(queue)
        configured = _configured_for(queue, await self._fleet_flow())
        if limit is None and "limit" in configured:
            # Each server enforces its own; the smallest is what holds under load.
            # (A value that is no number was written by something else: not a limit.)
            limits = [int(v) for v in configured["limit"] if v.isdigit()]
            limit = min(limits) if limits else None
        rate_text = None if bucket is None else _bucket_rate_text(bucket)
        if rate_text is None and "rate" in configured:  # no task taken yet
            rate_text = max(configured["rate"].items(), key=lambda kv: kv[1])[0]
        ordered = ordered or "ordered" in configured
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
            rate_limit=rate_text,
            rate_tokens=None if bucket is None else bucket.tokens,
            ordered=ordered,
            configured_by=configured,
        )

    async def _fleet_flow(self) -> list[dict[str, str]]:
        """Every live asyncq server's queue flow record, read at most once a second."""
        now = time.monotonic()
        cached = self._flow_cache
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        flows = []
        try:
            for s in await self._rdb.list_servers():
                record = await self._rdb.server_queue_flow(s.host, s.pid, s.server_id)
                if record:
                    flows.append(record)
        except (ResponseError, BrokerError) as exc:
            # Damaged server records: the queue's own state still stands, without the
            # settings the servers configure (the error names the refused key).
            _log.warning("server flow records left out", key=keys.ALL_SERVERS, error=str(exc))
        self._flow_cache = (now, flows)
        return flows

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
                rate=_bucket_rate_text(bucket),
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
            per_second=None if rate is None else per_second_of(rate),
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
        info = self._info(await self._rdb.get_task(queue, task_id))
        stored = settled(await read_progress(self._conn.redis, queue, task_id), info.state)
        return info if stored is None else replace(info, progress=stored)

    async def find_task(self, task_id: str) -> list[TaskInfo]:
        """The task with ID *task_id* in every queue that holds one (usually one or none:
        asynq's IDs are unique per queue only). Raises ValueError for an empty ID."""
        task_id = _given_id("task", task_id)
        names = await self.queues()
        limit = asyncio.Semaphore(_LOOKUP_CONCURRENCY)

        async def one(name: str) -> TaskInfo | None:
            async with limit:
                try:
                    return await self.get_task(name, task_id)
                except (TaskNotFoundError, QueueNotFoundError):
                    return None

        return [t for t in await asyncio.gather(*(one(n) for n in names)) if t is not None]

    async def lookup_task(self, id_or_prefix: str, *, queue: str | None = None) -> TaskInfo:
        """The task a person names: by its whole ID or, when no task has that ID, by the
        start of one (the 8 characters the web UI, ``asyncq dash`` and the events show
        of a UUID); in *queue*, or in any queue when *queue* is None.

        Raises TaskNotFoundError when nothing matches, AmbiguousIdError (naming the
        candidates) when several tasks do, ValueError for an empty ID. The prefix
        search SCANs the keys of each queue searched, so it is for people, not loops.
        """
        given = _given_id("task", id_or_prefix)
        if queue is not None:
            try:
                return await self.get_task(queue, given)
            except TaskNotFoundError:
                names = [queue]
        else:
            exact = await self.find_task(given)
            if len(exact) == 1:
                return exact[0]
            if exact:  # one ID in several queues
                raise AmbiguousIdError(
                    "task", given, [f"{t.queue}/{t.id}" for t in exact], more=False
                )
            names = await self.queues()
        (found_queue, found_id) = await self._one_by_prefix(
            "task", names, keys.task_key_prefix, given, TaskNotFoundError(queue, given)
        )
        return await self.get_task(found_queue, found_id)

    async def _one_by_prefix(
        self,
        kind: str,
        names: Sequence[str],
        key_prefix: Callable[[str], str],
        given: str,
        not_found: Exception,
    ) -> tuple[str, str]:
        """(queue, id) of the one key ``key_prefix(queue) + id`` of *names* whose id starts
        with *given*; raises *not_found* when there is none, AmbiguousIdError when more."""
        redis = self._conn.redis
        found: list[tuple[str, str]] = []
        for name in names:
            prefix = key_prefix(name)
            scan_cursor = 0
            while len(found) <= _MAX_CANDIDATES:
                scan_cursor, batch = await _scan_node(
                    redis, scan_cursor, _glob_escape(prefix + given) + "*", prefix
                )
                found += sorted((name, _text(raw)[len(prefix) :]) for raw in batch)
                if scan_cursor == 0:
                    break
        if not found:
            raise not_found
        if len(found) > 1:
            shown = [f"{q}/{i}" for q, i in found[:_MAX_CANDIDATES]]
            raise AmbiguousIdError(kind, given, shown, more=len(found) > _MAX_CANDIDATES)
        return found[0]

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
                infos = [self._info(t, is_orphaned=t.message.id in orphans) for t in tasks]
                return await self._with_progress(queue, infos)
        else:
            tasks = await self._rdb.list_zset(queue, st, page - 1, size, group)
        return [self._info(t) for t in tasks]

    async def _with_progress(self, queue: str, infos: list[TaskInfo]) -> list[TaskInfo]:
        """*infos* with their stored progress (one pipelined read)."""
        if not infos:
            return infos
        redis = self._conn.redis
        if hasattr(redis, "get_nodes"):  # one slot per queue, but no cluster pipeline here
            stored = [await read_progress(redis, queue, i.id) for i in infos]
        else:
            pipe = redis.pipeline(transaction=False)
            for i in infos:
                pipe.hgetall(progress_key(queue, i.id))
            # A progress key of another type spoils one row, not the listing.
            replies = await pipe.execute(raise_on_error=False)
            stored = [
                progress_of(reply, progress_key(queue, i.id))
                for i, reply in zip(infos, replies, strict=True)
            ]
        out = []
        for info, found in zip(infos, stored, strict=True):
            out.append(info if found is None else replace(info, progress=found))
        return out

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
        await self._conn.redis.delete(progress_key(queue, task_id))
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
        returns how many were moved into the archive.

        As in asynq the archive keeps at most 9,999 tasks and none older than 90
        days; tasks trimmed beyond that are deleted, the oldest first. Use
        :meth:`archive_all_report` to learn how many that deleted.
        """
        return (await self.archive_all_report(queue, state, group=group)).moved

    async def archive_all_report(
        self, queue: str, state: TaskState | str, *, group: str | None = None
    ) -> ArchiveReport:
        """:meth:`archive_all`, reporting the tasks archived and those the archive's
        limits deleted (see :class:`ArchiveReport`)."""
        st = _state(state)
        if st not in _ARCHIVABLE:
            raise ValueError(
                f"cannot archive all {st.value} tasks "
                "(expected pending, scheduled, retry or aggregating)"
            )
        group = _check_group(st, group)
        await self._require_queue(queue)
        moved, deleted = await self._rdb.archive_all(queue, st, group)
        return ArchiveReport(moved, deleted)

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

    async def cancel(self, task_id: str, *, retry: bool = True) -> None:
        """Ask every server to cancel the running task *task_id* (best effort, Pub/Sub).

        A canceled task fails with a cancellation error (:class:`~asyncq.TaskCanceledError`)
        and is retried, as in asynq. With ``retry=False`` it is stopped for good: an
        asyncq server archives it (:class:`~asyncq.TaskStoppedError`, ``context canceled:
        stopped, not retried``; a workflow step fails its workflow); a Go asynq server
        running it can only cancel it, so there it is retried.
        """
        if not isinstance(retry, bool):
            raise TypeError(f"retry must be True or False, got {retry!r}")
        keys.refuse_braces("task ID", task_id)
        if not task_id.strip():
            raise ValueError("task ID cannot be empty")
        if retry:
            await self._rdb.publish_cancelation(task_id)
        else:
            await self._rdb.publish_stop(task_id)

    # -- failure triage (asyncq extension) ---------------------------------------------------

    async def _triage_queues(self, queues: Sequence[str] | str | None) -> list[str]:
        if queues is None:
            return await self.queues()
        names = [queues] if isinstance(queues, str) else list(queues)
        for name in names:
            await self._require_queue(name)
        return names

    async def error_groups(
        self,
        queues: Sequence[str] | str | None = None,
        *,
        states: Iterable[TaskState | str] = _TRIAGE_STATES,
        limit: int | None = ERROR_SCAN_LIMIT,
    ) -> ErrorReport:
        """Retry and archived tasks grouped by error signature, largest group first.

        *queues* defaults to every queue. Each queue's retry and archived sets are
        read newest first in chunks of a few hundred, taking turns, at most *limit*
        tasks in all (None reads everything); when the limit stops the scan,
        :attr:`ErrorReport.capped` is True and the counts cover the
        :attr:`~ErrorReport.scanned` newest tasks of each set.
        """
        sts = _triage_states(states)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 or None, got {limit}")
        names = await self._triage_queues(queues)
        triage = TriageBroker(self._conn.redis, clock=self._clock)
        total = 0
        for name in names:
            for st in sts:
                total += await triage.size(name, st)
        groups: dict[ErrorSignature, _GroupAcc] = {}
        scanned = 0
        # Round robin over every (queue, state): a cap leaves each a fair share of the
        # newest tasks rather than reading the first queues whole and the others not at all.
        scanners = [triage.scan(name, st) for name in names for st in sts]
        while scanners and (limit is None or scanned < limit):
            for scanner in list(scanners):
                chunk = await anext(scanner, None)
                if chunk is None:
                    scanners.remove(scanner)
                    continue
                if limit is not None:
                    chunk = chunk[: limit - scanned]
                scanned += len(chunk)
                for task in chunk:
                    sig = _task_signature(task)
                    acc = groups.get(sig)
                    if acc is None:
                        acc = groups[sig] = _GroupAcc(sig)
                    acc.add(task)
                if limit is not None and scanned >= limit:
                    break
        for scanner in scanners:
            await scanner.aclose()
        result = [acc.result() for acc in groups.values()]
        result.sort(key=lambda g: (-g.count, g.kind, g.message))
        return ErrorReport(groups=result, scanned=scanned, total=max(total, scanned))

    async def _error_group_action(
        self,
        key: str,
        action: str,
        queues: Sequence[str] | str | None,
        states: Iterable[TaskState | str],
    ) -> ErrorGroupResult:
        if not isinstance(key, str) or len(key) != 12 or key.strip("0123456789abcdef"):
            raise ValueError(f"an error group key is 12 hex digits, got {key!r}")
        sts = _triage_states(states)
        if action == "archive":
            sts = tuple(s for s in sts if s is TaskState.RETRY)
        names = await self._triage_queues(queues)
        triage = TriageBroker(self._conn.redis, clock=self._clock)
        acted = skipped = 0
        for name in names:
            woke = False
            for st in sts:
                matched: list[tuple[str, str]] = []
                steps: dict[str, TaskMessage] = {}
                async for chunk in triage.scan(name, st):
                    for task in chunk:
                        if _task_signature(task).key != key:
                            continue
                        matched.append((task.id, task.digest))
                        if task.message is not None and is_workflow_step(task.message):
                            steps[task.id] = task.message
                if not matched:
                    continue
                done = await triage.act(name, st, action, matched)
                acted += len(done)
                skipped += len(matched) - len(done)
                if action != "run":
                    for task_id in done:
                        step = steps.get(task_id)
                        if step is not None:  # the workflow resolves its member as failed
                            reason = "deleted" if action == "delete" else "archived"
                            await member_gone(self._conn.redis, step, reason, self._clock())
                woke = woke or (action == "run" and bool(done))
            if woke:
                await self._rdb.publish_wakeup(name)
        return ErrorGroupResult(acted=acted, skipped=skipped)

    async def run_error_group(
        self,
        key: str,
        *,
        queues: Sequence[str] | str | None = None,
        states: Iterable[TaskState | str] = _TRIAGE_STATES,
    ) -> ErrorGroupResult:
        """Move every retry/archived task of the error group *key* (:attr:`ErrorGroup.key`)
        to pending.

        Unlike :meth:`error_groups` this reads every task of the states (in
        chunks, no limit) so that the whole group acts. A task that moved, or
        failed again with another error, after it was read is skipped and counted.
        """
        return await self._error_group_action(key, "run", queues, states)

    async def archive_error_group(
        self,
        key: str,
        *,
        queues: Sequence[str] | str | None = None,
        states: Iterable[TaskState | str] = _TRIAGE_STATES,
    ) -> ErrorGroupResult:
        """Archive the retry tasks of the error group *key* (its archived tasks stay)."""
        return await self._error_group_action(key, "archive", queues, states)

    async def delete_error_group(
        self,
        key: str,
        *,
        queues: Sequence[str] | str | None = None,
        states: Iterable[TaskState | str] = _TRIAGE_STATES,
    ) -> ErrorGroupResult:
        """Delete every retry/archived task of the error group *key*, releasing
        uniqueness locks as :meth:`delete_task` does."""
        return await self._error_group_action(key, "delete", queues, states)

    # -- metrics history (asyncq extension) ------------------------------------------------

    async def metrics_history(
        self,
        queues: Sequence[str] | str | None = None,
        *,
        window: timedelta = timedelta(hours=1),
        step: timedelta = timedelta(minutes=1),
        task_types: Iterable[str] | None = None,
    ) -> list[TypeMetrics]:
        """Per task type and queue: runs processed, failed, retried and archived, and the
        run-time percentiles, over the last *window* (the current minute included), with
        the window's series in steps of *step* (whole minutes). Every queue by default;
        *task_types* keeps only those types. Sorted by queue, then type.

        Written by the workers' metrics history (``Server(metrics_history=...)``, see
        :mod:`asyncq.history`); what a worker counted in the last few seconds is not
        written yet.
        """
        for name, value in (("window", window), ("step", step)):
            if not isinstance(value, timedelta):
                raise TypeError(
                    f"{name} must be a datetime.timedelta, got {value.__class__.__name__}"
                )
        minutes = int(window.total_seconds() // 60)
        step_minutes = int(step.total_seconds() // 60)
        if minutes < 1 or window.total_seconds() % 60:
            raise ValueError(f"window must be a positive whole number of minutes, got {window}")
        if step_minutes < 1 or step.total_seconds() % 60:
            raise ValueError(f"step must be a positive whole number of minutes, got {step}")
        if minutes > MAX_HISTORY_MINUTES:
            raise ValueError(f"window can be at most {MAX_HISTORY_MINUTES // 60} h, got {window}")
        names = await self._triage_queues(queues)
        last = int(self._clock()) // 60
        rows = await read_history(
            self._conn.redis,
            names,
            first_minute=last - minutes + 1,
            last_minute=last,
            step=step_minutes,
        )
        if task_types is not None:
            wanted = set(task_types)
            rows = [row for row in rows if row.task_type in wanted]
        return rows

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

    async def lookup_workflow(self, id_or_prefix: str, *, queue: str | None = None) -> WorkflowInfo:
        """The workflow a person names: by its whole id or, when no workflow has that
        id, by the start of one; under *queue* (its first step's) or any queue when None.

        Raises WorkflowNotFoundError when nothing matches, AmbiguousIdError (naming
        the candidates) when several workflows do, ValueError for an empty id. As
        :meth:`lookup_task`, the prefix search SCANs the keys of the queues searched.
        """
        given = _given_id("workflow", id_or_prefix)
        names = [queue] if queue is not None else await self.queues()
        redis = self._conn.redis
        limit = asyncio.Semaphore(_LOOKUP_CONCURRENCY)

        async def one(name: str) -> WorkflowInfo | None:
            async with limit:
                return await read_workflow(redis, name, given)

        exact = [w for w in await asyncio.gather(*(one(n) for n in names)) if w is not None]
        if len(exact) == 1:
            return exact[0]
        if exact:  # one id under several queues
            raise AmbiguousIdError(
                "workflow", given, [f"{w.queue}/{w.id}" for w in exact], more=False
            )
        found_queue, found_id = await self._one_by_prefix(
            "workflow",
            names,
            lambda name: workflow_key(name, "_")[:-1],
            given,
            WorkflowNotFoundError(queue, given),
        )
        return await self.get_workflow(found_queue, found_id)

    async def workflows(
        self, queue: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> WorkflowPage:
        """A page of at most *limit* workflows (of *queue*, or of every queue in name
        order), in SCAN's order; pass the page's :attr:`~WorkflowPage.cursor` back for
        the next one. There is no index of workflows: each page SCANs the queues'
        keys in bounded chunks, so a page may hold fewer than *limit* rows and still
        have a cursor. Raises ValueError for a bad *limit* or *cursor*.
        """
        redis = self._conn.redis

        async def read(qname: str, workflow_id: str) -> WorkflowSummary | None:
            info = await read_workflow(redis, qname, workflow_id)
            return None if info is None else _summary(info)

        found, next_cursor = await self._scan_page(
            "workflow",
            [queue] if queue is not None else await self.queues(),
            lambda qname: workflow_key(qname, "_")[:-1],  # the key of a workflow id "", none has
            read,
            limit=limit,
            cursor=cursor,
        )
        return WorkflowPage(found, next_cursor)

    async def _scan_page(
        self,
        kind: str,
        names: list[str],
        prefix_of: Callable[[str], str],
        read: Callable[[str, str], Awaitable[T | None]],
        *,
        limit: int,
        cursor: str | None,
    ) -> tuple[list[T], str | None]:
        """A page of at most *limit* rows of keys ``prefix_of(queue) + id`` SCANned in
        the queues *names* (in bounded chunks), each read with ``read(queue, id)`` (None:
        gone since SCAN saw it); the cursor of the next page (None: no more)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ValueError(f"limit must be an int from 1 to 1000, got {limit!r}")
        start, scan_cursor, skip = 0, 0, 0
        if cursor:
            parts = cursor.split(":", 2)
            if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
                raise ValueError(f"invalid {kind} cursor {cursor!r}")
            if parts[2] not in names:
                raise ValueError(f"invalid {kind} cursor {cursor!r}: no queue {parts[2]!r}")
            start, scan_cursor, skip = names.index(parts[2]), int(parts[0]), int(parts[1])
        redis = self._conn.redis
        found: list[T] = []
        for index in range(start, len(names)):
            qname = names[index]
            prefix = prefix_of(qname)
            calls = 0
            while True:
                next_cursor, batch = await _scan_node(
                    redis, scan_cursor, _glob_escape(prefix) + "*", prefix
                )
                calls += 1
                # Sorted, so that a page that ends inside this chunk can name where:
                # SCAN from the same cursor returns the same chunk while keys stay put.
                ids = sorted({_text(raw)[len(prefix) :] for raw in batch})
                for position in range(skip, len(ids)):
                    if len(found) == limit:
                        return found, f"{scan_cursor}:{position}:{qname}"
                    row = await read(qname, ids[position])
                    if row is not None:
                        found.append(row)
                skip = 0
                scan_cursor = int(next_cursor)
                if scan_cursor == 0:
                    break
                if calls >= _SCAN_CALLS:
                    return found, f"{scan_cursor}:0:{qname}"
        return found, None

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

    # -- durable runs (asyncq extension) -----------------------------------------------------

    async def _check_run_name(self, queue: str, run_id: str) -> None:
        """Refuse a queue or run id that cannot name a run, and an unknown queue."""
        await self._require_queue(queue)
        if not isinstance(run_id, str):
            raise TypeError(f"run ID must be a str, got {type(run_id).__name__}")
        if not run_id.strip():
            raise ValueError("run ID cannot be empty")
        keys.refuse_braces("run ID", run_id)

    async def _read_durable_run(
        self, queue: str, run_id: str
    ) -> tuple[dict[str, bytes], StoredTask | None, tuple[str, str, int] | None] | None:
        """A run's record, its task (None: gone) and the signal wait it sits in (name,
        key, index); None when it has no record, or only the record its start wrote
        and no task (deleted before its first attempt: the record expires)."""
        redis = self._conn.redis
        record = await read_run(redis, queue, run_id)
        if record is None:
            return None
        try:
            task: StoredTask | None = await self._rdb.get_task(queue, run_id)
        except TaskNotFoundError:
            if record.get("state") == b"pending":
                return None
            task = None
        signal = None
        waiting = open_signal_wait(record)
        if waiting is not None:
            index, signature = waiting
            splits = signal_splits(signature)
            member = f"{run_id} {index}"
            for name, key in splits:
                if await redis.sismember(keys.awaiting_key(queue, name, key), member):
                    signal = (name, key, index)
                    break
            else:  # taken meanwhile: its name as the signature reads most simply
                signal = (*splits[0], index) if splits else None
        return record, task, signal

    async def get_durable_run(self, queue: str, run_id: str) -> DurableRunInfo:
        """A durable run of *queue*: its state, every entry of its record in order (what
        the function asked for, its result or error, its deadline) and what it waits for.

        A run started with ``start()`` and not attempted yet is ``pending``, with no
        entries. Raises DurableRunNotFoundError when the run has no record (a run
        enqueued otherwise, a child run, not attempted yet; not a durable run; expired
        after its end) or its task was deleted before its first attempt,
        QueueNotFoundError for an unknown queue, ValueError for an id that cannot be a
        run's.
        """
        await self._check_run_name(queue, run_id)
        got = await self._read_durable_run(queue, run_id)
        if got is None:
            raise DurableRunNotFoundError(queue, run_id)
        record, task, signal = got
        return run_info(queue, run_id, record, task, signal[:2] if signal else None)

    async def durable_runs(
        self, queue: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> DurableRunPage:
        """A page of at most *limit* durable runs (of *queue*, or of every queue in name
        order) that have a record (a run started with ``start()`` has one at once), in
        SCAN's order; pass the page's
        :attr:`~DurableRunPage.cursor` back for the next one. As :meth:`workflows`,
        there is no index: a page may hold fewer than *limit* rows and still have a
        cursor. Raises ValueError for a bad *limit* or *cursor*.
        """
        if queue is not None:
            await self._require_queue(queue)

        async def read(qname: str, run_id: str) -> DurableRunSummary | None:
            got = await self._read_durable_run(qname, run_id)
            if got is None:  # expired since SCAN saw it
                return None
            record, task, signal = got
            return run_summary(
                run_info(qname, run_id, record, task, signal[:2] if signal else None)
            )

        found, next_cursor = await self._scan_page(
            "durable run",
            [queue] if queue is not None else await self.queues(),
            lambda qname: keys.run_key(qname, ""),
            read,
            limit=limit,
            cursor=cursor,
        )
        return DurableRunPage(found, next_cursor)

    async def cancel_durable_run(self, queue: str, run_id: str) -> str:
        """Cancel a durable run; its state before the call (only ``pending``, ``running``
        and ``waiting`` change).

        A run pending (not attempted yet), waiting or retrying is archived at once with the error
        ``context canceled: durable run cancelled``, its record marked cancelled, and
        it leaves the signal wait it sits in: all in one script. A run whose attempt
        is active is marked cancelled and its attempt stopped through Pub/Sub (as
        :meth:`cancel` with ``retry=False``): its worker archives it; if the attempt
        suspends first, the run waits again and can be cancelled then. Nothing
        recorded is removed; steps already enqueued still run and are recorded.
        Raises DurableRunNotFoundError when the run has no record.
        """
        await self._check_run_name(queue, run_id)
        for _ in range(3):  # the task moved between the read and the script: read again
            got = await self._read_durable_run(queue, run_id)
            if got is None:
                raise DurableRunNotFoundError(queue, run_id)
            _, task, signal = got
            now = self._clock()
            if task is not None and not task.decodable:
                raise FailedPreconditionError(
                    f"durable run {run_id!r}: its task's message cannot be decoded "
                    f"({task.message.error_msg}); archive or delete the task instead"
                )
            archived = (
                b""
                if task is None
                else encode_with(task.message, error_msg=CANCELED_ERROR, last_failed_at=int(now))
            )
            before = await cancel_run(
                self._conn.redis,
                queue,
                run_id,
                task_state="" if task is None else str(task.state),
                archived_msg=archived,
                signal=signal,
                expire_in=FAILED_RUN_KEPT,
                now=now,
            )
            if before == "moved":
                continue
            if before == "gone":
                raise DurableRunNotFoundError(queue, run_id)
            if before == "pending" and task is not None and task.state is TaskState.ACTIVE:
                before = "running"  # its first attempt runs: as get_durable_run says
            if task is not None and task.state is TaskState.ACTIVE and before in (
                "running", "waiting",
            ):  # fmt: skip
                await self._rdb.publish_stop(run_id)
            _log.info("durable run cancelled", queue=queue, run_id=run_id, before=before)
            return run_state(before, None) if before in ("succeeded", "failed") else before
        raise FailedPreconditionError(
            f"durable run {run_id!r} kept changing state while being cancelled; try again"
        )

    async def signal(
        self,
        queue: str,
        name: str,
        *,
        key: str = "",
        payload: Any = None,
        keep: timedelta = timedelta(hours=24),
    ) -> int:
        """Send the signal *name* / *key* with a JSON *payload* to the durable runs of
        *queue* waiting for it, as :meth:`asyncq.App.signal` does; how many took it
        (0: it is kept *keep* for the first run to wait for it).

        Raises ValueError for a name or key holding a brace, a payload that is not
        JSON-serializable, or a *keep* that is not a positive timedelta.
        """
        await self._require_queue(queue)
        keys.refuse_braces("signal name", name)
        keys.refuse_braces("signal key", key)
        if not name:
            raise ValueError("signal name cannot be empty")
        if not isinstance(keep, timedelta) or keep <= timedelta(0):
            raise ValueError(f"keep must be a positive timedelta, got {keep!r}")
        try:
            data = pydantic_core.to_json(payload)
        except pydantic_core.PydanticSerializationError as exc:
            raise ValueError(f"the signal's payload is not JSON: {exc}") from None
        return await send_signal(
            self._conn.redis,
            queue,
            name,
            key,
            payload=data,
            keep_ms=max(1, int(keep.total_seconds() * 1000)),
            now=self._clock(),
        )

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
                **_server_flow(await self._rdb.server_queue_flow(s.host, s.pid, s.server_id)),
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


_FLOW_SETTINGS = ("limit", "local", "rate", "ordered")


def _configured_for(queue: str, flows: list[dict[str, str]]) -> dict[str, dict[str, int]]:
    """What the servers' flow records configure for *queue*: setting -> value -> servers.

    As a server resolves them: an explicit name wins over a pattern, else the
    first pattern (in the server's order) that matches.
    """
    out: dict[str, Counter[str]] = {}
    for record in flows:
        for setting in _FLOW_SETTINGS:
            value = record.get(f"{setting}:{queue}")
            if value is None:
                prefix = f"{setting}:"
                for name, v in record.items():
                    pattern = name[len(prefix) :]
                    if (
                        name.startswith(prefix)
                        and any(c in pattern for c in "*?[")
                        and fnmatch.fnmatchcase(queue, pattern)
                    ):
                        value = v
                        break
            if value is not None:
                shown = "yes" if setting == "ordered" else value
                out.setdefault(setting, Counter())[shown] += 1
    return {setting: dict(values) for setting, values in out.items()}


def _server_flow(record: dict[str, str]) -> dict[str, Any]:
    """A server's flow record as ServerInfo fields."""
    fields: dict[str, Any] = {
        "queue_concurrency": {},
        "local_queue_concurrency": {},
        "rate_limits": {},
        "ordered_queues": [],
    }
    for name, value in record.items():
        setting, _, queue = name.partition(":")
        try:
            if setting == "limit":
                fields["queue_concurrency"][queue] = int(value)
            elif setting == "local":
                fields["local_queue_concurrency"][queue] = int(value)
            elif setting == "rate":
                fields["rate_limits"][queue] = value
            elif setting == "ordered":
                fields["ordered_queues"].append(queue)
        except ValueError:
            continue  # a record written by something else: skipped, not fatal
    return fields


def _bucket_rate_text(bucket: RateBucket) -> str:
    """The rate a bucket was written with: ``50/s``, or ``10/s burst 1`` when it holds
    fewer tokens than one period's count (a bucket holding more reads ``3/3s``)."""
    text = _rate_text(bucket.burst, bucket.period_us)
    if text.endswith(("/s", "/min", "/h")):
        return text
    interval = max(1, bucket.period_us // max(1, bucket.burst))
    for unit, size in (("s", 1_000_000), ("min", 60_000_000), ("h", 3_600_000_000)):
        count = round(size / interval)
        if count >= 1 and abs(count * interval - size) < count:
            return f"{count}/{unit} burst {bucket.burst}" if count > bucket.burst else text
    return text


def _rate_text(count: int, period_us: int) -> str:
    """``50/s``, ``600/min``, ``10/h``; another period in seconds (``7/2.5s``)."""
    for unit, size in (("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000)):
        if abs(period_us - size) < count:  # the interval is rounded down to a µs
            return f"{count}/{unit}"
    return f"{count}/{period_us / 1_000_000:g}s"
