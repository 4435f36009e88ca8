"""The broker's shared base: key cache, script runner, pipelines and helpers.

See :mod:`asyncq._broker.broker` for the conventions every transition follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from asyncq import _keys as keys
from asyncq._broker.replication import Replication
from asyncq._codec import decode_task_message, encode_task_message
from asyncq._duration import ttl_seconds
from asyncq._logging import error_text
from asyncq._redis.errors import REDIS_ERRORS, is_out_of_memory
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import Script, load_script
from asyncq._redis.transport import FastConnection
from asyncq.errors import (
    BrokerError,
    DuplicateTaskError,
    RedisOutOfMemoryError,
    TaskIdConflictError,
    TaskNotFoundError,
)
from asyncq.proto.asynq import (
    TaskMessage,
)

_log = structlog.get_logger("asyncq")

__all__ = [
    "AGGREGATION_TIMEOUT",
    "ARCHIVED_EXPIRATION",
    "ARCHIVE_MAX_SIZE",
    "LEASE_DURATION",
    "LUA_PACKAGE",
    "SCHEDULER_HISTORY_CAP",
    "STATS_TTL",
    "BrokerBase",
    "usable_message",
]


def usable_message(data: bytes, task_id: str, queue: str | None) -> TaskMessage | str:
    """A stored msg decoded, or why it is unusable here: it cannot be decoded, its id is
    not *task_id*, or (with *queue*) it names another queue, whose keys a handler's
    writes would target."""
    try:
        msg = decode_task_message(data)
    except Exception as exc:  # whatever is wrong with the bytes, never crash the caller
        return f"asyncq: cannot decode task message ({type(exc).__name__}: {exc})"
    if msg.id != task_id:
        problem = f"message id {msg.id!r} does not match task id {task_id!r}"
    elif queue is not None and msg.queue != queue:
        problem = f"message queue {msg.queue!r} does not match queue {queue!r}"
    else:
        return msg
    return f"asyncq: task message unusable here ({problem})"


LUA_PACKAGE = "asyncq._broker"
"""The package whose ``lua/`` folder holds the scripts this broker runs."""

LEASE_DURATION = 30.0
"""Seconds a dequeued task's lease lasts (asynq's LeaseDuration)."""
STATS_TTL = 90 * 24 * 3600
"""Seconds the daily processed/failed counters live after their first increment."""
ARCHIVE_MAX_SIZE = 10_000
"""asynq's maxArchiveSize (the trim keeps the newest 9,999, as asynq does)."""
ARCHIVED_EXPIRATION = 90 * 24 * 3600
"""Archived tasks older than this many seconds are trimmed when a task is archived."""
AGGREGATION_TIMEOUT = 120
"""Seconds an aggregation set may stay staged before the recoverer reclaims it."""
SCHEDULER_HISTORY_CAP = 1000
"""Enqueue events kept per scheduler entry."""
MAX_INT64 = 9223372036854775807


_QUEUE_CACHE_LIMIT = 4096
# Writes that wait for replicas under min_replicas: what a producer is told was enqueued
# and a finished attempt's outcome. Dequeue, leases and housekeeping do not (a lost one
# only makes a task run again, which at-least-once already allows).
DURABLE_SCRIPTS = frozenset(
    (
        "enqueue", "enqueue_unique", "schedule", "schedule_unique", "add_to_group",
        "add_to_group_unique", "done", "mark_as_complete", "ack_many", "retry", "archive",
    )
)  # fmt: skip


