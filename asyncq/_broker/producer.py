"""Producer writes: enqueue, schedule and group adds, one task or a batch (asynq's rdb.go)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import (
    ID_ARG,
    LUA_PACKAGE,
    BrokerBase,
    QueueKeys,
    check_group,
    conflict_error,
    duplicate_error,
    lock_ttl,
    script_error,
    unique_key_of,
)
from asyncq._codec import encode_task_message
from asyncq._redis.scripts import Script, load_script
from asyncq._time import to_unix
from asyncq.errors import (
    AsyncqError,
    BrokerError,
    ReplicationTimeoutError,
    TaskNotFoundError,
)
from asyncq.proto.asynq import (
    TaskMessage,
)

__all__ = ["BatchItem", "ProducerWrites"]

_ENQUEUE = load_script(LUA_PACKAGE, "enqueue")
_ENQUEUE_UNIQUE = load_script(LUA_PACKAGE, "enqueue_unique")
_SCHEDULE = load_script(LUA_PACKAGE, "schedule")
_SCHEDULE_UNIQUE = load_script(LUA_PACKAGE, "schedule_unique")
_ADD_TO_GROUP = load_script(LUA_PACKAGE, "add_to_group")
_ADD_TO_GROUP_UNIQUE = load_script(LUA_PACKAGE, "add_to_group_unique")


@dataclass(slots=True)
class BatchItem:
    """One task write as the client describes it (a plan item), for one task or a batch.

    :meth:`Broker.write` runs one, :meth:`Broker.enqueue_batch` many; both turn it
    into a script call in ``_plan``, the one place that knows the KEYS and ARGV.

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


class ProducerWrites(BrokerBase):
    """Client-side writes; each enqueue-like method first registers its queue in asynq:queues."""

    # -- client-side writes (asynq rdb.go, spec section 3.1) -------------------------------
    # Each enqueue-like method also SADDs the queue into asynq:queues the first time
    # this Broker sees the queue, and publishes on keys.wakeup_channel(queue) when the
    # pending list went from empty to non-empty (asyncq's instant pickup).

    async def write(self, item: BatchItem) -> None:
        """Write one task as *item* describes it: the same plan as :meth:`enqueue_batch`.

        Raises TaskIdConflictError when ``t:<id>`` exists, DuplicateTaskError when
        the item's unique lock is held, ValueError for an invalid item.
        """
        now = self.clock()
        script, keys_, args, qk = self._plan(item, int(now), int(now * 1_000_000_000))
        if qk.name not in self._published:
            await self._register_queue(qk)
        tid = item.message.id
        res = await self._run(script, keys_, args, qk.name, tid)
        if res == 0:
            raise conflict_error(qk.name, tid)
        if res == -1:
            raise duplicate_error(unique_key_of(item.message))

    async def enqueue(self, msg: TaskMessage) -> None:
        """Write a pending task. Raises TaskIdConflictError when ``t:<id>`` exists."""
        await self.write(BatchItem(msg))

    async def enqueue_unique(self, msg: TaskMessage, ttl: int) -> None:
        """Pending task guarded by ``msg.unique_key`` for *ttl* s.

        Raises DuplicateTaskError (lock held) or TaskIdConflictError.
        """
        await self.write(BatchItem(msg, unique_ttl=ttl))

    async def schedule(self, msg: TaskMessage, process_at: datetime) -> None:
        """Write a scheduled task. Raises TaskIdConflictError."""
        await self.write(BatchItem(msg, process_at=process_at))

    async def schedule_unique(self, msg: TaskMessage, process_at: datetime, ttl: int) -> None:
        """Scheduled task guarded by a unique lock. Raises DuplicateTaskError/TaskIdConflictError.

        *ttl* is the lock's whole TTL in seconds; asynq's client passes the time
        from now until *process_at* plus the uniqueness period.
        """
        await self.write(BatchItem(msg, process_at=process_at, unique_ttl=ttl))

    async def add_to_group(self, msg: TaskMessage, group: str) -> None:
        """Write an aggregating task into ``g:<group>``. Raises TaskIdConflictError."""
        await self.write(BatchItem(msg, group=group))

    async def add_to_group_unique(self, msg: TaskMessage, group: str, ttl: int) -> None:
        """Aggregating task guarded by a unique lock. Raises DuplicateTaskError/TaskIdConflictError.

        The lock key is ``msg.unique_key`` (asynq recomputes the same key from
        queue, type and payload).
        """
        await self.write(BatchItem(msg, group=group, unique_ttl=ttl))

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
        planned: list[tuple[int, Script, tuple[str, ...], tuple[Any, ...], QueueKeys]] = []
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
        if self.replication is not None:
            commands.append(self.replication.wait)
        replies = await self._pipeline(commands)
        waited = replies.pop() if self.replication is not None else None
        if new_queues:
            sadd_reply = replies.pop(0)
            if isinstance(sadd_reply, Exception):
                # The tasks are written; the queues must still become visible to inspectors.
                await self._cmd.execute_command("SADD", keys.ALL_QUEUES, *new_queues)
            self._published.update(new_queues)
        for (i, script, keys_, args, qk), first_reply in zip(planned, replies, strict=True):
            tid = args[ID_ARG[script.name]]
            reply = first_reply
            if isinstance(reply, NoScriptError):
                # Flushed between SCRIPT LOAD and the pipeline: run it alone (reloads).
                try:
                    reply = await self._run(script, keys_, args, qk.name, tid)
                except (BrokerError, TaskNotFoundError, ReplicationTimeoutError) as exc:
                    reply = exc
            if isinstance(reply, AsyncqError):
                results[i] = reply
            elif isinstance(reply, ResponseError):
                results[i] = script_error(reply, script, qk.name, tid)
            elif isinstance(reply, Exception):
                results[i] = reply
            elif reply == 0:
                results[i] = conflict_error(qk.name, tid)
            elif reply == -1:
                results[i] = duplicate_error(unique_key_of(items[i].message))
            elif self.replication is not None and waited is not None:
                try:
                    self.replication.check(waited, queue=qk.name, task_id=tid)
                except (ResponseError, ReplicationTimeoutError) as exc:
                    results[i] = exc
        return results

    def _plan(
        self, item: BatchItem, now_s: int, now_ns: int
    ) -> tuple[Script, tuple[str, ...], tuple[Any, ...], QueueKeys]:
        """The one place that knows each enqueue-like script's KEYS and ARGV."""
        msg = item.message
        qk = self._msg_queue(msg)
        tid = msg.id
        tkey = qk.task_prefix + tid
        unique = item.unique_ttl is not None
        ukey = unique_key_of(msg) if unique else ""
        secs = lock_ttl(item.unique_ttl) if item.unique_ttl is not None else 0
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
            check_group(group)
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
