"""The Redis side of the Inspector (asynq's ``internal/rdb/inspect.go``).

Every method here maps to one Redis round trip or one Lua script from
``lua/inspect_*.lua`` with asynq's KEYS/ARGV contracts, and returns plain
decoded data; :class:`asyncq._inspection.inspector.Inspector` validates arguments, checks
that queues exist and turns these results into public records. Where released
asynq leaves task hashes behind (archive trimming, queue removal) the scripts
delete them instead, so no ``t:<id>`` hash is ever unreachable and no ID is ever
left in a list or sorted set without its hash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from asyncq import _keys as keys

# One definition of the archive limits: the worker's and the inspector's trims must agree.
from asyncq._broker._base import ARCHIVE_MAX_SIZE, ARCHIVED_EXPIRATION, LUA_PACKAGE
from asyncq._codec import decode_task_message, encode_task_message
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import Script, load_script
from asyncq._time import from_unix
from asyncq.errors import BrokerError, FailedPreconditionError, TaskNotFoundError
from asyncq.proto.asynq import SchedulerEnqueueEvent as SchedulerEnqueueEventProto
from asyncq.proto.asynq import SchedulerEntry as SchedulerEntryProto
from asyncq.proto.asynq import ServerInfo as ServerInfoProto
from asyncq.proto.asynq import TaskMessage
from asyncq.proto.asynq import WorkerInfo as WorkerInfoProto
from asyncq.task import TaskState

__all__ = [
    "GROUP_SAMPLE_SIZE",
    "MEMORY_SAMPLE_SIZE",
    "InspectBroker",
    "QueueStats",
    "RateBucket",
    "StoredTask",
]

MEMORY_SAMPLE_SIZE = 20
"""Task hashes sampled per list/sorted set for the memory estimate."""
GROUP_SAMPLE_SIZE = 5
"""Groups sampled for the memory estimate."""


_COUNTERS = ("processed", "failed", "processed_total", "failed_total")
"""The counters inspect_current_stats reads from KEYS[7..10], in that order."""


def _lua(name: str) -> Script:
    """The script ``lua/<name>.lua`` of the broker package."""
    return load_script(LUA_PACKAGE, name)


class RateBucket(NamedTuple):
    """A GCRA rate bucket as read now (Redis TIME)."""

    burst: int
    period_us: int
    tokens: int
    """Tasks that may start now."""
    next_us: int
    """When *tokens* is 0, microseconds until the next token; else 0."""
    limited: int
    """Tokens refused so far (type buckets count them; queue buckets do not)."""


@dataclass(slots=True)
class StoredTask:
    """A task as read from Redis: its message, state, next process time and result."""

    message: TaskMessage
    state: TaskState
    next_process_at: datetime | None
    result: bytes | None
    decodable: bool = True
    """False when ``message`` is a placeholder for stored bytes that cannot be decoded."""


@dataclass(slots=True)
class QueueStats:
    """The raw counts of asynq's CurrentStats plus the sampled memory usage."""

    pending: int
    active: int
    scheduled: int
    retry: int
    archived: int
    completed: int
    aggregating: int
    groups: int
    processed: int
    failed: int
    processed_total: int
    failed_total: int
    paused: bool
    oldest_pending_since_ns: int
    memory_usage: int


