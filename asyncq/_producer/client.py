"""The async Client: puts tasks into Redis exactly as Go asynq's ``Client.Enqueue`` does."""

from __future__ import annotations

import types
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from datetime import UTC, datetime, timedelta
from typing import Any

from typing_extensions import Unpack

from asyncq._broker import BatchItem, Broker, PendingItem
from asyncq._broker.durable import start_run
from asyncq._broker.replication import replica_wait_seconds
from asyncq._broker.workflow import WORKFLOW_HEADER
from asyncq._duration import wait_seconds
from asyncq._keys import task_key
from asyncq._logging import DebugCheck, LazyLogger, is_debug_enabled
from asyncq._producer.completion import DEFAULT_POLL_INTERVAL, ResultWaiter
from asyncq._producer.compose import (
    DEFAULT_MAX_RETRY,
    DEFAULT_QUEUE,
    DEFAULT_TIMEOUT,
    Composed,
    Plain,
    Templates,
    check_option_names,
    compose,
    info_of,
)
from asyncq._producer.failover import (
    DEFAULT_RETRY,
    RetryPolicy,
    Written,
    is_retryable,
    write_with_retry,
)
from asyncq._redis.connection import Connection
from asyncq._redis.options import RedisClient, RedisTarget
from asyncq.events import Event, EventLog, QueueFilter, read_events
from asyncq.progress import watch_progress
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskProgress, TaskState

__all__ = ["DEFAULT_MAX_RETRY", "DEFAULT_QUEUE", "DEFAULT_TIMEOUT", "Client"]


log: Any = LazyLogger()


