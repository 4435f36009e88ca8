"""Broker: awaitable methods over asynq v0.26's Redis layout (asynq's ``internal/rdb``).

Every method that changes more than one key runs a Lua script from ``lua/``
so that no ID ever sits in a list or sorted set without its task hash. The
scripts take asynq's KEYS/ARGV in asynq's order and leave the same Redis
state (hash fields, scores in unix seconds, ``pending_since`` in unix
nanoseconds, counters with ``EXPIREAT`` now + 90 days and the max-int64
wrap), so Go servers, the asynq CLI and asynqmon work on what asyncq writes
and the other way round. Times come from the injectable ``clock`` (unix
seconds as a float) or from aware datetimes; naive datetimes raise ValueError.

Errors: a task missing from the structure an operation expects raises
:class:`~asyncq.errors.TaskNotFoundError` (asynq's ``NOT FOUND`` reply);
other script errors raise :class:`~asyncq.errors.BrokerError`; connection
problems propagate as ``redis.exceptions.RedisError`` subclasses.

asyncq extensions (Go asynq is unaffected by all of them):

* **Instant pickup.** The enqueue, enqueue_unique, requeue and forward scripts
  PUBLISH the queue name on :func:`asyncq.keys.wakeup_channel` when they push
  into a pending list that was empty (LPUSH/RPUSH returned 1). The channel
  and the message are extra trailing ARGV after asynq's, so KEYS and asynq's
  ARGV are unchanged; a channel is not a key, so cluster slots are unaffected.
  The PUBLISH is best effort (``redis.pcall``): a user whose ACL denies the
  channel, which Go asynq never needs, still gets the write and no error.
* **Batched dequeue.** ``dequeue_many.lua`` takes asynq's dequeue KEYS/ARGV
  plus ARGV[3] = count and moves up to that many tasks (each exactly as
  asynq's dequeue does) in one call; it returns ``id, msg`` pairs. The Python
  side tries queues in the given order, one call per queue (queues live in
  different cluster slots); when a later call fails, the tasks already taken
  are returned. ``dequeue`` is ``dequeue_many`` with count 1.
* **Undecodable messages are archived, never dropped.** A ``msg`` that fails
  to decode (or whose id is not the task's id, or, at dequeue, whose queue
  is not the queue it is stored in) is moved to ``archived`` of that queue by
  ``archive_undecodable.lua``: the same transition and counters as asynq's
  Archive, but the raw bytes are kept as they are and the reason goes into
  the extra hash field ``asyncq_error`` (the protobuf cannot be rewritten).
  This happens in dequeue, list_lease_expired and read_aggregation_set.
* **Batch enqueue** (asynq HEAD's BatchEnqueue): SCRIPT LOAD, then one
  non-transactional pipeline of SADD + one EVALSHA per item. Unlike asynq,
  an item whose ID already exists is reported as TaskIdConflictError (asynq
  silently counts it as not enqueued), and unique and group items are
  supported through their usual scripts.
* **Batched acknowledgement.** ``ack_many.lua`` applies asynq's Done or
  MarkAsComplete to many tasks of one queue in one call, building task keys
  from the queue's prefix (same hash tag, so the same cluster slot); the
  processed counters take one INCRBY per call unless the all-time counter is
  near its max-int64 wrap. Several queues go in one pipeline.
* **asynq:queues registration.** The first time a Broker instance sees a
  queue it SADDs it to ``asynq:queues`` before the write (a per-instance
  cache, like asynq's per-process one). It is a separate command, not part
  of the scripts, because the global key is not in the queue's cluster slot.
* **Stranded groups.** forward and reclaim_stale_aggregation_sets re-add the
  group name to ``groups`` (an extra trailing KEYS entry) when they put tasks
  back into a group; asynq does not, so such a group is not aggregated until
  another task joins it.
* **Orphan ids.** An id without a task hash (never written by asyncq) is
  dropped from scheduled/retry by forward and from active by dequeue instead
  of being moved on with a half-made hash; the archive trim never trims the
  task being archived.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from redis.exceptions import NoScriptError, RedisError, ResponseError

from asyncq import keys
from asyncq._codec import decode_task_message, encode_task_message
from asyncq._logging import RateLimiter, error_text
from asyncq._time import to_unix
from asyncq.broker.scripts import Script, load_script
from asyncq.broker.transport import FastConnection
from asyncq.connection import RedisClient
from asyncq.errors import (
    AsyncqError,
    BrokerError,
    DuplicateTaskError,
    TaskIdConflictError,
    TaskNotFoundError,
)
from asyncq.proto.asynq import (
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    TaskMessage,
    WorkerInfo,
)

__all__ = [
    "ARCHIVED_EXPIRATION",
    "ARCHIVE_MAX_SIZE",
    "LEASE_DURATION",
    "BatchItem",
    "Broker",
    "DequeuedTask",
]

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

_log = structlog.get_logger("asyncq")

_ENQUEUE = load_script("enqueue")
_ENQUEUE_UNIQUE = load_script("enqueue_unique")
_SCHEDULE = load_script("schedule")
_SCHEDULE_UNIQUE = load_script("schedule_unique")
_ADD_TO_GROUP = load_script("add_to_group")
_ADD_TO_GROUP_UNIQUE = load_script("add_to_group_unique")
_DEQUEUE_MANY = load_script("dequeue_many")
_DONE = load_script("done")
_MARK_AS_COMPLETE = load_script("mark_as_complete")
_ACK_MANY = load_script("ack_many")
_REQUEUE = load_script("requeue")
_RETRY = load_script("retry")
_ARCHIVE = load_script("archive")
_ARCHIVE_UNDECODABLE = load_script("archive_undecodable")
_FORWARD = load_script("forward")
_LIST_LEASE_EXPIRED = load_script("list_lease_expired")
_DELETE_EXPIRED_COMPLETED = load_script("delete_expired_completed")
_WRITE_SERVER_STATE = load_script("write_server_state")
_WRITE_SCHEDULER_ENTRIES = load_script("write_scheduler_entries")
_RECORD_SCHEDULER_ENQUEUE_EVENT = load_script("record_scheduler_enqueue_event")
_AGGREGATION_CHECK = load_script("aggregation_check")
_READ_AGGREGATION_SET = load_script("read_aggregation_set")
_DELETE_AGGREGATION_SET = load_script("delete_aggregation_set")
_RECLAIM_STALE_AGGREGATION_SETS = load_script("reclaim_stale_aggregation_sets")

_QUEUE_CACHE_LIMIT = 4096
# What a Redis call may raise (asyncq._roles.REDIS_ERRORS): caught where a failure must
# not cost the tasks already in hand.
_FETCH_ERRORS = (RedisError, BrokerError, TaskNotFoundError, OSError)


@dataclass(slots=True)
class DequeuedTask:
    """A task taken from a queue: the decoded message and its lease expiry (unix s)."""

    message: TaskMessage
    lease_expiry: float


@dataclass(slots=True)
class BatchItem:
    """One task of a batch enqueue.

    Routed like the single-task methods: ``process_at`` set -> scheduled (it
    wins over ``group``); ``group`` set -> aggregating in that group; else
    pending. ``unique_ttl`` (whole seconds, >= 1) takes the message's
    ``unique_key`` lock first; for a scheduled item it is the lock's full TTL,
    as for :meth:`Broker.schedule_unique`.
    """

    message: TaskMessage
    process_at: datetime | float | None = None
    unique_ttl: int | None = None
    group: str | None = None


class _QueueKeys:
    """Every key string of one queue, built once (the hot path reuses them)."""

    __slots__ = (
        "active",
        "aggregation_sets",
        "archived",
        "completed",
        "day",
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
        "wakeup",
    )

    def __init__(self, qname: str) -> None:
        self.name = qname
        self.task_prefix = keys.task_key_prefix(qname)
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

    def daily(self, now: float) -> tuple[str, str]:
        """The processed/failed counters of the UTC day containing *now*."""
        day = int(now // 86400)
        if day != self.day:
            when = datetime.fromtimestamp(now, UTC)
            self.processed_day = keys.processed_key(self.name, when)
            self.failed_day = keys.failed_key(self.name, when)
            self.day = day
        return self.processed_day, self.failed_day


class _AckCall:
    """One queue's share of an ack_many batch: the ack_many.lua ARGV being built."""

    __slots__ = ("args", "indices", "kinds", "prefix", "qk")

    def __init__(self, qk: _QueueKeys, stats_exp: int) -> None:
        self.qk = qk
        self.prefix = keys.queue_key_prefix(qk.name)
        self.indices: list[int] = []  # positions in the caller's batch
        self.kinds: list[str] = []  # becomes ARGV[5]
        self.args: list[Any] = [qk.task_prefix, self.prefix, stats_exp, MAX_INT64, ""]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _seconds(value: float | timedelta, name: str) -> int:
    """Whole seconds of a duration given as seconds or a timedelta (Go truncates)."""
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if secs < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return int(secs)


