"""The async Client: puts tasks into Redis exactly as Go asynq's ``Client.Enqueue`` does."""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from typing_extensions import Unpack

from asyncq import _keys as keys
from asyncq._broker import BatchItem, Broker
from asyncq._broker.replication import replica_wait_seconds
from asyncq._logging import is_debug_enabled
from asyncq._redis.connection import Connection
from asyncq._redis.options import RedisClient, RedisTarget
from asyncq._time import require_aware, to_unix
from asyncq.proto.asynq import TaskMessage
from asyncq.results import DEFAULT_POLL_INTERVAL, ResultWaiter, seconds
from asyncq.retry import DEFAULT_RETRY, RetryPolicy, write_with_retry
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskState

__all__ = ["DEFAULT_MAX_RETRY", "DEFAULT_QUEUE", "DEFAULT_TIMEOUT", "Client"]

DEFAULT_MAX_RETRY = 25
"""Retries a task gets when ``max_retry`` is not given (asynq's default)."""
DEFAULT_QUEUE = "default"
"""Queue used when ``queue`` is not given."""
DEFAULT_TIMEOUT = timedelta(minutes=30)
"""Timeout stored when neither ``timeout`` nor ``deadline`` is given."""

_MAX_INT32 = 2**31 - 1
_SECOND = timedelta(seconds=1)
_OPTION_NAMES = frozenset(EnqueueOptions.__annotations__)

log = structlog.get_logger("asyncq")


@dataclass(slots=True)
class _Composed:
    """A task message ready for the broker, and where it goes."""

    message: TaskMessage
    state: TaskState
    process_at: datetime  # when it becomes ready; == now for pending/aggregating
    unique_ttl: int | None  # the unique lock's whole TTL in seconds; None: no lock
    group: str | None

    def batch_item(self) -> BatchItem:
        """This task as a :class:`BatchItem`, routed exactly as :meth:`Client.enqueue` routes it."""
        return BatchItem(
            self.message,
            process_at=self.process_at if self.state is TaskState.SCHEDULED else None,
            unique_ttl=self.unique_ttl,
            group=self.group if self.state is TaskState.AGGREGATING else None,
        )