class Client:
    """Enqueues tasks into Redis for asyncq or Go asynq servers.

    *redis* is a URI (``redis://``, ``rediss://``, ``redis-socket://``,
    ``redis-sentinel://``, ``redis-cluster://``; see :mod:`asyncq._redis.connection`),
    parsed connection options, a ready ``redis.asyncio`` client, or an
    :class:`~asyncq._redis.connection.Connection` (its fast transport included)
    shared with another component. A client made from a URI or options is
    closed by :meth:`aclose`; a ready client or a Connection is shared and
    left open.

    *retry* (a :class:`~asyncq._producer.failover.RetryPolicy`; default: up to 5 s) retries
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

    ``events=True`` (or a list of queue names and patterns) writes an
    ``enqueued`` event to the event stream for each task enqueued into those
    queues (see :meth:`events` and :mod:`asyncq.events`).
    """

    __slots__ = (
        "_closed",
        "_conn",
        "_debug",
        "_events",
        "_owns_conn",
        "_templates",
        "_waiter",
        "broker",
        "retry",
    )

    def __init__(
        self,
        redis: RedisTarget | Connection,
        *,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        min_replicas: int = 0,
        replica_timeout: timedelta = timedelta(seconds=1),
        events: bool | Sequence[str] = False,
    ) -> None:
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy or None, got {retry.__class__.__name__}")
        self.retry = retry
        timeout = replica_wait_seconds(min_replicas, replica_timeout)
        event_queues = QueueFilter(events)
        if isinstance(redis, Connection):
            if redis.closed:
                raise RuntimeError("the connection is closed")
            self._conn, self._owns_conn = redis, False
        else:
            self._conn, self._owns_conn = Connection(redis), True
        self._closed = False
        self._waiter: ResultWaiter | None = None
        self._templates = Templates()
        self._debug = DebugCheck(log)
        self.broker = Broker(
            self._conn.redis,
            fast=self._conn.fast,
            min_replicas=min_replicas,
            replica_timeout=timeout,
        )
        self._events = EventLog(self.broker, event_queues) if event_queues.enabled else None

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
        if self._events is not None:
            await self._events.aclose()
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
        if self._closed or self._conn.closed:
            raise RuntimeError("the client is closed")
        now = datetime.now(UTC)
        template = self._templates.find(task, options) if isinstance(task, Task) else None
        if template is not None:
            # The hot path: a plain pending task whose option set was composed before.
            # One coroutine below this one (the broker's), and nothing built for a retry
            # unless a write failed.
            plain = template.encode(task)
            queue, task_id, data = template.queue, plain.task_id, plain.data
            broker = self.broker
            try:
                await broker.write_pending(queue, task_id, data)
            except BaseException as exc:
                if self.retry is None or not is_retryable(exc):
                    raise
                await write_with_retry(
                    self.retry,
                    self.redis,
                    Written(task_id, queue, plain.task_type, data, ""),
                    lambda: broker.write_pending(queue, task_id, data),
                    first_error=exc,
                )
            info = plain.info(now)
        else:
            # The general path: every option, through compose (which also teaches the
            # template). The client describes the write; the broker plans and runs it (as
            # for a batch). The task id is fixed in msg: a retry after a lost reply finds
            # its own task.
            c = compose(task, [options], now)
            item = c.batch_item()
            await self._write(lambda: self.broker.write(item), lambda: Written.of(c.message))
            key = self._templates.key(task, self._templates.call_key(options))
            if key is not None:
                self._templates.learn(key, c)
            info = info_of(c, now)
        if self._debug():
            log.debug(
                "task enqueued",
                task_id=info.id,
                task_type=info.type,
                queue=info.queue,
                state=info.state.value,
            )
        if self._events is not None:
            wid = info.headers.get(WORKFLOW_HEADER, "")
            self._events.add("enqueued", info.queue, info.type, info.id, workflow=wid)
        return info

    async def _start_run(self, task: Task) -> TaskInfo:
        """Enqueue *task*, a durable function's run (pending, its decorator's options), with
        its record saying ``pending``, in one script: the Inspector lists the run before
        its first attempt (see :func:`asyncq._broker.durable.start_run`). Raises what
        :meth:`enqueue` raises."""
        if self._closed or self._conn.closed:
            raise RuntimeError("the client is closed")
        now = datetime.now(UTC)
        c = compose(task, [{}], now)
        if c.state is not TaskState.PENDING or c.unique_ttl is not None:
            # a durable function's options (queue, max_retry, timeout, retention) are
            # never these; a run that does not start at once would have no place to wait
            raise ValueError(
                f"a run of {task.type!r} must start at once (no schedule, group or unique)"
            )
        msg = c.message
        await self._write(lambda: start_run(self.broker, msg), lambda: Written.of(msg))
        info = info_of(c, now)
        if self._events is not None:
            self._events.add("enqueued", info.queue, info.type, info.id)
        return info

    async def _write(
        self, write: Callable[[], Awaitable[object]], written: Callable[[], Written]
    ) -> None:
        """One enqueue write; after a connection-level failure, the retry policy's attempts
        (*written* describes the task for them, built only then)."""
        try:
            await write()
        except BaseException as exc:
            if self.retry is None or not is_retryable(exc):
                raise
            await write_with_retry(self.retry, self.redis, written(), write, first_error=exc)

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
        See :mod:`asyncq._producer.completion`.
        """
        self._check_open()
        limit = wait_seconds(timeout, "timeout")
        poll = wait_seconds(poll_interval, "poll_interval")
        if not poll:
            raise ValueError("poll_interval must be positive")
        if self._waiter is None:
            self._waiter = ResultWaiter(self.redis)
        return await self._waiter.wait(task_id, queue, timeout=limit, poll_interval=poll)

    def progress(
        self,
        task_id: str,
        *,
        queue: str = DEFAULT_QUEUE,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    ) -> AsyncIterator[TaskProgress]:
        """Stream the task's progress: ``async for update in client.progress(task_id)``.

        Yields the stored progress first, then each update the handler
        reports (pushed over Pub/Sub, see :mod:`asyncq.progress`); ends when
        the task is completed, archived or gone (checked on its completion
        notification and every *poll_interval*).
        """
        self._check_open()
        poll = wait_seconds(poll_interval, "poll_interval")
        if not poll:
            raise ValueError("poll_interval must be positive")
        redis = self.redis

        async def state() -> TaskState | None:
            raw = await redis.hget(task_key(queue, task_id), "state")
            if raw is None:
                return None
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            return TaskState(text) if text in TaskState._value2member_map_ else None

        return watch_progress(redis, queue, task_id, state=state, poll_interval=poll)

    def events(
        self,
        *,
        queues: Collection[str] | None = None,
        types: Collection[str] | None = None,
        kinds: Collection[str] | None = None,
        workflows: Collection[str] | None = None,
        task_ids: Collection[str] | None = None,
        since: str | datetime | None = None,
    ) -> AsyncIterator[Event]:
        """Stream task events: ``async for event in client.events(queues=["emails"])``.

        Filters: *queues*, *types* (task types), *kinds* (``enqueued``,
        ``started``, ``progress``, ``succeeded``, ``failed``, ``cancelled``,
        ``retried``, ``archived``), *workflows* (workflow ids: their steps'
        events) and *task_ids*; None means all. *since*: None for only new
        events, an :attr:`Event.id` to resume after it, ``"0"`` for the oldest
        kept, or an aware datetime. It never ends by itself; each caller reads
        the stream independently. Only queues whose servers (and clients)
        have ``events=`` on produce events: see :mod:`asyncq.events`. An
        entry that is not a readable event is left out and named in a warning
        log line (:class:`asyncq.events.SkippedEvent`).
        """
        self._check_open()
        return read_events(
            self.redis, queues=queues, types=types, kinds=kinds, workflows=workflows,
            task_ids=task_ids, since=since,
        )  # fmt: skip

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
        check_option_names(options, "the enqueue_many options")
        now = datetime.now(UTC)
        templates = self._templates
        call_key = templates.call_key(options)
        results: list[TaskInfo | Exception | None] = []
        batch: list[BatchItem | PendingItem] = []
        # per written item: its index in results, and its Composed or its hot-path parts
        pending: list[tuple[int, Composed | None, Plain | None]] = []
        items = tasks if isinstance(tasks, list | tuple) else list(tasks)
        # the key of a task with no options of its own, the usual batch item
        bare_key = None if call_key is None else ((), call_key)
        for item in items:
            try:
                if isinstance(item, Task):
                    key = bare_key if not item.options else templates.key(item, call_key)
                else:
                    key = None
                template = None if key is None else templates.get(key)
                if template is not None:
                    assert isinstance(item, Task)
                    plain = template.encode(item)
                    batch.append(PendingItem(template.queue, plain.task_id, plain.data))
                    pending.append((len(results), None, plain))
                    results.append(None)  # filled in from the broker's outcome below
                    continue
                c = self._compose_batch_item(item, options, now)
                if key is not None:
                    templates.learn(key, c)
            except (TypeError, ValueError) as exc:
                results.append(exc)
                continue
            pending.append((len(results), c, None))
            results.append(None)
            batch.append(c.batch_item())
        if batch:
            outcomes = await self.broker.enqueue_batch(batch)
            if len(outcomes) != len(batch):
                raise RuntimeError(
                    f"broker returned {len(outcomes)} results for a batch of {len(batch)}"
                )
            for (index, composed, parts), outcome in zip(pending, outcomes, strict=True):
                if outcome is not None:
                    results[index] = outcome
                elif composed is not None:
                    results[index] = info_of(composed, now)
                else:
                    assert parts is not None
                    results[index] = parts.info(now)
        final = [r for r in results if r is not None]
        assert len(final) == len(results)
        if self._events is not None:
            for info in final:
                if isinstance(info, TaskInfo):
                    wid = info.headers.get(WORKFLOW_HEADER, "")
                    self._events.add("enqueued", info.queue, info.type, info.id, workflow=wid)
        if is_debug_enabled(log):
            written = sum(isinstance(r, TaskInfo) for r in final)
            log.debug("batch enqueued", items=len(final), written=written)
        return final

    @staticmethod
    def _compose_batch_item(
        item: Task | tuple[Task, EnqueueOptions], common: EnqueueOptions, now: datetime
    ) -> Composed:
        own: Mapping[str, Any] = {}
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], Mapping):
                raise TypeError("a batch item must be a Task or a (Task, options dict) pair")
            item, own = item
        return compose(item, [common, own], now)