def _lock_ttl(ttl: int | float | timedelta) -> int:
    secs = _seconds(ttl, "unique lock TTL")
    if secs < 1:
        raise ValueError(f"unique lock TTL must be at least 1 second, got {ttl!r}")
    return secs


def _encode_with(msg: TaskMessage, **changes: Any) -> bytes:
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


class Broker:
    """Awaitable asynq operations on one Redis connection (plain, Sentinel or Cluster).

    *redis* must return bytes (``decode_responses=False``): task messages are
    binary protobufs. *clock* returns the current unix time in seconds; every
    "now" of every operation comes from it. *fast*, a pipelined connection to
    the same server and database as *redis* (see
    :class:`~asyncq.broker.transport.FastConnection`), carries the script
    calls and hot-path commands when given; *redis* keeps the rest.
    """

    def __init__(
        self,
        redis: RedisClient,
        *,
        clock: Callable[[], float] = time.time,
        lease_duration: float = LEASE_DURATION,
        fast: FastConnection | None = None,
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
        self.fast = fast
        self._cmd: RedisClient | FastConnection = redis if fast is None else fast
        self.clock = clock
        self.lease_duration = lease_duration
        self._queues: dict[str, _QueueKeys] = {}
        self._published: set[str] = set()
        self._dequeue_errors = RateLimiter(3.0)

    # -- helpers ------------------------------------------------------------------------

    def _q(self, qname: str) -> _QueueKeys:
        qk = self._queues.get(qname)
        if qk is None:
            keys.validate_queue_name(qname)
            if len(self._queues) >= _QUEUE_CACHE_LIMIT:
                self._queues.clear()
            qk = self._queues[qname] = _QueueKeys(qname)
        return qk

    def _msg_queue(self, msg: TaskMessage) -> _QueueKeys:
        if not msg.id:
            raise ValueError(f"task message of type {msg.type!r} has no id")
        try:
            return self._q(msg.queue)
        except ValueError:
            raise ValueError(f"task message {msg.id!r} has a blank queue name") from None

    async def _register_queue(self, qk: _QueueKeys) -> None:
        # asynq:queues is what the Inspector, CLI and asynqmon list; SADD once per instance.
        await self._cmd.execute_command("SADD", keys.ALL_QUEUES, qk.name)
        self._published.add(qk.name)

    async def _run(
        self, script: Script, keys_: Sequence[str], args: Sequence[Any], qname: str, task_id: str
    ) -> Any:
        try:
            return await script(self._cmd, keys_, args)
        except ResponseError as exc:
            raise _script_error(exc, script, qname, task_id) from exc

    async def _pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Commands in one non-transactional pipeline; error replies come back in place."""
        if self.fast is not None:
            return await self.fast.pipeline(commands)
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    # -- client-side writes (asynq rdb.go, spec section 3.1) -------------------------------
    # Each enqueue-like method also SADDs the queue into asynq:queues the first time
    # this Broker sees the queue, and publishes on keys.wakeup_channel(queue) when the
    # pending list went from empty to non-empty (asyncq's instant pickup).

    async def enqueue(self, msg: TaskMessage) -> None:
        """Write a pending task. Raises TaskIdConflictError when ``t:<id>`` exists."""
        qk = self._msg_queue(msg)
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = msg.id
        now_ns = int(self.clock() * 1_000_000_000)
        res = await self._run(
            _ENQUEUE,
            (qk.task_prefix + tid, qk.pending),
            (encode_task_message(msg), tid, now_ns, qk.wakeup, qk.name),
            qk.name,
            tid,
        )
        if res == 0:
            raise _conflict(qk.name, tid)

    async def enqueue_unique(self, msg: TaskMessage, ttl: int) -> None:
        """Pending task guarded by ``msg.unique_key`` for *ttl* s.

        Raises DuplicateTaskError (lock held) or TaskIdConflictError.
        """
        qk = self._msg_queue(msg)
        ukey = _unique_key(msg)
        secs = _lock_ttl(ttl)
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = msg.id
        now_ns = int(self.clock() * 1_000_000_000)
        res = await self._run(
            _ENQUEUE_UNIQUE,
            (ukey, qk.task_prefix + tid, qk.pending),
            (tid, secs, encode_task_message(msg), now_ns, qk.wakeup, qk.name),
            qk.name,
            tid,
        )
        _check_write(res, qk.name, tid, ukey)

    async def schedule(self, msg: TaskMessage, process_at: datetime) -> None:
        """Write a scheduled task. Raises TaskIdConflictError."""
        qk = self._msg_queue(msg)
        at = to_unix(process_at)
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = msg.id
        res = await self._run(
            _SCHEDULE,
            (qk.task_prefix + tid, qk.scheduled),
            (encode_task_message(msg), at, tid),
            qk.name,
            tid,
        )
        if res == 0:
            raise _conflict(qk.name, tid)

    async def schedule_unique(self, msg: TaskMessage, process_at: datetime, ttl: int) -> None:
        """Scheduled task guarded by a unique lock. Raises DuplicateTaskError/TaskIdConflictError.

        *ttl* is the lock's whole TTL in seconds; asynq's client passes the time
        from now until *process_at* plus the uniqueness period.
        """
        qk = self._msg_queue(msg)
        ukey = _unique_key(msg)
        secs = _lock_ttl(ttl)
        at = to_unix(process_at)
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = msg.id
        res = await self._run(
            _SCHEDULE_UNIQUE,
            (ukey, qk.task_prefix + tid, qk.scheduled),
            (tid, secs, at, encode_task_message(msg)),
            qk.name,
            tid,
        )
        _check_write(res, qk.name, tid, ukey)

    async def add_to_group(self, msg: TaskMessage, group: str) -> None:
        """Write an aggregating task into ``g:<group>``. Raises TaskIdConflictError."""
        qk = self._msg_queue(msg)
        _check_group(group)
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = msg.id
        res = await self._run(
            _ADD_TO_GROUP,
            (qk.task_prefix + tid, qk.group_prefix + group, qk.groups),
            (encode_task_message(msg), tid, int(self.clock()), group),
            qk.name,
            tid,
        )
        if res == 0:
            raise _conflict(qk.name, tid)

    async def add_to_group_unique(self, msg: TaskMessage, group: str, ttl: int) -> None:
        """Aggregating task guarded by a unique lock. Raises DuplicateTaskError/TaskIdConflictError.

        The lock key is ``msg.unique_key`` (asynq recomputes the same key from
        queue, type and payload).
        """
        qk = self._msg_queue(msg)
        _check_group(group)
        ukey = _unique_key(msg)
        secs = _lock_ttl(ttl)
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = msg.id
        res = await self._run(
            _ADD_TO_GROUP_UNIQUE,
            (qk.task_prefix + tid, qk.group_prefix + group, qk.groups, ukey),
            (encode_task_message(msg), tid, int(self.clock()), group, secs),
            qk.name,
            tid,
        )
        _check_write(res, qk.name, tid, ukey)

    async def enqueue_batch(self, items: Sequence[BatchItem]) -> list[Exception | None]:
        """Enqueue many tasks in one pipeline; one result per item (None = written).

        A result is TaskIdConflictError when the ID already existed,
        DuplicateTaskError when the unique lock is held, ValueError for an
        invalid item, or the Redis error for that item. Connection errors
        raise, as for a single enqueue (items may or may not be written).
        """
        results: list[Exception | None] = [None] * len(items)
        now = self.clock()
        now_s = int(now)
        now_ns = int(now * 1_000_000_000)
        planned: list[tuple[int, Script, tuple[str, ...], tuple[Any, ...], _QueueKeys]] = []
        for i, item in enumerate(items):
            try:
                planned.append((i, *self._plan(item, now_s, now_ns)))
            except ValueError as exc:
                results[i] = exc
        if not planned:
            return results
        for script in {p[1] for p in planned}:
            await script.load(self._cmd)
        new_queues = sorted({p[4].name for p in planned} - self._published)
        commands: list[tuple[Any, ...]] = []
        if new_queues:
            commands.append(("SADD", keys.ALL_QUEUES, *new_queues))
        for _, script, keys_, args, _qk in planned:
            commands.append(("EVALSHA", script.sha, len(keys_), *keys_, *args))
        replies = await self._pipeline(commands)
        if new_queues:
            sadd_reply = replies.pop(0)
            if isinstance(sadd_reply, Exception):
                # The tasks are written; the queues must still become visible to inspectors.
                await self._cmd.execute_command("SADD", keys.ALL_QUEUES, *new_queues)
            self._published.update(new_queues)
        for (i, script, keys_, args, qk), first_reply in zip(planned, replies, strict=True):
            tid = args[_ID_ARG[script.name]]
            reply = first_reply
            if isinstance(reply, NoScriptError):
                # Flushed between SCRIPT LOAD and the pipeline: run it alone (reloads).
                try:
                    reply = await script(self._cmd, keys_, args)
                except ResponseError as exc:
                    reply = exc
            if isinstance(reply, ResponseError):
                results[i] = _script_error(reply, script, qk.name, tid)
            elif isinstance(reply, Exception):
                results[i] = reply
            elif reply == 0:
                results[i] = _conflict(qk.name, tid)
            elif reply == -1:
                results[i] = _duplicate(_unique_key(items[i].message))
        return results

    def _plan(
        self, item: BatchItem, now_s: int, now_ns: int
    ) -> tuple[Script, tuple[str, ...], tuple[Any, ...], _QueueKeys]:
        msg = item.message
        qk = self._msg_queue(msg)
        tid = msg.id
        tkey = qk.task_prefix + tid
        unique = item.unique_ttl is not None
        ukey = _unique_key(msg) if unique else ""
        secs = _lock_ttl(item.unique_ttl) if item.unique_ttl is not None else 0
        if item.process_at is not None:
            at = item.process_at
            at_s = to_unix(at) if isinstance(at, datetime) else int(at)
            if unique:
                return (
                    _SCHEDULE_UNIQUE,
                    (ukey, tkey, qk.scheduled),
                    (tid, secs, at_s, encode_task_message(msg)),
                    qk,
                )
            return _SCHEDULE, (tkey, qk.scheduled), (encode_task_message(msg), at_s, tid), qk
        if item.group is not None:
            group = item.group
            _check_group(group)
            gkey = qk.group_prefix + group
            if unique:
                return (
                    _ADD_TO_GROUP_UNIQUE,
                    (tkey, gkey, qk.groups, ukey),
                    (encode_task_message(msg), tid, now_s, group, secs),
                    qk,
                )
            return (
                _ADD_TO_GROUP,
                (tkey, gkey, qk.groups),
                (encode_task_message(msg), tid, now_s, group),
                qk,
            )
        if unique:
            return (
                _ENQUEUE_UNIQUE,
                (ukey, tkey, qk.pending),
                (tid, secs, encode_task_message(msg), now_ns, qk.wakeup, qk.name),
                qk,
            )
        return (
            _ENQUEUE,
            (tkey, qk.pending),
            (encode_task_message(msg), tid, now_ns, qk.wakeup, qk.name),
            qk,
        )

    # -- server-side processing (spec section 3.2) ------------------------------------------

    async def dequeue(self, qnames: Sequence[str]) -> DequeuedTask | None:
        """Take one task from the first non-paused, non-empty queue in *qnames* order."""
        got = await self.dequeue_many(qnames, 1)
        return got[0] if got else None

    async def dequeue_many(self, qnames: Sequence[str], count: int) -> list[DequeuedTask]:
        """Take up to *count* tasks, trying the queues in *qnames* order, each with its own lease.

        One script call per queue tried. A message that cannot be decoded, or
        that names another queue, is archived (and logged) instead of returned,
        and its slot is refilled. When a call fails after tasks were taken from
        earlier queues, those tasks are returned (and the failure logged)
        rather than left to lease recovery; with nothing taken it is raised.
        """
        if count < 1:
            raise ValueError(f"dequeue count must be at least 1, got {count}")
        out: list[DequeuedTask] = []
        for qname in qnames:
            qk = self._q(qname)
            keys_ = (qk.pending, qk.paused, qk.active, qk.lease)
            while True:
                want = count - len(out)
                now = self.clock()
                expiry = now + self.lease_duration
                try:
                    res = await self._run(
                        _DEQUEUE_MANY, keys_, (int(expiry), qk.task_prefix, want), qname, ""
                    )
                except _FETCH_ERRORS as exc:
                    if not out:
                        raise
                    if self._dequeue_errors.allow():
                        _log.warning(
                            "dequeue failed after tasks were taken; returning those",
                            queue=qname,
                            taken=len(out),
                            error=error_text(exc),
                            suppressed_since_last=self._dequeue_errors.take_suppressed(),
                        )
                    return out
                for i in range(0, len(res), 2):
                    tid = _text(res[i])
                    data = res[i + 1]
                    if data is None:
                        _log.error("dropped pending id without task hash", task_id=tid, queue=qname)
                        continue
                    msg = await self._decode_or_archive(
                        qk, tid, data, now, qk.active, check_queue=True
                    )
                    if msg is not None:
                        out.append(DequeuedTask(msg, expiry))
                if len(out) >= count or len(res) < 2 * want:
                    break
            if len(out) >= count:
                break
        return out

    async def _decode_or_archive(
        self,
        qk: _QueueKeys,
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
        try:
            msg = decode_task_message(data)
        except Exception as exc:  # whatever is wrong with the bytes, never crash the fetch loop
            err = f"asyncq: cannot decode task message ({type(exc).__name__}: {exc})"
        else:
            if msg.id != tid:
                problem = f"message id {msg.id!r} does not match task id {tid!r}"
            elif check_queue and msg.queue != qk.name:
                problem = f"message queue {msg.queue!r} does not match queue {qk.name!r}"
            else:
                return msg
            err = f"asyncq: task message unusable here ({problem})"
        err += "; raw bytes kept in field msg"
        try:
            await self._archive_undecodable(qk, tid, err, now, source)
        except _FETCH_ERRORS as exc:
            _log.warning(
                "could not archive an unusable task message; it stays where it is",
                task_id=tid,
                queue=qk.name,
                problem=err,
                error=error_text(exc),
            )
        return None

    async def _archive_undecodable(
        self, qk: _QueueKeys, tid: str, err: str, now: float, source: str
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

    async def done(self, msg: TaskMessage) -> None:
        """Success without retention: delete the task, count it processed, release its lock."""
        qk = self._msg_queue(msg)
        tid = msg.id
        now = self.clock()
        pday = qk.daily(now)[0]
        keys_: tuple[str, ...] = (qk.active, qk.lease, qk.task_prefix + tid, pday, qk.processed)
        if msg.unique_key:
            keys_ += (msg.unique_key,)
        await self._run(_DONE, keys_, (tid, int(now) + STATS_TTL, MAX_INT64), qk.name, tid)

    async def mark_as_complete(self, msg: TaskMessage) -> None:
        """Success with retention: move to ``completed`` scored by now + retention.

        The stored message gets ``completed_at`` = now; *msg* itself is unchanged.
        """
        qk = self._msg_queue(msg)
        tid = msg.id
        now = self.clock()
        now_s = int(now)
        pday = qk.daily(now)[0]
        keys_: tuple[str, ...] = (
            qk.active,
            qk.lease,
            qk.completed,
            qk.task_prefix + tid,
            pday,
            qk.processed,
        )
        if msg.unique_key:
            keys_ += (msg.unique_key,)
        data = _encode_with(msg, completed_at=now_s)
        args = (tid, now_s + STATS_TTL, now_s + msg.retention, data, MAX_INT64)
        await self._run(_MARK_AS_COMPLETE, keys_, args, qk.name, tid)

    # -- batched acknowledgement (asyncq extension, see ack_many) ---------------------------

    async def done_many(self, msgs: Sequence[TaskMessage]) -> list[Exception | None]:
        """:meth:`done` for many tasks at once; one result per message (see :meth:`ack_many`)."""
        return await self.ack_many([(msg, False) for msg in msgs])

    async def mark_as_complete_many(self, msgs: Sequence[TaskMessage]) -> list[Exception | None]:
        """:meth:`mark_as_complete` for many tasks at once; one result per message.

        See :meth:`ack_many`.
        """
        return await self.ack_many([(msg, True) for msg in msgs])

    async def ack_many(self, items: Sequence[tuple[TaskMessage, bool]]) -> list[Exception | None]:
        """Acknowledge finished tasks given as ``(msg, complete)`` pairs.

        ``complete=True`` is :meth:`mark_as_complete` (kept for ``msg.retention``),
        ``False`` is :meth:`done`; each task gets exactly that method's effect, in
        the given order, with one "now" for the whole batch. All tasks of a queue
        take one script call and all queues one round trip (a non-transactional
        pipeline; on a cluster one call per node).

        One result per item: None when acknowledged, TaskNotFoundError when the
        task is not active (any more), ValueError for a message without id or
        queue, BrokerError when the queue's script failed (then every item of
        that queue gets it and their state is unknown). A task whose unique_key
        lies outside its queue's hash tag (never written by asynq or asyncq) is
        acknowledged afterwards with the single-task method. Connection errors
        raise; the tasks may or may not be acknowledged.
        """
        results: list[Exception | None] = [None] * len(items)
        now = self.clock()
        now_s = int(now)
        stats_exp = now_s + STATS_TTL
        calls: dict[str, _AckCall] = {}
        strays: list[int] = []
        for i, (msg, complete) in enumerate(items):
            try:
                qk = self._msg_queue(msg)
            except ValueError as exc:
                results[i] = exc
                continue
            call = calls.get(qk.name)
            if call is None:
                call = calls[qk.name] = _AckCall(qk, stats_exp)
            ukey = msg.unique_key
            # The script builds no key it was not told the hash tag of (cluster slots).
            if ukey and not ukey.startswith(call.prefix):
                strays.append(i)
                continue
            # Packing each argument is most of redis-py's cost: send only what is used.
            call.indices.append(i)
            args = call.args
            args.append(msg.id)
            if ukey:
                args.append(ukey)
            if complete:
                call.kinds.append("C" if ukey else "c")
                args.append(now_s + msg.retention)
                args.append(_encode_with(msg, completed_at=now_s))
            else:
                call.kinds.append("D" if ukey else "d")
        planned = [call for call in calls.values() if call.indices]
        if planned:
            replies = await self._ack_calls(planned, now)
            for call, reply in zip(planned, replies, strict=True):
                _ack_results(results, items, call.qk.name, call.indices, reply)
        for i in strays:
            msg, complete = items[i]
            try:
                await (self.mark_as_complete(msg) if complete else self.done(msg))
            except AsyncqError as exc:
                results[i] = exc
        return results

    async def _ack_calls(self, planned: list[_AckCall], now: float) -> list[Any]:
        """Run ack_many.lua once per queue; replies (or ResponseErrors) in order."""
        calls: list[tuple[tuple[str, ...], list[Any]]] = []
        for call in planned:
            qk = call.qk
            call.args[4] = "".join(call.kinds)
            pday = qk.daily(now)[0]
            calls.append(((qk.active, qk.lease, qk.completed, pday, qk.processed), call.args))
        if len(calls) == 1:
            try:
                return [await _ACK_MANY(self._cmd, *calls[0])]
            except ResponseError as exc:
                return [exc]
        replies = await self._pipeline(
            [("EVALSHA", _ACK_MANY.sha, len(k), *k, *args) for k, args in calls]
        )
        for n, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                # Not loaded (restart, SCRIPT FLUSH, new node): the call did not run.
                try:
                    replies[n] = await _ACK_MANY(self._cmd, *calls[n])
                except ResponseError as exc:
                    replies[n] = exc
        return replies

    async def requeue(self, msg: TaskMessage) -> None:
        """Put an active task back at the front of pending (shutdown); no retry counted."""
        qk = self._msg_queue(msg)
        tid = msg.id
        await self._run(
            _REQUEUE,
            (qk.active, qk.lease, qk.pending, qk.task_prefix + tid),
            (tid, qk.wakeup, qk.name),
            qk.name,
            tid,
        )

    async def retry(
        self, msg: TaskMessage, process_at: datetime, err_msg: str, *, is_failure: bool
    ) -> None:
        """Move an active task to ``retry`` at *process_at*, recording the error.

        The stored message gets ``error_msg``, ``last_failed_at`` = now and,
        when *is_failure*, ``retried`` + 1; *msg* itself is unchanged.
        """
        qk = self._msg_queue(msg)
        at = to_unix(process_at)
        tid = msg.id
        now = self.clock()
        now_s = int(now)
        pday, fday = qk.daily(now)
        if is_failure:
            data = _encode_with(
                msg, retried=msg.retried + 1, error_msg=err_msg, last_failed_at=now_s
            )
        else:
            data = _encode_with(msg, error_msg=err_msg, last_failed_at=now_s)
        keys_ = (
            qk.task_prefix + tid,
            qk.active,
            qk.lease,
            qk.retry,
            pday,
            fday,
            qk.processed,
            qk.failed,
        )
        args = (tid, data, at, now_s + STATS_TTL, "1" if is_failure else "0", MAX_INT64)
        await self._run(_RETRY, keys_, args, qk.name, tid)

    async def archive(self, msg: TaskMessage, err_msg: str) -> None:
        """Move an active task to ``archived``, trimming old/excess archived tasks.

        The stored message gets ``error_msg`` and ``last_failed_at`` = now.
        Archived tasks older than 90 days and all but the newest 9,999 are
        deleted together with their task hashes.
        """
        qk = self._msg_queue(msg)
        tid = msg.id
        now = self.clock()
        now_s = int(now)
        pday, fday = qk.daily(now)
        data = _encode_with(msg, error_msg=err_msg, last_failed_at=now_s)
        keys_ = (
            qk.task_prefix + tid,
            qk.active,
            qk.lease,
            qk.archived,
            pday,
            fday,
            qk.processed,
            qk.failed,
            qk.task_prefix,
        )
        args = (
            tid,
            data,
            now_s,
            now_s - ARCHIVED_EXPIRATION,
            ARCHIVE_MAX_SIZE,
            now_s + STATS_TTL,
            MAX_INT64,
        )
        await self._run(_ARCHIVE, keys_, args, qk.name, tid)

    async def forward_if_ready(self, qnames: Sequence[str]) -> int:
        """Move due scheduled/retry tasks to pending (or back to their group); returns count."""
        total = 0
        for qname in qnames:
            qk = self._q(qname)
            for source in (qk.scheduled, qk.retry):
                while True:
                    now = self.clock()
                    n: int = await self._run(
                        _FORWARD,
                        (source, qk.pending, qk.groups),
                        (
                            int(now),
                            qk.task_prefix,
                            int(now * 1_000_000_000),
                            qk.group_prefix,
                            qk.wakeup,
                            qname,
                        ),
                        qname,
                        "",
                    )
                    total += n
                    if n == 0:
                        break
        return total

    async def list_lease_expired(
        self, cutoff: datetime, qnames: Sequence[str]
    ) -> list[TaskMessage]:
        """Messages of active tasks whose lease expired at or before *cutoff*.

        A message that cannot be decoded is archived (and logged) instead.
        """
        cut = to_unix(cutoff)
        out: list[TaskMessage] = []
        for qname in qnames:
            qk = self._q(qname)
            res = await self._run(
                _LIST_LEASE_EXPIRED, (qk.lease,), (cut, qk.task_prefix), qname, ""
            )
            for i in range(0, len(res), 2):
                msg = await self._decode_or_archive(
                    qk, _text(res[i]), res[i + 1], self.clock(), qk.active
                )
                if msg is not None:
                    out.append(msg)
        return out

    async def extend_lease(self, qname: str, task_ids: Sequence[str]) -> float:
        """Push the leases of *task_ids* to now + ``lease_duration``; returns the new expiry.

        Only IDs still in the lease set are updated (``ZADD XX``).
        """
        qk = self._q(qname)
        expiry = self.clock() + self.lease_duration
        if task_ids:
            score = int(expiry)
            args: list[Any] = []
            for tid in task_ids:
                args += (score, tid)
            await self._cmd.execute_command("ZADD", qk.lease, "XX", *args)
        return expiry

    async def delete_expired_completed_tasks(self, qname: str, batch_size: int = 100) -> int:
        """Delete completed tasks whose retention expired, *batch_size* per script call.

        Loops until none are left; returns how many were deleted.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        qk = self._q(qname)
        total = 0
        while True:
            n: int = await self._run(
                _DELETE_EXPIRED_COMPLETED,
                (qk.completed,),
                (int(self.clock()), qk.task_prefix, batch_size),
                qname,
                "",
            )
            total += n
            if n == 0:
                return total

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int:
        """HSET the task's ``result`` field; returns len(data)."""
        qk = self._q(qname)
        await self._cmd.execute_command("HSET", qk.task_prefix + task_id, "result", data)
        return len(data)

    async def write_server_state(
        self, info: ServerInfo, workers: Sequence[WorkerInfo], ttl: float
    ) -> None:
        """Heartbeat: ServerInfo and WorkerInfo records with *ttl* seconds to live."""
        secs = _record_ttl(ttl)
        skey = keys.server_info_key(info.host, info.pid, info.server_id)
        wkey = keys.workers_key(info.host, info.pid, info.server_id)
        exp = int(self.clock() + secs)
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command("ZADD", keys.ALL_SERVERS, exp, skey)
        pipe.execute_command("ZADD", keys.ALL_WORKERS, exp, wkey)
        await pipe.execute()
        args: list[Any] = [secs, bytes(info)]
        for w in workers:
            args += (w.task_id, bytes(w))
        await self._run(_WRITE_SERVER_STATE, (skey, wkey), args, "", "")

    async def clear_server_state(self, host: str, pid: int, server_id: str) -> None:
        """Remove a server's info and workers records."""
        skey = keys.server_info_key(host, pid, server_id)
        wkey = keys.workers_key(host, pid, server_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command("ZREM", keys.ALL_SERVERS, skey)
        pipe.execute_command("ZREM", keys.ALL_WORKERS, wkey)
        pipe.execute_command("DEL", skey, wkey)
        await pipe.execute()

    async def write_scheduler_entries(
        self, scheduler_id: str, entries: Sequence[SchedulerEntry], ttl: float
    ) -> None:
        """Scheduler heartbeat: replace the scheduler's entry list, expiring after *ttl*."""
        secs = _record_ttl(ttl)
        key = keys.scheduler_entries_key(scheduler_id)
        exp = int(self.clock() + secs)
        await self.redis.execute_command("ZADD", keys.ALL_SCHEDULERS, exp, key)
        args: list[Any] = [secs, *(bytes(e) for e in entries)]
        await self._run(_WRITE_SCHEDULER_ENTRIES, (key,), args, "", "")

    async def clear_scheduler_entries(self, scheduler_id: str) -> None:
        """Remove a scheduler's entries record."""
        key = keys.scheduler_entries_key(scheduler_id)
        await self.redis.execute_command("ZREM", keys.ALL_SCHEDULERS, key)
        await self.redis.execute_command("DEL", key)

    async def record_scheduler_enqueue_event(
        self, entry_id: str, event: SchedulerEnqueueEvent
    ) -> None:
        """Append to an entry's history, keeping the newest 1,000 events."""
        if event.enqueue_time is None:
            raise ValueError(f"scheduler enqueue event for task {event.task_id!r} has no time")
        await self._run(
            _RECORD_SCHEDULER_ENQUEUE_EVENT,
            (keys.scheduler_history_key(entry_id),),
            (to_unix(event.enqueue_time), bytes(event), SCHEDULER_HISTORY_CAP),
            "",
            "",
        )

    async def clear_scheduler_history(self, entry_id: str) -> None:
        """Delete an entry's history."""
        await self.redis.execute_command("DEL", keys.scheduler_history_key(entry_id))

    async def publish_cancelation(self, task_id: str) -> None:
        """PUBLISH the task ID on ``asynq:cancel``."""
        await self._cmd.execute_command("PUBLISH", keys.CANCEL_CHANNEL, task_id)

    # -- aggregation (spec section 3.3) -----------------------------------------------------

    async def list_groups(self, qname: str) -> list[str]:
        """Names of the queue's groups with aggregating tasks (sorted)."""
        qk = self._q(qname)
        members = await self.redis.execute_command("SMEMBERS", qk.groups)
        return sorted(_text(m) for m in members)

    async def aggregation_check(  # noqa: PLR0917 - the Broker interface's signature
        self,
        qname: str,
        group: str,
        t: datetime,
        grace_period: float | timedelta,
        max_delay: float | timedelta,
        max_size: int,
    ) -> str | None:
        """Stage an aggregation set when the group is ready; returns its set ID or None.

        Durations are whole seconds (or timedeltas); 0 disables *max_delay* and *max_size*.
        """
        qk = self._q(qname)
        _check_group(group)
        if max_size < 0:
            raise ValueError(f"max_size must not be negative, got {max_size}")
        grace = _seconds(grace_period, "grace_period")
        delay = _seconds(max_delay, "max_delay")
        tick = to_unix(t)
        set_id = str(uuid.uuid4())
        gkey = qk.group_prefix + group
        res = await self._run(
            _AGGREGATION_CHECK,
            (gkey, f"{gkey}:{set_id}", qk.aggregation_sets, qk.groups),
            (max_size, delay, grace, int(self.clock()) + AGGREGATION_TIMEOUT, tick, group),
            qname,
            "",
        )
        return set_id if res == 1 else None

    async def read_aggregation_set(
        self, qname: str, group: str, set_id: str
    ) -> tuple[list[TaskMessage], datetime]:
        """The staged messages (by joining second, then task id) and the set's deadline.

        Raises BrokerError when the set is not staged (any more). A member whose
        message cannot be decoded is archived (and logged) instead of returned.
        """
        qk = self._q(qname)
        skey = keys.aggregation_set_key(qname, group, set_id)
        res = await self._run(
            _READ_AGGREGATION_SET, (skey, qk.aggregation_sets), (qk.task_prefix,), qname, ""
        )
        deadline = res.pop()
        if deadline is None:
            raise BrokerError(f"aggregation set {skey!r} is not staged in queue {qname!r}")
        msgs: list[TaskMessage] = []
        for i in range(0, len(res), 2):
            msg = await self._decode_or_archive(qk, _text(res[i]), res[i + 1], self.clock(), skey)
            if msg is not None:
                msgs.append(msg)
        return msgs, datetime.fromtimestamp(int(float(deadline)), UTC)

    async def delete_aggregation_set(self, qname: str, group: str, set_id: str) -> None:
        """Delete a staged set and its members' task hashes (after the aggregate is enqueued)."""
        qk = self._q(qname)
        await self._run(
            _DELETE_AGGREGATION_SET,
            (keys.aggregation_set_key(qname, group, set_id), qk.aggregation_sets),
            (qk.task_prefix,),
            qname,
            "",
        )

    async def reclaim_stale_aggregation_sets(self, qname: str) -> None:
        """Move members of sets past their deadline back into their group."""
        qk = self._q(qname)
        await self._run(
            _RECLAIM_STALE_AGGREGATION_SETS,
            (qk.aggregation_sets, qk.groups),
            (int(self.clock()), qk.group_prefix),
            qname,
            "",
        )


# Position of the task id in each enqueue-like script's ARGV (0-based), for batch results.
_ID_ARG = {
    "enqueue": 1,
    "enqueue_unique": 0,
    "schedule": 2,
    "schedule_unique": 0,
    "add_to_group": 1,
    "add_to_group_unique": 1,
}


def _unique_key(msg: TaskMessage) -> str:
    ukey = msg.unique_key
    if not ukey:
        raise ValueError(
            f"task {msg.id!r} has no unique_key; set it with asyncq.keys.unique_key(...)"
        )
    # The lock must share the queue's hash tag (one cluster slot, one script call).
    if not ukey.startswith(keys.queue_key_prefix(msg.queue)):
        raise ValueError(
            f"unique_key {ukey!r} of task {msg.id!r} does not belong to queue {msg.queue!r}"
        )
    return ukey


def _check_group(group: str) -> None:
    if not isinstance(group, str) or not group.strip():
        raise ValueError("group name must contain one or more characters")


def _record_ttl(ttl: float | timedelta) -> int:
    secs = _seconds(ttl, "ttl")
    if secs < 1:
        raise ValueError(f"ttl must be at least 1 second, got {ttl!r}")
    return secs


def _conflict(qname: str, tid: str) -> TaskIdConflictError:
    return TaskIdConflictError(f"task ID conflicts with another task: id={tid!r} queue={qname!r}")


def _duplicate(ukey: str) -> DuplicateTaskError:
    return DuplicateTaskError(f"task already exists: unique lock {ukey!r} is held")


def _check_write(res: int, qname: str, tid: str, ukey: str) -> None:
    if res == -1:
        raise _duplicate(ukey)
    if res == 0:
        raise _conflict(qname, tid)


def _script_error(exc: ResponseError, script: Script, qname: str, tid: str) -> Exception:
    text = str(exc)
    if text.startswith("NOT FOUND") and tid:
        return TaskNotFoundError(qname, tid)
    return BrokerError(f"Redis script {script.name} failed: {text}")


def _ack_results(
    results: list[Exception | None],
    items: Sequence[tuple[TaskMessage, bool]],
    qname: str,
    indices: list[int],
    reply: Any,
) -> None:
    """Fill in the results of one queue's ack_many.lua call."""
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
        if code == 1:
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