# The RFC 4122 variant nibble (10xx) for each random hex digit, as uuid.uuid4() sets it.
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def _new_task_id() -> str:
    """A random UUID4 in its canonical text form (what ``str(uuid.uuid4())`` gives, 3x faster)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def _check_option_names(options: Mapping[str, object], where: str) -> None:
    if options.keys() <= _OPTION_NAMES:
        return
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise TypeError(
            f"unknown enqueue option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"in {where} (known: {', '.join(sorted(_OPTION_NAMES))})"
        )


def _merge(levels: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """Later levels win, key by key; None means "not set" at that level.

    ``process_at`` and ``process_in`` are one setting: a level that gives
    either replaces both from earlier levels, and giving both in one level is
    an error (asynq silently lets the later one win).
    """
    merged: dict[str, object] = {}
    for level in levels:
        if not level:
            continue
        given = {k: v for k, v in level.items() if v is not None and k != "headers"}
        if "process_at" in given and "process_in" in given:
            raise ValueError("give process_at or process_in, not both")
        if "process_at" in given or "process_in" in given:
            merged.pop("process_at", None)
            merged.pop("process_in", None)
        merged.update(given)
    return merged


def _merge_headers(task: Task, levels: Sequence[Mapping[str, object]]) -> dict[str, str]:
    headers = dict(task.headers)
    for level in levels:
        if not level:
            continue
        extra = level.get("headers")
        if extra is None:
            continue
        if not isinstance(extra, Mapping):
            raise TypeError(f"headers must be a mapping of str to str, got {type(extra).__name__}")
        headers.update(extra)
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"header keys and values must be str, got {type(key).__name__}: "
                f"{type(value).__name__} for {key!r}"
            )
    return headers


def _non_blank(opts: Mapping[str, object], name: str, message: str) -> str | None:
    value = opts.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(message)
    return value


def _duration(opts: Mapping[str, object], name: str) -> timedelta | None:
    value = opts.get(name)
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {type(value).__name__}")
    if value < timedelta(0):
        raise ValueError(f"{name} cannot be negative, got {value!r}")
    return value


def _whole_seconds(value: timedelta) -> int:
    """Whole seconds of a non-negative duration, exactly.

    Integer division, not ``total_seconds()``: the float rounds values near
    ``timedelta.max`` up past what a timedelta (and so TaskInfo) can hold.
    Every timedelta fits asynq's int64 seconds this way.
    """
    return value // _SECOND


def _instant(opts: Mapping[str, object], name: str) -> datetime | None:
    value = opts.get(name)
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime.datetime, got {type(value).__name__}")
    return require_aware(value, name)


def _compose(task: Task, levels: Sequence[Mapping[str, object]], now: datetime) -> _Composed:
    """asynq's composeOptions + message construction + routing decision (spec section 1.3)."""
    if not isinstance(task, Task):
        raise TypeError(f"expected an asyncq Task, got {type(task).__name__}")
    if not isinstance(task.type, str) or not task.type.strip():
        raise ValueError("task typename cannot be empty")
    levels = [task.options, *levels]
    for i, level in enumerate(levels):
        _check_option_names(level, "the task's options" if i == 0 else "the enqueue options")
    opts = _merge(levels)
    headers = _merge_headers(task, levels)

    queue = _non_blank(opts, "queue", "queue name must contain one or more characters")
    queue = DEFAULT_QUEUE if queue is None else queue
    task_id = _non_blank(opts, "task_id", "task ID cannot be empty")
    task_id = _new_task_id() if task_id is None else task_id
    group = _non_blank(opts, "group", "group key cannot be empty")
    keys.validate_queue_name(queue)
    keys.refuse_braces("task ID", task_id)
    if group is not None:
        keys.refuse_braces("group", group)

    max_retry = opts.get("max_retry", DEFAULT_MAX_RETRY)
    if isinstance(max_retry, bool) or not isinstance(max_retry, int):
        raise TypeError(f"max_retry must be an int, got {type(max_retry).__name__}")
    if max_retry < 0:
        # asynq clamps a negative MaxRetry to 0; a negative count is a bug, so say so.
        raise ValueError(f"max_retry cannot be negative, got {max_retry}")
    if max_retry > _MAX_INT32:
        raise ValueError(f"max_retry must fit in 32 bits, got {max_retry}")

    timeout = _duration(opts, "timeout")
    if timeout is not None and timedelta(0) < timeout < timedelta(seconds=1):
        # Stored as whole seconds: a sub-second timeout would become 0 = "no timeout".
        raise ValueError(f"timeout must be at least 1s (asynq stores whole seconds), got {timeout}")
    deadline = _instant(opts, "deadline")
    if not timeout and deadline is None:
        timeout = DEFAULT_TIMEOUT

    unique = _duration(opts, "unique")
    if unique is not None and unique < timedelta(seconds=1):
        raise ValueError("Unique TTL cannot be less than 1s")
    retention = _duration(opts, "retention")

    process_at = _instant(opts, "process_at")
    process_in = _duration(opts, "process_in")
    if process_in is not None:
        try:
            process_at = now + process_in
        except OverflowError:
            raise ValueError(f"process_in is too far in the future: {process_in!r}") from None
    if process_at is None:
        process_at = now

    message = TaskMessage(
        type=task.type,
        payload=b"" if task.payload is None else task.payload,
        headers=headers,
        id=task_id,
        queue=queue,
        retry=max_retry,
        timeout=_whole_seconds(timeout) if timeout else 0,
        deadline=to_unix(deadline) if deadline is not None else 0,
        unique_key=keys.unique_key(queue, task.type, task.payload) if unique else "",
        group_key=group or "",
        retention=_whole_seconds(retention) if retention else 0,
    )
    if process_at > now:
        state = TaskState.SCHEDULED  # scheduling wins over grouping, as in asynq
    elif group is not None:
        state = TaskState.AGGREGATING
    else:
        state = TaskState.PENDING
    unique_ttl = None
    if unique is not None:
        # A scheduled task's lock lasts until it is due plus the uniqueness period (asynq).
        try:
            lock = process_at - now + unique if state is TaskState.SCHEDULED else unique
        except OverflowError:
            raise ValueError(
                f"unique is too long for process_at {process_at}: {unique!r}"
            ) from None
        unique_ttl = _whole_seconds(lock)
    return _Composed(message, state, process_at.astimezone(UTC), unique_ttl, group)