class QueueKeys:
    """Every key string of one queue, built once (the hot path reuses them)."""

    __slots__ = (
        "active",
        "aggregation_sets",
        "archived",
        "completed",
        "day",
        "enqueue_call",
        "failed",
        "failed_day",
        "group_prefix",
        "groups",
        "lease",
        "name",
        "paused",
        "pending",
        "processed",
        "processed_day",
        "retry",
        "scheduled",
        "task_prefix",
        "waiters",
        "wakeup",
    )

    def __init__(self, qname: str) -> None:
        self.name = qname
        self.task_prefix = keys.task_key_prefix(qname)
        self.waiters = keys.waiters_key(qname)
        self.pending = keys.pending_key(qname)
        self.active = keys.active_key(qname)
        self.lease = keys.lease_key(qname)
        self.scheduled = keys.scheduled_key(qname)
        self.retry = keys.retry_key(qname)
        self.archived = keys.archived_key(qname)
        self.completed = keys.completed_key(qname)
        self.paused = keys.paused_key(qname)
        self.processed = keys.processed_total_key(qname)
        self.failed = keys.failed_total_key(qname)
        self.groups = keys.all_groups(qname)
        self.group_prefix = keys.group_key_prefix(qname)
        self.aggregation_sets = keys.all_aggregation_sets(qname)
        self.wakeup = keys.wakeup_channel(qname)
        self.day = -1
        self.processed_day = ""
        self.failed_day = ""
        # enqueue.lua's EVALSHA around a task's own parts (the producer builds it once).
        self.enqueue_call: tuple[Any, ...] | None = None

    def daily(self, now: float) -> tuple[str, str]:
        """The processed/failed counters of the UTC day containing *now*."""
        day = int(now // 86400)
        if day != self.day:
            when = datetime.fromtimestamp(now, UTC)
            self.processed_day = keys.processed_key(self.name, when)
            self.failed_day = keys.failed_key(self.name, when)
            self.day = day
        return self.processed_day, self.failed_day


class AckCall:
    """One queue's share of an ack_many batch: the ack_many.lua ARGV being built."""

    __slots__ = ("args", "indices", "kinds", "prefix", "qk")

    def __init__(self, qk: QueueKeys, stats_exp: int) -> None:
        self.qk = qk
        self.prefix = keys.queue_key_prefix(qk.name)
        self.indices: list[int] = []  # positions in the caller's batch
        self.kinds: list[str] = []  # becomes ARGV[5]
        self.args: list[Any] = [qk.task_prefix, self.prefix, stats_exp, MAX_INT64, ""]


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def lock_ttl(ttl: int | float | timedelta) -> int:
    secs = ttl_seconds(ttl, "unique lock TTL")
    if secs < 1:
        raise ValueError(f"unique lock TTL must be at least 1 second, got {ttl!r}")
    return secs


def encode_with(msg: TaskMessage, **changes: Any) -> bytes:
    """The encoded *msg* with some fields changed, leaving *msg* itself as it was.

    asynq writes a modified copy; setting and restoring the fields is cheaper
    than copying and safe because nothing awaits in between.
    """
    saved = {name: getattr(msg, name) for name in changes}
    try:
        for name, value in changes.items():
            setattr(msg, name, value)
        return encode_task_message(msg)
    finally:
        for name, value in saved.items():
            setattr(msg, name, value)


_ARCHIVE_UNDECODABLE = load_script(LUA_PACKAGE, "archive_undecodable")


class BrokerBase:
    """Awaitable asynq operations on one Redis connection (plain, Sentinel or Cluster).

    *redis* must return bytes (``decode_responses=False``): task messages are
    binary protobufs. *clock* returns the current unix time in seconds; every
    "now" of every operation comes from it. *fast*, a pipelined connection to
    the same server and database as *redis* (see
    :class:`~asyncq._redis.transport.FastConnection`), carries the script
    calls and hot-path commands when given; *redis* keeps the rest.
    """

    def __init__(
        self,
        redis: RedisClient,
        *,
        clock: Callable[[], float] = time.time,
        lease_duration: float = LEASE_DURATION,
        fast: FastConnection | None = None,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        if not lease_duration > 0:
            raise ValueError(f"lease_duration must be positive, got {lease_duration}")
        encoder = getattr(redis, "get_encoder", None)
        if encoder is not None and getattr(encoder(), "decode_responses", False):
            raise ValueError(
                "the Redis client decodes responses to str; asyncq needs raw bytes "
                "(create it with decode_responses=False)"
            )
        self.redis = redis
        # Once: RedisCluster's bases include a typing Protocol, so isinstance against it
        # is a slow runtime Protocol check, and the producer asks on every enqueue.
        self.on_cluster = isinstance(redis, RedisCluster)
        self.fast = fast
        self._cmd: RedisClient | FastConnection = redis if fast is None else fast
        self.clock = clock
        self.lease_duration = lease_duration
        self.on_retry: Callable[[float], None] | None = None
        """Told the time (unix s) of each retry :meth:`retry` wrote: a worker's forwarder
        wakes then instead of at its next fixed pass."""
        self._queues: dict[str, QueueKeys] = {}
        self._published: set[str] = set()
        self.replication: Replication | None = None
        if min_replicas:
            if fast is None and self.on_cluster:
                raise ValueError(
                    "min_replicas is not supported on Redis Cluster (WAIT must follow the "
                    "write on the same node connection); use a plain or Sentinel connection"
                )
            self.replication = Replication(min_replicas, replica_timeout)

    # -- helpers ------------------------------------------------------------------------

    def _q(self, qname: str) -> QueueKeys:
        qk = self._queues.get(qname)
        if qk is None:
            keys.validate_queue_name(qname)
            if len(self._queues) >= _QUEUE_CACHE_LIMIT:
                self._queues.clear()
            qk = self._queues[qname] = QueueKeys(qname)
        return qk

    def _msg_queue(self, msg: TaskMessage) -> QueueKeys:
        if not msg.id:
            raise ValueError(f"task message of type {msg.type!r} has no id")
        try:
            return self._q(msg.queue)
        except ValueError as exc:
            if msg.queue.strip():  # a queue name the key schema refuses
                raise ValueError(f"task message {msg.id!r}: {exc}") from None
            raise ValueError(f"task message {msg.id!r} has a blank queue name") from None

    async def register_queue(self, qname: str) -> None:
        """Add *qname* to ``asynq:queues`` (the list the Inspector, CLI and asynqmon
        show), as enqueueing a task there would; raises ValueError for a bad name."""
        await self._register_queue(self._q(qname))

    async def _register_queue(self, qk: QueueKeys) -> None:
        # asynq:queues is what the Inspector, CLI and asynqmon list; SADD once per instance.
        try:
            await self._cmd.execute_command("SADD", keys.ALL_QUEUES, qk.name)
        except ResponseError as exc:
            if is_out_of_memory(exc):
                raise RedisOutOfMemoryError(f"registering queue {qk.name!r}") from exc
            raise
        self._published.add(qk.name)

    async def _run(
        self, script: Script, keys_: Sequence[str], args: Sequence[Any], qname: str, task_id: str
    ) -> Any:
        try:
            if self.replication is not None and script.name in DURABLE_SCRIPTS:
                return await self.replication.script(
                    self._pipeline, self._cmd, script, keys_, args, queue=qname, task_id=task_id
                )
            return await script(self._cmd, keys_, args)
        except ResponseError as exc:
            raise script_error(exc, script, qname, task_id) from exc

    async def confirm_existing(self, queue: str, task_id: str) -> None:
        """Under min_replicas, before a write is refused because its task (or unique
        lock) exists: raise ReplicationTimeoutError unless that is on enough replicas
        (:meth:`Replication.confirm_existing`). A caller retrying an unconfirmed enqueue with
        the same ID is told "conflict" only when the first write is known to survive
        a failover."""
        if self.replication is not None:
            await self.replication.confirm_existing(
                self._pipeline, keys.wakeup_channel(queue), queue=queue, task_id=task_id
            )

    async def _pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Commands in one non-transactional pipeline; error replies come back in place."""
        if self.fast is not None:
            return await self.fast.pipeline(commands)
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def _decode_or_archive(
        self,
        qk: QueueKeys,
        tid: str,
        data: bytes,
        now: float,
        source: str,
        *,
        check_queue: bool = False,
    ) -> TaskMessage | None:
        """Decode a stored msg; archive the task by id when it is unusable here.

        Unusable: it cannot be decoded, its id is not the task's, or (with
        *check_queue*, for dequeue) its queue is not the one it is stored in,
        since a handler's writes would target that other queue's keys (the
        recoverer handles such messages itself). When the archive fails, the
        task is left where it is (logged), so the caller keeps the rest of its
        batch and a later pass meets the task again.
        """
        found = usable_message(data, tid, qk.name if check_queue else None)
        if isinstance(found, TaskMessage):
            return found
        await self._archive_unusable(qk, tid, found, now, source)
        return None

    async def _archive_unusable(
        self, qk: QueueKeys, tid: str, problem: str, now: float, source: str
    ) -> None:
        """Archive the task by id for *problem* (from :func:`usable_message`); when that
        fails the task is left where it is, logged (see :meth:`_decode_or_archive`)."""
        err = problem + "; raw bytes kept in field msg"
        try:
            await self._archive_undecodable(qk, tid, err, now, source)
        except REDIS_ERRORS as exc:  # must not cost the tasks already in hand
            _log.warning(
                "could not archive an unusable task message; it stays where it is",
                task_id=tid,
                queue=qk.name,
                problem=err,
                error=error_text(exc),
            )

    async def _archive_undecodable(
        self, qk: QueueKeys, tid: str, err: str, now: float, source: str
    ) -> None:
        now_s = int(now)
        keys_: tuple[str, ...] = (qk.task_prefix + tid, qk.archived, source)
        if source == qk.active:
            pday, fday = qk.daily(now)
            keys_ += (qk.lease, pday, fday, qk.processed, qk.failed)
        args = (
            tid,
            now_s,
            now_s - ARCHIVED_EXPIRATION,
            ARCHIVE_MAX_SIZE,
            qk.task_prefix,
            err,
            now_s + STATS_TTL,
            MAX_INT64,
        )
        try:
            await self._run(_ARCHIVE_UNDECODABLE, keys_, args, qk.name, tid)
        except TaskNotFoundError:
            _log.warning(
                "undecodable task already moved by someone else", task_id=tid, queue=qk.name
            )
            return
        _log.error("archived undecodable task message", task_id=tid, queue=qk.name, error=err)


ID_ARG = {
    "enqueue": 1,
    "enqueue_unique": 0,
    "schedule": 2,
    "schedule_unique": 0,
    "add_to_group": 1,
    "add_to_group_unique": 1,
}


def unique_key_of(msg: TaskMessage) -> str:
    ukey = msg.unique_key
    if not ukey:
        raise ValueError(
            f"task {msg.id!r} has no unique_key; set it with asyncq._keys.unique_key(...)"
        )
    # The lock must share the queue's hash tag (one cluster slot, one script call).
    if not ukey.startswith(keys.queue_key_prefix(msg.queue)):
        raise ValueError(
            f"unique_key {ukey!r} of task {msg.id!r} does not belong to queue {msg.queue!r}"
        )
    return ukey


def check_group(group: str) -> None:
    if not isinstance(group, str) or not group.strip():
        raise ValueError("group name must contain one or more characters")


def record_ttl(ttl: float | timedelta) -> int:
    secs = ttl_seconds(ttl, "ttl")
    if secs < 1:
        raise ValueError(f"ttl must be at least 1 second, got {ttl!r}")
    return secs


def conflict_error(qname: str, tid: str) -> TaskIdConflictError:
    return TaskIdConflictError(f"task ID conflicts with another task: id={tid!r} queue={qname!r}")


def duplicate_error(ukey: str) -> DuplicateTaskError:
    return DuplicateTaskError(f"task already exists: unique lock {ukey!r} is held")


def script_error(exc: ResponseError, script: Script, qname: str, tid: str) -> Exception:
    text = str(exc)
    if text.startswith("NOT FOUND") and tid:
        return TaskNotFoundError(qname, tid)
    if is_out_of_memory(exc):
        return RedisOutOfMemoryError(f"Redis script {script.name}")
    return BrokerError(f"Redis script {script.name} failed: {text}")


def ack_results(
    results: list[Any],
    items: Sequence[tuple[TaskMessage, bool]],
    qname: str,
    indices: list[int],
    reply: Any,
) -> None:
    """Fill in the failures of one queue's ack_many.lua call (a success leaves None; a
    step whose run continues here, the run's message: see ``_runs_continued``; an inline
    step, what was recorded: see ``ack_many``)."""
    if isinstance(reply, ResponseError):
        text = str(reply)
        for i in indices:
            results[i] = BrokerError(f"Redis script ack_many failed in queue {qname!r}: {text}")
        return
    if isinstance(reply, Exception):
        for i in indices:
            results[i] = reply
        return
    for i, code in zip(indices, reply, strict=True):
        if code == 1 or isinstance(code, bytes):
            continue
        tid = items[i][0].id
        if code == 0:
            results[i] = TaskNotFoundError(qname, tid)
        elif code == -1:
            results[i] = BrokerError(
                f"Redis script ack_many failed: INTERNAL (completed set of queue {qname!r} "
                f"already holds task {tid!r})"
            )
        else:
            results[i] = BrokerError(
                f"Redis script ack_many refused task {tid!r}: its unique key is outside "
                f"queue {qname!r}"
            )