_log = structlog.get_logger("asyncq")


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _text(value: bytes | str) -> str:
    """Stored text shown to a user: undecodable bytes become U+FFFD instead of raising."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _int(value: Any) -> int:
    if isinstance(value, bytes):
        value = value.decode()
    return int(value)


def _whole(value: Any) -> int | None:
    """A stored whole number (as the scripts' tonumber and Redis's counters read it), or
    None for anything else: not UTF-8, empty, a fraction, nan, inf, beyond int64."""
    try:
        number = _int(value)
    except (ValueError, UnicodeDecodeError, TypeError):
        return None
    return number if -_INT64 - 1 <= number <= _INT64 else None


def _unreadable_flow(key: str, what: str, value: Any) -> None:
    _log.warning("ignored an unreadable asyncq value", key=key, field=what, value=repr(value)[:80])


def _text_map(raw: dict[Any, Any] | None) -> dict[str, str]:
    """A stored hash of names and texts (a server's flow record) as str, undecodable bytes
    as U+FFFD: shown to a user, never a reason to fail the listing."""
    return {} if raw is None else {_text(k): _text(v) for k, v in raw.items()}


_INT64 = 2**63 - 1


def _stored_int(value: Any, what: str, key: str) -> int:
    """A number read back from stored data; garbage (never written by asynq) reads as 0, logged.

    Float text (a sorted-set score such as ``1.5e+300`` or ``inf``) is clamped to int64.
    """
    try:
        return max(-_INT64 - 1, min(_INT64, _int(value)))
    except (ValueError, UnicodeDecodeError, TypeError):
        pass
    try:
        number = float(_str(value))
        if math.isnan(number):
            raise ValueError("nan")
        return int(max(-_INT64 - 1, min(_INT64, number)))
    except (ValueError, UnicodeDecodeError, TypeError, OverflowError):
        _log.warning(
            "ignored an unreadable stored number", key=key, field=what, value=repr(value)[:40]
        )
        return 0


_R = TypeVar("_R")
_M = TypeVar(
    "_M", ServerInfoProto, WorkerInfoProto, SchedulerEntryProto, SchedulerEnqueueEventProto
)


_FIELD_TYPES: dict[str, type] = {"str": str, "int": int, "bytes": bytes}


def _parse_record(cls: type[_M], data: bytes) -> _M:
    """Decode a server/worker/scheduler record; ValueError when a field has the wrong type.

    betterproto2 accepts some malformed bytes and leaves a field of another type
    (``WorkerInfoProto.parse(b"\\x00...")`` gives ``task_id == 0``), which would break
    every comparison and formatter downstream.
    """
    record = cls.parse(data)
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        want = _FIELD_TYPES.get(str(f.type))
        if want is not None and (not isinstance(value, want) or isinstance(value, bool)):
            raise ValueError(f"field {f.name} holds a {type(value).__name__}, not {f.type}")
    return record


def _skipped(key: str, exc: Exception) -> None:
    _log.warning("skipped undecodable record", key=key, error=f"{type(exc).__name__}: {exc}"[:200])


def _unix_ns(now: float) -> int:
    return int(now * 1_000_000_000)


class InspectBroker:
    """Read and steer queues as asynq's Inspector does, on one Redis connection."""

    def __init__(self, redis: RedisClient, *, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        # redis-py types its commands as sync-or-async unions; calls go through an Any view.
        self._r: Any = redis
        self.clock = clock

    # -- queues ------------------------------------------------------------------------------

    async def all_queues(self) -> list[str]:
        """Every queue name in ``asynq:queues``, sorted."""
        members = await self._r.smembers(keys.ALL_QUEUES)
        return sorted(_str(m) for m in members)

    async def raw_queue_names(self) -> list[bytes]:
        """The members of ``asynq:queues`` as stored (any bytes another client wrote)."""
        members = await self._r.smembers(keys.ALL_QUEUES)
        return sorted(m if isinstance(m, bytes) else m.encode() for m in members)

    async def queue_exists(self, qname: str) -> bool:
        """Whether *qname* is a member of ``asynq:queues``."""
        return bool(await self._r.sismember(keys.ALL_QUEUES, qname))

    async def current_stats(self, qname: str) -> QueueStats:
        """Sizes by state, today's and all-time counters, paused flag and memory estimate."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        script_keys = [
            keys.pending_key(qname),
            keys.active_key(qname),
            keys.scheduled_key(qname),
            keys.retry_key(qname),
            keys.archived_key(qname),
            keys.completed_key(qname),
            keys.processed_key(qname, now),
            keys.failed_key(qname, now),
            keys.processed_total_key(qname),
            keys.failed_total_key(qname),
            keys.paused_key(qname),
            keys.all_groups(qname),
        ]
        args = [keys.task_key_prefix(qname), keys.group_key_prefix(qname)]
        reply = await _lua("inspect_current_stats")(self.redis, script_keys, args)
        raw = {_str(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}
        # Counters and pending_since are stored data: garbage in them reads as 0 (logged).
        where = dict(zip(_COUNTERS, script_keys[6:10], strict=True))
        values = {
            name: _stored_int(v, name, where.get(name, f"queue {qname}")) for name, v in raw.items()
        }
        memory = await self.memory_usage(qname)
        return QueueStats(
            pending=values["pending"],
            active=values["active"],
            scheduled=values["scheduled"],
            retry=values["retry"],
            archived=values["archived"],
            completed=values["completed"],
            aggregating=values["aggregating_count"],
            groups=values["group_size"],
            processed=values["processed"],
            failed=values["failed"],
            processed_total=values["processed_total"],
            failed_total=values["failed_total"],
            paused=values["paused"] == 1,
            oldest_pending_since_ns=values["oldest_pending_since"],
            memory_usage=memory,
        )

    async def memory_usage(self, qname: str) -> int:
        """Approximate bytes used by the queue's tasks (sampled with MEMORY USAGE)."""
        script_keys = [
            keys.active_key(qname),
            keys.pending_key(qname),
            keys.scheduled_key(qname),
            keys.retry_key(qname),
            keys.archived_key(qname),
            keys.completed_key(qname),
            keys.all_groups(qname),
        ]
        args: list[str | int] = [
            keys.task_key_prefix(qname),
            MEMORY_SAMPLE_SIZE,
            GROUP_SAMPLE_SIZE,
            keys.group_key_prefix(qname),
        ]
        return _int(await _lua("inspect_memory_usage")(self.redis, script_keys, args))

    async def historical_stats(self, qname: str, days: int) -> list[tuple[datetime, int, int]]:
        """(day, processed, failed) for *days* UTC days, today first."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        dates = [now - timedelta(days=i) for i in range(days)]
        script_keys: list[str] = []
        for day in dates:
            script_keys += [keys.processed_key(qname, day), keys.failed_key(qname, day)]
        reply = await _lua("inspect_historical_stats")(self.redis, script_keys)
        return [
            (
                day,
                _stored_int(reply[2 * i], "processed", script_keys[2 * i]),
                _stored_int(reply[2 * i + 1], "failed", script_keys[2 * i + 1]),
            )
            for i, day in enumerate(dates)
        ]

    async def group_stats(self, qname: str) -> list[tuple[str, int]]:
        """(group, size) for every group of the queue, sorted by name."""
        reply = await _lua("inspect_group_stats")(
            self.redis, [keys.all_groups(qname)], [keys.group_key_prefix(qname)]
        )
        return sorted((_str(reply[i]), _int(reply[i + 1])) for i in range(0, len(reply), 2))

    async def pause(self, qname: str) -> None:
        """``SET paused <now> NX``; FailedPreconditionError when already paused."""
        ok = await self._r.set(keys.paused_key(qname), int(self.clock()), nx=True)
        if not ok:
            raise FailedPreconditionError(f'queue "{qname}" is already paused')

    async def unpause(self, qname: str) -> None:
        """``DEL paused``; FailedPreconditionError when the queue is not paused."""
        if await self._r.delete(keys.paused_key(qname)) == 0:
            raise FailedPreconditionError(f'queue "{qname}" is not paused')

    async def remove_queue(self, qname: str, *, force: bool) -> int:
        """Run the remove-queue script; 1 removed, -1 not empty, -2 has active tasks.

        On success the queue is also removed from ``asynq:queues``.
        """
        script_keys = [
            keys.pending_key(qname),
            keys.active_key(qname),
            keys.scheduled_key(qname),
            keys.retry_key(qname),
            keys.archived_key(qname),
            keys.lease_key(qname),
            keys.completed_key(qname),
            keys.all_groups(qname),
            keys.all_aggregation_sets(qname),
            keys.paused_key(qname),
        ]
        args = [keys.task_key_prefix(qname), "1" if force else "0", keys.group_key_prefix(qname)]
        code = _int(await _lua("inspect_remove_queue")(self.redis, script_keys, args))
        if code == 1:
            await self._r.srem(keys.ALL_QUEUES, qname)
            # asyncq's flow-control setting, rate bucket and direct-delivery waiters: a
            # worker still serving the queue arms it again when it next finds it empty
            await self._r.delete(
                keys.limit_key(qname),
                keys.rate_key(qname),
                keys.ordered_key(qname),
                keys.waiters_key(qname),
            )
        return code

    # -- flow control (asyncq-only keys; Go asynq never reads them) ---------------------------

    async def queue_limit(self, qname: str) -> int | None:
        """The fleet-wide concurrency limit stored for the queue, or None.

        A value no asyncq writer stores (another type, not a whole number, negative)
        reads as None, with a warning naming the key: dequeue_queues.lua applies no
        stored limit for it either, so None is what holds.
        """
        key = keys.limit_key(qname)
        raw = await self._flow_read(key, "string", self._r.get(key))
        if raw is None:
            return None
        limit = _whole(raw)
        if limit is None or limit < 0:
            _unreadable_flow(key, "limit", raw)
            return None
        return limit

    async def set_queue_limit(self, qname: str, limit: int | None) -> None:
        """Store (or, with None, delete) the queue's fleet-wide concurrency limit."""
        if limit is None:
            await self._r.delete(keys.limit_key(qname))
        else:
            await self._r.set(keys.limit_key(qname), limit)

    async def queue_ordered(self, qname: str) -> bool:
        """Whether the queue is marked ordered (dequeue_queues.lua reads the same key)."""
        key = keys.ordered_key(qname)
        raw = await self._flow_read(key, "string", self._r.get(key))
        if raw is not None and raw not in (b"1", "1"):
            # The scripts take only "1" as ordered: anything else leaves the queue unordered.
            _unreadable_flow(key, "ordered", raw)
        return raw in (b"1", "1")

    async def set_queue_ordered(self, qname: str, ordered: bool) -> None:
        """Mark the queue ordered, or not."""
        if ordered:
            await self._r.set(keys.ordered_key(qname), "1")
        else:
            await self._r.delete(keys.ordered_key(qname))

    async def queue_rate(self, qname: str) -> RateBucket | None:
        """The queue's rate bucket now, None when absent."""
        return await self._bucket(keys.rate_key(qname))

    async def type_rate(self, task_type: str) -> RateBucket | None:
        """A task type's rate bucket now, None when absent."""
        return await self._bucket(keys.type_rate_key(task_type))

    async def _bucket(self, key: str) -> RateBucket | None:
        fields = ["tat", "interval", "burst", "limited"]
        stored = await self._flow_read(key, "hash", self._r.hmget(key, fields))
        if stored is None:
            return None
        tat, interval, burst, limited = stored
        if tat is None or interval is None or burst is None:
            return None
        numbers = [_whole(v) for v in (tat, interval, burst)]
        if None in numbers or (limited is not None and _whole(limited) is None):
            # Not a bucket a worker wrote: the read shows none rather than failing
            # every queue's summary (the scripts set tat, interval and burst anew).
            _unreadable_flow(key, "rate bucket", stored)
            return None
        stored_tat, stored_iv, cap = (int(v or 0) for v in numbers)
        if cap < 1:  # a bucket of no token has no rate (and would divide by zero)
            _unreadable_flow(key, "rate bucket", stored)
            return None
        sec, usec = await self._r.time()
        iv = max(1, stored_iv)
        now = int(sec) * 1_000_000 + int(usec)
        tat_now = max(stored_tat, now)
        tokens = max(0, min(cap, (now + cap * iv - tat_now) // iv))
        # The GCRA of type_rate.lua: the next token may be used from tat + iv - cap * iv.
        next_us = 0 if tokens else max(0, tat_now + iv - cap * iv - now)
        return RateBucket(cap, cap * iv, tokens, next_us, _whole(limited) or 0)

    async def server_type_rates(self, host: str, pid: int, server_id: str) -> dict[str, str]:
        """``{task type: rate}`` a live asyncq server configures (empty for others)."""
        key = keys.server_type_rates_key(host, pid, server_id)
        return _text_map(await self._flow_read(key, "hash", self._r.hgetall(key)))

    async def server_queue_flow(self, host: str, pid: int, server_id: str) -> dict[str, str]:
        """A live asyncq server's queue flow control record (empty for others); see
        :func:`asyncq._keys.server_queue_flow_key`."""
        key = keys.server_queue_flow_key(host, pid, server_id)
        return _text_map(await self._flow_read(key, "hash", self._r.hgetall(key)))

    async def _flow_read(self, key: str, kind: str, read: Awaitable[_R]) -> _R | None:
        """*read* of one asyncq flow-control key; None, with a warning naming the key,
        when the key holds another type than *kind* (Redis answers WRONGTYPE)."""
        try:
            return await read
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            _log.warning("ignored an asyncq key of the wrong type", key=key, expected=kind)
            return None

    async def live_leases(self, qname: str) -> int:
        """Active tasks of the queue whose lease has not expired (what a limit counts)."""
        return _int(await self._r.zcount(keys.lease_key(qname), int(self.clock()), "+inf"))

    # -- tasks -------------------------------------------------------------------------------

    async def get_task(self, qname: str, task_id: str) -> StoredTask:
        """One task by ID; TaskNotFoundError when its hash does not exist."""
        now = self.clock()
        try:
            reply = await _lua("inspect_get_task_info")(
                self.redis,
                [keys.task_key(qname, task_id)],
                [task_id, int(now), keys.queue_key_prefix(qname)],
            )
        except ResponseError as exc:
            if "NOT FOUND" in str(exc):
                raise TaskNotFoundError(qname, task_id) from None
            raise BrokerError(f"get task {task_id!r} in queue {qname!r}: {exc}") from exc
        msg_bytes, state, next_at, result, stored_reason = reply
        if msg_bytes is None or state is None:
            raise BrokerError(f"task hash {keys.task_key(qname, task_id)} lacks msg or state")
        state_text = state.decode("utf-8", "replace") if isinstance(state, bytes) else state
        try:
            task_state = TaskState(state_text)
        except ValueError:
            raise BrokerError(
                f"task {task_id!r} in queue {qname!r} has an unknown state {state_text!r}"
            ) from None
        msg, decodable = _decode_checked(qname, _str(task_id), msg_bytes)
        if not decodable and stored_reason:
            # The reason recorded when the message was archived as undecodable: bytes
            # like any stored field, so not trusted to be UTF-8.
            msg.error_msg = _text(stored_reason)
        next_process_at = None
        if task_state is TaskState.PENDING:
            next_process_at = datetime.fromtimestamp(now, UTC)
        elif next_at is not None:
            at = _stored_int(next_at, "score", keys.task_key(qname, task_id))
            if at != 0:
                next_process_at = from_unix(at)
        return StoredTask(msg, task_state, next_process_at, result, decodable)

    async def list_list(
        self, qname: str, state: TaskState, page: int, size: int
    ) -> list[StoredTask]:
        """A page of pending or active tasks, next-to-run first (page is 0-based)."""
        key = keys.pending_key(qname) if state is TaskState.PENDING else keys.active_key(qname)
        # The list is pushed at the head and consumed from the tail, so page 0 is the
        # tail end; asynq reverses it to show the oldest (next to run) first.
        start = -(size * page + size - 1) - 1
        stop = -(size * page) - 1
        reply = await _lua("inspect_list_messages")(
            self.redis, [key], [start, stop, keys.task_key_prefix(qname)]
        )
        now = datetime.fromtimestamp(self.clock(), UTC)
        tasks: list[StoredTask] = []
        for i in range(0, len(reply), 3):
            if reply[i + 1] is None:
                continue  # an ID without its hash: asynq skips it too
            msg = _decode(qname, _str(reply[i]), reply[i + 1])
            next_at = now if state is TaskState.PENDING else None
            tasks.append(StoredTask(msg, state, next_at, reply[i + 2]))
        tasks.reverse()
        return tasks

    async def list_zset(
        self, qname: str, state: TaskState, page: int, size: int, group: str | None = None
    ) -> list[StoredTask]:
        """A page of a sorted-set state (or of one group), ascending by score."""
        key = _zset_key(qname, state, group)
        start = size * page
        reply = await _lua("inspect_list_zset_entries")(
            self.redis, [key], [start, start + size - 1, keys.task_key_prefix(qname)]
        )
        tasks: list[StoredTask] = []
        for i in range(0, len(reply), 4):
            if reply[i + 1] is None:
                continue
            msg = _decode(qname, _str(reply[i]), reply[i + 1])
            next_at = None
            if state in (TaskState.SCHEDULED, TaskState.RETRY):
                next_at = from_unix(_stored_int(reply[i + 2], "score", key))
            tasks.append(StoredTask(msg, state, next_at, reply[i + 3]))
        return tasks

    async def lease_expired_ids(self, qname: str) -> set[str]:
        """IDs of active tasks whose lease expired at or before now (orphans)."""
        members = await self._r.zrangebyscore(keys.lease_key(qname), "-inf", int(self.clock()))
        return {_str(m) for m in members}

    async def run_task(self, qname: str, task_id: str) -> None:
        """Move a scheduled/retry/archived/completed/aggregating task to pending."""
        code = await self._call(
            "inspect_run_task",
            [keys.task_key(qname, task_id), keys.pending_key(qname), keys.all_groups(qname)],
            [
                task_id,
                keys.queue_key_prefix(qname),
                keys.group_key_prefix(qname),
                _unix_ns(self.clock()),
            ],
        )
        if code == 0:
            raise TaskNotFoundError(qname, task_id)
        if code == -1:
            raise FailedPreconditionError("task is already running")
        if code == -2:
            raise FailedPreconditionError("task is already in pending state")
        await self.publish_wakeup(qname)

    async def run_all(self, qname: str, state: TaskState, group: str | None = None) -> int:
        """Move every scheduled/retry/archived task (or one group's) to pending."""
        now_ns = _unix_ns(self.clock())
        if state is TaskState.AGGREGATING:
            assert group is not None
            n = await self._call(
                "inspect_run_all_aggregating",
                [keys.group_key(qname, group), keys.pending_key(qname), keys.all_groups(qname)],
                [keys.task_key_prefix(qname), group, now_ns],
            )
        else:
            n = await self._call(
                "inspect_run_all",
                [_zset_key(qname, state, None), keys.pending_key(qname)],
                [keys.task_key_prefix(qname), now_ns],
            )
        if n:
            await self.publish_wakeup(qname)
        return n

    async def archive_task(self, qname: str, task_id: str) -> None:
        """Archive one task that is not active and not yet archived."""
        now = self.clock()
        code = await self._call(
            "inspect_archive_task",
            [keys.task_key(qname, task_id), keys.archived_key(qname), keys.all_groups(qname)],
            [
                task_id,
                int(now),
                _archive_cutoff(now),
                ARCHIVE_MAX_SIZE,
                keys.queue_key_prefix(qname),
                keys.group_key_prefix(qname),
            ],
        )
        if code == 0:
            raise TaskNotFoundError(qname, task_id)
        if code == -1:
            raise FailedPreconditionError("task is already archived")
        if code == -2:
            raise FailedPreconditionError(
                "cannot archive task in active state. use CancelProcessing instead."
            )

    async def archive_all(
        self, qname: str, state: TaskState, group: str | None = None
    ) -> tuple[int, int]:
        """Archive every pending/scheduled/retry task (or one group's); returns the tasks
        archived and the archived tasks the archive's limits then deleted."""
        now = self.clock()
        args: list[str | int] = [int(now), _archive_cutoff(now), ARCHIVE_MAX_SIZE]
        prefix = keys.task_key_prefix(qname)
        archived = keys.archived_key(qname)
        if state is TaskState.PENDING:
            return await self._call_pair(
                "inspect_archive_all_pending",
                [keys.pending_key(qname), archived],
                [*args, prefix],
            )
        if state is TaskState.AGGREGATING:
            assert group is not None
            return await self._call_pair(
                "inspect_archive_all_aggregating",
                [keys.group_key(qname, group), archived, keys.all_groups(qname)],
                [*args, prefix, group],
            )
        return await self._call_pair(
            "inspect_archive_all",
            [_zset_key(qname, state, None), archived],
            [*args, prefix, qname],
        )

    async def delete_task(self, qname: str, task_id: str) -> None:
        """Delete one task that is not active (and release its uniqueness lock)."""
        code = await self._call(
            "inspect_delete_task",
            [keys.task_key(qname, task_id), keys.all_groups(qname)],
            [task_id, keys.queue_key_prefix(qname), keys.group_key_prefix(qname)],
        )
        if code == 0:
            raise TaskNotFoundError(qname, task_id)
        if code == -1:
            raise FailedPreconditionError(
                "cannot delete task in active state. use CancelProcessing instead."
            )

    async def delete_all(self, qname: str, state: TaskState, group: str | None = None) -> int:
        """Delete every task of a state (or of one group); returns the count."""
        prefix = keys.task_key_prefix(qname)
        if state is TaskState.PENDING:
            return await self._call(
                "inspect_delete_all_pending", [keys.pending_key(qname)], [prefix]
            )
        if state is TaskState.AGGREGATING:
            assert group is not None
            return await self._call(
                "inspect_delete_all_aggregating",
                [keys.group_key(qname, group), keys.all_groups(qname)],
                [prefix, group],
            )
        return await self._call(
            "inspect_delete_all", [_zset_key(qname, state, None)], [prefix, qname]
        )

    async def update_task_message(self, qname: str, msg: TaskMessage) -> None:
        """Replace a scheduled task's message."""
        key, data = keys.task_key(qname, msg.id), encode_task_message(msg)
        code = await self._call("inspect_update_task_payload", [key], [data])
        if code == 0:
            raise TaskNotFoundError(qname, msg.id)
        if code == -1:
            raise FailedPreconditionError("cannot update payload of a task not in scheduled state")

    async def publish_cancelation(self, task_id: str) -> int:
        """PUBLISH the ID on ``asynq:cancel``; returns the number of subscribers reached."""
        return int(await self._r.publish(keys.CANCEL_CHANNEL, task_id))

    async def publish_stop(self, task_id: str) -> int:
        """Cancel *task_id* for good: PUBLISH :data:`~asyncq._keys.STOP_MARK` + the ID,
        then the ID itself, on ``asynq:cancel``; the subscribers the first reached.

        An asyncq server takes the first and archives the task; the plain ID then finds
        it stopped already. A Go asynq server ignores the first and cancels on the second
        (retried, its only cancellation). One channel, so one ACL grant serves both, and
        Pub/Sub keeps one connection's messages in order.
        """
        reached = int(await self._r.publish(keys.CANCEL_CHANNEL, keys.STOP_MARK + task_id))
        await self._r.publish(keys.CANCEL_CHANNEL, task_id)
        return reached

    async def publish_wakeup(self, qname: str) -> None:
        """Tell idle asyncq workers that *qname* has pending work.

        Best effort: the change it announces is already written, and workers poll anyway,
        so a user whose ACL forbids the channel (Go asynq needs none) is not failed here.
        """
        with contextlib.suppress(NoPermissionError):
            await self._r.publish(keys.wakeup_channel(qname), qname)

    # -- servers, workers, schedulers --------------------------------------------------------

    async def _live_keys(self, index: str) -> list[str]:
        reply = await _lua("inspect_list_server_keys")(self.redis, [index], [int(self.clock())])
        live: list[str] = []
        for key in reply:
            try:
                live.append(_str(key))
            except UnicodeDecodeError as exc:  # not a key any asynq server writes
                _skipped(index, exc)
        return live

    async def list_servers(self) -> list[ServerInfoProto]:
        """The ServerInfo protobufs of live servers (undecodable or expired ones skipped)."""
        servers: list[ServerInfoProto] = []
        for key in await self._live_keys(keys.ALL_SERVERS):
            data = await self._r.get(key)
            if data is None:
                continue
            try:
                servers.append(_parse_record(ServerInfoProto, data))
            except Exception as exc:
                _skipped(key, exc)
        return servers

    async def list_workers(self) -> list[WorkerInfoProto]:
        """The WorkerInfo protobufs of every live server (undecodable ones skipped)."""
        workers: list[WorkerInfoProto] = []
        for key in await self._live_keys(keys.ALL_WORKERS):
            for data in await self._r.hvals(key):
                try:
                    workers.append(_parse_record(WorkerInfoProto, data))
                except Exception as exc:
                    _skipped(key, exc)
        return workers

    async def list_scheduler_entries(self) -> list[SchedulerEntryProto]:
        """The SchedulerEntry protobufs of every live scheduler (undecodable ones skipped)."""
        entries: list[SchedulerEntryProto] = []
        for key in await self._live_keys(keys.ALL_SCHEDULERS):
            for data in await self._r.lrange(key, 0, -1):
                try:
                    entries.append(_parse_record(SchedulerEntryProto, data))
                except Exception as exc:
                    _skipped(key, exc)
        return entries

    async def list_scheduler_enqueue_events(
        self, entry_id: str, page: int, size: int
    ) -> list[SchedulerEnqueueEventProto]:
        """One page of an entry's enqueue events, newest first (page is 0-based)."""
        start = page * size
        members = await self._r.zrevrange(
            keys.scheduler_history_key(entry_id), start, start + size - 1
        )
        events: list[SchedulerEnqueueEventProto] = []
        for data in members:
            try:
                events.append(_parse_record(SchedulerEnqueueEventProto, data))
            except Exception as exc:
                _skipped(keys.scheduler_history_key(entry_id), exc)
        return events

    # -- Redis itself ------------------------------------------------------------------------

    async def cluster_key_slot(self, qname: str) -> int:
        """``CLUSTER KEYSLOT`` of the queue's pending key."""
        reply = await self._cluster_command("CLUSTER", "KEYSLOT", keys.pending_key(qname))
        return _int(reply)

    async def cluster_nodes(self, qname: str) -> list[tuple[str, str]]:
        """(node ID, host:port) of the nodes serving the queue's slot, master first."""
        slot = await self.cluster_key_slot(qname)
        reply = await self._cluster_command("CLUSTER", "SLOTS")
        for entry in reply:
            start, end = _int(entry[0]), _int(entry[1])
            if start <= slot <= end:
                nodes = []
                for node in entry[2:]:
                    host, port = _str(node[0]), _int(node[1])
                    if host in ("", "?"):
                        # An empty endpoint means "the one you asked" (CLUSTER SLOTS docs).
                        host = self._connected_host()
                    node_id = _str(node[2]) if len(node) > 2 else ""
                    nodes.append((node_id, f"{host}:{port}"))
                return nodes
        raise BrokerError(f"no cluster node serves slot {slot} of queue {qname!r}")

    def _connected_host(self) -> str:
        if isinstance(self.redis, RedisCluster):
            node = self.redis.get_default_node()
            return node.host if node is not None else ""
        host = self.redis.connection_pool.connection_kwargs.get("host")
        return str(host) if host else ""

    async def _cluster_command(self, *args: str) -> Any:
        # Separate words keep redis-py's reply parsing out of the way (raw replies), and a
        # cluster client is told where to send a command that names no key.
        extra: dict[str, Any] = {}
        if isinstance(self.redis, RedisCluster):
            await self.redis.initialize()
            extra["target_nodes"] = self.redis.get_default_node()
        try:
            return await self._r.execute_command(*args, **extra)
        except ResponseError as exc:
            if "cluster support disabled" in str(exc).lower():
                raise FailedPreconditionError("Redis is not running in cluster mode") from None
            raise

    async def redis_info(self) -> dict[str, Any]:
        """The parsed ``INFO`` reply."""
        info: dict[str, Any] = await self._r.info()
        return info

    async def _call_pair(
        self, name: str, script_keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[int, int]:
        try:
            first, second = await _lua(name)(self.redis, script_keys, args)
        except ResponseError as exc:
            raise BrokerError(f"{name}: {exc}") from exc
        return _int(first), _int(second)

    async def _call(self, name: str, script_keys: Sequence[str], args: Sequence[Any]) -> int:
        try:
            return _int(await _lua(name)(self.redis, script_keys, args))
        except ResponseError as exc:
            raise BrokerError(f"{name}: {exc}") from exc


def _decode(qname: str, task_id: str, data: bytes) -> TaskMessage:
    return _decode_checked(qname, task_id, data)[0]


def _decode_checked(qname: str, task_id: str, data: bytes) -> tuple[TaskMessage, bool]:
    """The stored message and True, or a placeholder and False when it cannot be decoded."""
    # asynq hides messages it cannot decode; asyncq shows them (the raw bytes as the
    # payload, the reason as the last error) so they can be seen, deleted or archived.
    try:
        # asyncq's own decoder: its errors say what is wrong with the bytes (the
        # generated parser's say "'NoneType' object has no attribute 'value'").
        msg = decode_task_message(data)
    except Exception as exc:
        reason = str(exc) or exc.__class__.__name__
    else:
        if msg.id == task_id:
            return msg, True
        # A lenient parse of garbage yields an empty message; the ID check catches it.
        reason = f"the message's id {msg.id!r} is not the task's id"
    placeholder = TaskMessage(
        id=task_id, queue=qname, payload=data, error_msg=f"undecodable task message: {reason}"
    )
    return placeholder, False


def _zset_key(qname: str, state: TaskState, group: str | None) -> str:
    if state is TaskState.SCHEDULED:
        return keys.scheduled_key(qname)
    if state is TaskState.RETRY:
        return keys.retry_key(qname)
    if state is TaskState.ARCHIVED:
        return keys.archived_key(qname)
    if state is TaskState.COMPLETED:
        return keys.completed_key(qname)
    if state is TaskState.AGGREGATING and group is not None:
        return keys.group_key(qname, group)
    raise ValueError(f"no sorted set holds {state.value} tasks")


def _archive_cutoff(now: float) -> int:
    return int(now - ARCHIVED_EXPIRATION)