def _info(c: _Composed, now: datetime) -> TaskInfo:
    next_process_at = {
        TaskState.PENDING: now,
        TaskState.SCHEDULED: c.process_at,
        TaskState.AGGREGATING: None,
    }[c.state]
    return TaskInfo.from_message(c.message, c.state, next_process_at)


class Client:
    """Enqueues tasks into Redis for asyncq or Go asynq servers.

    *redis* is a URI (``redis://``, ``rediss://``, ``redis-socket://``,
    ``redis-sentinel://``, ``redis-cluster://``; see :mod:`asyncq._redis.connection`),
    parsed connection options, a ready ``redis.asyncio`` client, or an
    :class:`~asyncq._redis.connection.Connection` (its fast transport included)
    shared with another component. A client made from a URI or options is
    closed by :meth:`aclose`; a ready client or a Connection is shared and
    left open.

    *retry* (a :class:`~asyncq.retry.RetryPolicy`; default: up to 5 s) retries
    :meth:`enqueue` through connection-level failures such as a Sentinel
    failover, without ever writing a task twice; ``retry=None`` turns it off.

    Usage::

        async with Client("redis://localhost:6379/0") as client:
            info = await client.enqueue(Task("email:welcome", b"..."), queue="critical")

    ``min_replicas=N`` (opt-in) makes every enqueue wait, with Redis ``WAIT``,
    until N replicas acknowledged the write, at most ``replica_timeout``
    (1 s); fewer raises :class:`~asyncq.errors.ReplicationTimeoutError`,
    whose ``written`` is True: the task is on the master, only not yet known
    to survive a failover. Not available on Redis Cluster.
    """

    __slots__ = ("_closed", "_conn", "_owns_conn", "_waiter", "broker", "retry")

    def __init__(
        self,
        redis: RedisTarget | Connection,
        *,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        min_replicas: int = 0,
        replica_timeout: timedelta = timedelta(seconds=1),
    ) -> None:
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy or None, got {retry.__class__.__name__}")
        self.retry = retry
        timeout = replica_wait_seconds(min_replicas, replica_timeout)
        if isinstance(redis, Connection):
            if redis.closed:
                raise RuntimeError("the connection is closed")
            self._conn, self._owns_conn = redis, False
        else:
            self._conn, self._owns_conn = Connection(redis), True
        self._closed = False
        self._waiter: ResultWaiter | None = None
        self.broker = Broker(
            self._conn.redis,
            fast=self._conn.fast,
            min_replicas=min_replicas,
            replica_timeout=timeout,
        )

    @property
    def redis(self) -> RedisClient:
        """The underlying redis-py client."""
        return self._conn.redis

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` ran (or a shared Connection was closed by its owner)."""
        return self._closed or self._conn.closed

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection if this client made it (a shared one stays open); idempotent."""
        self._closed = True
        if self._waiter is not None:
            await self._waiter.aclose()
        if self._owns_conn:
            await self._conn.aclose()

    async def ping(self) -> None:
        """Check that Redis answers; raises a redis-py error when it does not."""
        self._check_open()
        await self.redis.ping()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the client is closed")

    async def enqueue(self, task: Task, **options: Unpack[EnqueueOptions]) -> TaskInfo:
        """Put *task* into Redis and return its TaskInfo.

        Options (all keyword, all optional; options given to ``Task(...)`` are
        defaults that these override, and ``None`` means "not set"):

        - ``queue``: target queue, default ``"default"``.
        - ``max_retry``: retries after a failure, default 25 (negative: ValueError;
          asynq clamps it to 0 instead).
        - ``timeout``: longest a single run may take (whole seconds, at least 1 s).
          When neither ``timeout`` nor ``deadline`` is given, 30 minutes.
        - ``deadline``: absolute time by which the task must finish.
        - ``unique``: hold a uniqueness lock on (queue, type, payload) for this
          long (>= 1 s); a second enqueue meanwhile raises DuplicateTaskError.
        - ``process_at`` / ``process_in``: run at that time / after that delay
          (give one, not both); a time in the future makes the task scheduled.
        - ``task_id``: explicit ID (default: a random UUID4); an ID that already
          exists raises TaskIdConflictError.
        - ``retention``: keep the task as completed this long after success.
        - ``group``: aggregate into this group (ignored in favour of scheduling
          when ``process_at``/``process_in`` is in the future, as in asynq).
        - ``headers``: merged over the task's headers.

        Datetimes must be timezone-aware: naive ones raise ValueError rather
        than being guessed as UTC or local time.

        Raises ValueError/TypeError naming the bad option, DuplicateTaskError,
        TaskIdConflictError, or, when Redis stays unreachable past the retry
        policy's deadline, EnqueueRetryError saying whether the task may have
        been written (with ``retry=None``: the redis-py error at once).
        """
        self._check_open()
        now = datetime.now(UTC)
        c = _compose(task, [options], now)
        msg = c.message
        # The client describes the write; the broker plans and runs it (as for a batch).
        # The task id is fixed in msg: a retry after a lost reply finds its own task.
        item = c.batch_item()
        await write_with_retry(self.retry, self.redis, msg, lambda: self.broker.write(item))
        if is_debug_enabled(log):
            log.debug(
                "task enqueued",
                task_id=msg.id,
                task_type=msg.type,
                queue=msg.queue,
                state=c.state.value,
            )
        return _info(c, now)

    async def wait(
        self,
        task_id: str,
        *,
        queue: str = DEFAULT_QUEUE,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 - the result's own timeout, as arq/saq/streaq
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    ) -> TaskInfo:
        """Wait until the task completes and return its TaskInfo (``result`` holds its result).

        Woken by the worker's completion notification, re-reading the task
        every *poll_interval* as well (Go workers publish none). Raises
        TimeoutError after *timeout* (None: no limit), TaskFailedError (with
        ``last_error``) when the task is archived, TaskNotFoundError when it
        does not exist (never enqueued, or completed without a retention).
        See :mod:`asyncq.results`.
        """
        self._check_open()
        limit = seconds(timeout, "timeout")
        poll = seconds(poll_interval, "poll_interval")
        if not poll:
            raise ValueError("poll_interval must be positive")
        if self._waiter is None:
            self._waiter = ResultWaiter(self.redis)
        return await self._waiter.wait(task_id, queue, timeout=limit, poll_interval=poll)

    async def enqueue_many(
        self,
        tasks: Iterable[Task | tuple[Task, EnqueueOptions]],
        **options: Unpack[EnqueueOptions],
    ) -> list[TaskInfo | Exception]:
        """Enqueue many tasks in one Redis pipeline; one result per item, in order.

        Each item is a Task or a ``(task, options)`` pair. *options* apply to
        every item; an item's own options override them, and both override
        the task's. Every option of :meth:`enqueue` is accepted (asynq's
        batch refuses ``group`` and ``unique``) and each item is routed and
        written exactly as :meth:`enqueue` would write it. Each result is the
        item's TaskInfo or the exception that kept it out of Redis: a
        ValueError/TypeError for invalid options, DuplicateTaskError, or
        TaskIdConflictError. Items are written in order, so of two items with
        the same unique lock or task ID the first wins. Items are written
        independently (no transaction); a Redis connection error is raised
        for the whole call, and then some items may have been written.
        """
        self._check_open()
        _check_option_names(options, "the enqueue_many options")
        now = datetime.now(UTC)
        results: list[TaskInfo | Exception | None] = []
        batch: list[BatchItem] = []
        pending: list[tuple[int, _Composed]] = []
        for item in tasks:
            try:
                c = self._compose_batch_item(item, options, now)
            except (TypeError, ValueError) as exc:
                results.append(exc)
                continue
            pending.append((len(results), c))
            results.append(None)  # filled in from the broker's outcome below
            batch.append(c.batch_item())
        if batch:
            outcomes = await self.broker.enqueue_batch(batch)
            if len(outcomes) != len(batch):
                raise RuntimeError(
                    f"broker returned {len(outcomes)} results for a batch of {len(batch)}"
                )
            for (index, c), outcome in zip(pending, outcomes, strict=True):
                results[index] = _info(c, now) if outcome is None else outcome
        final = [r for r in results if r is not None]
        assert len(final) == len(results)
        if is_debug_enabled(log):
            written = sum(isinstance(r, TaskInfo) for r in final)
            log.debug("batch enqueued", items=len(final), written=written)
        return final

    @staticmethod
    def _compose_batch_item(
        item: Task | tuple[Task, EnqueueOptions], common: EnqueueOptions, now: datetime
    ) -> _Composed:
        own: Mapping[str, Any] = {}
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], Mapping):
                raise TypeError("a batch item must be a Task or a (Task, options dict) pair")
            item, own = item
        return _compose(item, [common, own], now)
