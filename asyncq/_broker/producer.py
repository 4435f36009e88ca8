"""Producer writes: enqueue, schedule and group adds, one task or a batch (asynq's rdb.go)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
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
from asyncq._redis.transport import PackedCommand
from asyncq._time import to_unix
from asyncq.errors import (
    AsyncqError,
    BrokerError,
    DuplicateTaskError,
    ReplicationTimeoutError,
    TaskIdConflictError,
    TaskNotFoundError,
)
from asyncq.proto.asynq import (
    TaskMessage,
)

__all__ = ["MANY_CHUNK", "BatchItem", "PendingItem", "ProducerWrites"]

_log = structlog.get_logger("asyncq")

_ENQUEUE = load_script(LUA_PACKAGE, "enqueue")
_ENQUEUE_UNIQUE = load_script(LUA_PACKAGE, "enqueue_unique")
_SCHEDULE = load_script(LUA_PACKAGE, "schedule")
_SCHEDULE_UNIQUE = load_script(LUA_PACKAGE, "schedule_unique")
_ADD_TO_GROUP = load_script(LUA_PACKAGE, "add_to_group")
_ADD_TO_GROUP_UNIQUE = load_script(LUA_PACKAGE, "add_to_group_unique")
_ENQUEUE_MANY = load_script(LUA_PACKAGE, "enqueue_many")
_REGISTRY = (keys.ALL_QUEUES,)


@dataclass(slots=True)
class BatchItem:
    """One task write as the client describes it (a plan item), for one task or a batch.

    :meth:`Broker.write` runs one, :meth:`Broker.enqueue_batch` many; both turn it
    into a script call in ``_plan``, the one place that knows the KEYS and ARGV.

    Routed like the single-task methods: ``process_at`` set -> scheduled (it
    wins over ``group``); ``group`` set -> aggregating in that group; else
    pending. ``unique_ttl`` (whole seconds, >= 1) takes the message's
    ``unique_key`` lock first; for a scheduled item it is the lock's full TTL (asynq's
    client passes the time from now until ``process_at`` plus the uniqueness period).
    """

    message: TaskMessage
    process_at: datetime | float | None = None
    unique_ttl: int | None = None
    group: str | None = None


@dataclass(slots=True)
class PendingItem:
    """A plain pending task already encoded (the Client's hot path for a batch).

    Written exactly as a :class:`BatchItem` with no schedule, group or lock
    whose message encodes to *data*; consecutive items of one queue share a
    script call.
    """

    queue: str
    task_id: str
    data: bytes


MANY_CHUNK = 500
"""Tasks per ``enqueue_many`` script call (a call blocks Redis while it runs)."""


class _Call:
    """One script call of a batch and the items it writes."""

    __slots__ = ("args", "ids", "indices", "keys", "qk", "script")

    def __init__(
        self,
        script: Script,
        keys_: list[str],
        args: list[Any],
        qk: QueueKeys,
        index: int | None = None,
    ) -> None:
        self.script = script
        self.keys = keys_
        self.args = args
        self.qk = qk
        self.indices: list[int] = [] if index is None else [index]
        self.ids: list[str] = []
        if index is not None:
            self.ids.append(str(args[ID_ARG[script.name]]))

    @property
    def first_id(self) -> str:
        return self.ids[0]


class ProducerWrites(BrokerBase):
    """Client-side writes; each registers its queue in asynq:queues with the task."""

    # -- client-side writes (asynq rdb.go, spec section 3.1) -------------------------------
    # Each enqueue-like script also SADDs the queue into asynq:queues in the same call as
    # the task write (Go asynq SADDs once per client and caches that, so a queue removed
    # under a long-lived client stays unlisted and pattern workers never serve it). On
    # Redis Cluster asynq:queues lives in another slot than the queue's keys, so there the
    # queue is SADDed once per Broker, as Go does. Each also publishes on
    # keys.wakeup_channel(queue) when the pending list went from empty to non-empty
    # (asyncq's instant pickup).

    def _registry(self) -> tuple[str, ...]:
        """The extra KEY that registers the queue in the script call (none on a cluster)."""
        return () if self.on_cluster else _REGISTRY

    def _enqueue_call(
        self, qk: QueueKeys, tid: str, data: bytes, now: float
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """enqueue.lua's KEYS and ARGV for a plain pending task (see :meth:`_enqueue_command`)."""
        cmd = self._enqueue_command(qk, tid, data, now)
        numkeys: int = cmd[1]
        return cmd[2 : 2 + numkeys], cmd[2 + numkeys :]

    def _enqueue_command(self, qk: QueueKeys, tid: str, data: bytes, now: float) -> tuple[Any, ...]:
        """enqueue.lua's EVALSHA arguments (sha, numkeys, KEYS, ARGV) for a plain pending task.

        KEYS: the task key, the pending list and, where there is a registry (not on a
        cluster, where they would span slots), the registry and the waiters list (direct
        delivery). ARGV: the message, the id, the clock in nanoseconds (pending_since),
        the wake-up channel and the queue name; with the waiters list, the queue name and
        this process's clock in whole seconds, which a delivered task's lease starts
        from, as every lease does (see enqueue.lua). All but the task's own parts and
        the clock are built once per queue.
        """
        head, keys_after, mid = (qk.enqueue_call or self._enqueue_parts(qk))[:3]
        tkey, now_ns = qk.task_prefix + tid, int(now * 1_000_000_000)
        if self.on_cluster:
            return (*head, tkey, *keys_after, data, tid, now_ns, *mid)
        return (*head, tkey, *keys_after, data, tid, now_ns, *mid, qk.name, int(now))

    def _enqueue_parts(self, qk: QueueKeys) -> tuple[Any, ...]:
        """What :meth:`_enqueue_command` and :meth:`write_pending` take from the queue,
        built on its first enqueue: the EVALSHA head, the KEYS after the task key, ARGV 4-5,
        and, on the fast transport (never on a cluster), the format of the whole command
        but for the task's and the clock's parts (:class:`PackedCommand`), and the task
        key's prefix as bytes."""
        reg = self._registry()
        keys_after = (qk.pending, *reg, qk.waiters) if reg else (qk.pending,)
        head = (_ENQUEUE.sha, 1 + len(keys_after))
        mid = (qk.wakeup, qk.name)
        command_format = None
        if self.fast is not None and reg:
            # the task key, the message, the id, the clock in ns and in seconds open
            args = ("EVALSHA", *head, None, *keys_after, None, None, None, *mid, qk.name, None)
            command_format = PackedCommand(args).format
        parts = qk.enqueue_call = (head, keys_after, mid, command_format, qk.task_prefix.encode())
        return parts

    def _dropped(self, reply: Any, qk: QueueKeys) -> Any:
        """enqueue.lua's *reply* as 1 or 0, with each waiters member it dropped (one no
        worker wrote: see enqueue.lua) named in a warning."""
        if not isinstance(reply, list):
            return reply
        for member in reply[1:]:
            text = (
                member.decode("utf-8", "backslashreplace") if isinstance(member, bytes) else member
            )
            _log.warning(
                "dropped a member no worker wrote from a waiters list; the task was enqueued",
                key=qk.waiters,
                member=text,
            )
        return reply[0]

    async def _register_once(self, qk: QueueKeys) -> None:
        if self.on_cluster and qk.name not in self._published:
            await self._register_queue(qk)

    async def write(self, item: BatchItem) -> None:
        """Write one task as *item* describes it: the same plan as :meth:`enqueue_batch`.

        Raises TaskIdConflictError when ``t:<id>`` exists, DuplicateTaskError when
        the item's unique lock is held, ValueError for an invalid item.
        """
        now = self.clock()
        script, keys_, args, qk = self._plan(item, now)
        await self._register_once(qk)
        tid = item.message.id
        res = self._dropped(await self._run(script, keys_, args, qk.name, tid), qk)
        if res in (0, -1):
            await self.confirm_existing(qk.name, tid)
        if res == 0:
            raise conflict_error(qk.name, tid)
        if res == -1:
            raise duplicate_error(unique_key_of(item.message))

    async def write_pending(self, queue: str, task_id: str, data: bytes) -> None:
        """Write a pending task from its encoded message (the Client's hot path).

        The same script, KEYS and ARGV as :meth:`write` for a plain pending
        item, without building a TaskMessage: one EVALSHA, whose arguments
        around the task's id, message and clock are built once per queue.
        Raises TaskIdConflictError when ``t:<id>`` exists.
        """
        qk = self._queues.get(queue) or self._q(queue)
        if self.on_cluster and queue not in self._published:
            await self._register_queue(qk)
        now = self.clock()
        if self.replication is None:
            parts = qk.enqueue_call or self._enqueue_parts(qk)
            command_format: bytes | None = parts[3]
            try:
                if command_format is not None and self.fast is not None:
                    # The EVALSHA packed by its format, the values spread out by hand (see
                    # PackedCommand): the enqueue's hot path.
                    ib = task_id.encode()
                    tkey = parts[4] + ib
                    ns = b"%d" % int(now * 1_000_000_000)
                    secs = b"%d" % int(now)
                    res = await self.fast.send_packed(
                        command_format % (
                            len(tkey), tkey, len(data), data, len(ib), ib, len(ns), ns,
                            len(secs), secs,
                        )
                    )  # fmt: skip
                else:
                    res = await self._cmd.evalsha(*self._enqueue_command(qk, task_id, data, now))
            except NoScriptError:
                cmd = self._enqueue_command(qk, task_id, data, now)
                res = await self._run_enqueue(cmd, queue, task_id)
            except ResponseError as exc:
                raise script_error(exc, _ENQUEUE, queue, task_id) from exc
        else:
            cmd = self._enqueue_command(qk, task_id, data, now)
            res = await self._run_enqueue(cmd, queue, task_id)
        if res != 1 and self._dropped(res, qk) == 0:
            await self.confirm_existing(queue, task_id)
            raise conflict_error(queue, task_id)

    async def _run_enqueue(self, cmd: tuple[Any, ...], queue: str, task_id: str) -> Any:
        """*cmd* (see :meth:`_enqueue_command`) through the script runner: it loads the
        script when Redis has not got it and waits for replicas under min_replicas."""
        numkeys: int = cmd[1]
        return await self._run(_ENQUEUE, cmd[2 : 2 + numkeys], cmd[2 + numkeys :], queue, task_id)

    async def enqueue(self, msg: TaskMessage) -> None:
        """Write a pending task. Raises TaskIdConflictError when ``t:<id>`` exists."""
        await self.write(BatchItem(msg))

    async def schedule(self, msg: TaskMessage, process_at: datetime) -> None:
        """Write a scheduled task. Raises TaskIdConflictError."""
        await self.write(BatchItem(msg, process_at=process_at))

    async def enqueue_batch(
        self, items: Sequence[BatchItem | PendingItem]
    ) -> list[Exception | None]:
        """Enqueue many tasks in one pipeline; one result per item (None = written).

        A result is TaskIdConflictError when the ID already existed,
        DuplicateTaskError when the unique lock is held, ValueError for an
        invalid item, or the Redis error for that item. Connection errors
        raise, as for a single enqueue (items may or may not be written).
        Items are written in order; a run of consecutive :class:`PendingItem`
        of one queue goes in one ``enqueue_many`` script call per
        ``MANY_CHUNK`` items.
        """
        results: list[Exception | None] = [None] * len(items)
        now = self.clock()
        now_ns = int(now * 1_000_000_000)
        calls: list[_Call] = []
        run: _Call | None = None
        for i, item in enumerate(items):
            try:
                if isinstance(item, PendingItem):
                    tid = item.task_id
                    if not tid or "{" in tid or "}" in tid:
                        keys.refuse_braces("task ID", tid)
                        raise ValueError(f"task in queue {item.queue!r} has no id")
                    if run is None or run.qk.name != item.queue or len(run.indices) >= MANY_CHUNK:
                        qk = self._queues.get(item.queue) or self._q(item.queue)
                        run = _Call(_ENQUEUE_MANY, [qk.pending], [now_ns, qk.wakeup, qk.name], qk)
                        calls.append(run)
                    # _Call.add, inlined: this loop runs once per task of a batch
                    run.indices.append(i)
                    run.ids.append(tid)
                    run.keys.append(run.qk.task_prefix + tid)
                    run.args += (tid, item.data)
                    continue
                run = None
                script, keys_, args, qk = self._plan(item, now)
                calls.append(_Call(script, list(keys_), list(args), qk, i))
            except ValueError as exc:
                results[i] = exc
        if not calls:
            return results
        for script in {c.script for c in calls}:
            await script.load(self._cmd)
        registry = self._registry()
        for c in calls:
            if c.script is _ENQUEUE_MANY:
                c.keys += registry
        new_queues = [] if registry else sorted({c.qk.name for c in calls} - self._published)
        commands: list[tuple[Any, ...]] = []
        if new_queues:
            commands.append(("SADD", keys.ALL_QUEUES, *new_queues))
        for c in calls:
            commands.append(("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args))
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
        for c, first_reply in zip(calls, replies, strict=True):
            reply = first_reply
            if isinstance(reply, NoScriptError):
                # Flushed between SCRIPT LOAD and the pipeline: run it alone (reloads).
                try:
                    reply = await self._run(c.script, c.keys, c.args, c.qk.name, c.first_id)
                except (BrokerError, TaskNotFoundError, ReplicationTimeoutError) as exc:
                    reply = exc
            if c.script is _ENQUEUE_MANY:
                outcomes = (
                    reply if isinstance(reply, list) else [reply] * len(c.indices)
                )  # an error reply fails each task of the call
                check = self.replication is not None
                for i, tid, outcome in zip(c.indices, c.ids, outcomes, strict=True):
                    if outcome != 1 or check:  # 1: written, the common case
                        results[i] = self._outcome(outcome, c, tid, items[i], waited)
            else:
                i = c.indices[0]
                reply = self._dropped(reply, c.qk) if c.script is _ENQUEUE else reply
                results[i] = self._outcome(reply, c, c.first_id, items[i], waited)
        if self.replication is not None:
            await self._confirm_refused(results, items)
        return results

    async def _confirm_refused(
        self, results: list[Exception | None], items: Sequence[BatchItem | PendingItem]
    ) -> None:
        """:meth:`confirm_existing` for a batch's refused items, proven at once (one WAIT
        covers the master's whole dataset); unproven, each becomes a ReplicationTimeoutError."""
        refused = [
            i
            for i, r in enumerate(results)
            if isinstance(r, TaskIdConflictError | DuplicateTaskError)
        ]
        if not refused:
            return
        first = items[refused[0]]
        try:
            await self.confirm_existing(*_where(first))
        except ReplicationTimeoutError as exc:
            for i in refused:
                queue, task_id = _where(items[i])
                results[i] = ReplicationTimeoutError(
                    acknowledged=exc.acknowledged,
                    required=exc.required,
                    timeout=exc.timeout,
                    queue=queue,
                    task_id=task_id,
                )

    def _outcome(
        self,
        reply: Any,
        call: _Call,
        tid: str,
        item: BatchItem | PendingItem,
        waited: Any,
    ) -> Exception | None:
        """One item's result from its script's reply (None: written)."""
        if isinstance(reply, AsyncqError):
            return reply
        if isinstance(reply, ResponseError):
            return script_error(reply, call.script, call.qk.name, tid)
        if isinstance(reply, Exception):
            return reply
        if reply == 0:
            return conflict_error(call.qk.name, tid)
        if reply == -1 and isinstance(item, BatchItem):
            return duplicate_error(unique_key_of(item.message))
        if self.replication is not None and waited is not None:
            try:
                self.replication.check(waited, queue=call.qk.name, task_id=tid)
            except (ResponseError, ReplicationTimeoutError) as exc:
                return exc
        return None

    def _plan(
        self, item: BatchItem, now: float
    ) -> tuple[Script, tuple[str, ...], tuple[Any, ...], QueueKeys]:
        """The one place that knows each enqueue-like script's KEYS and ARGV."""
        now_s, now_ns = int(now), int(now * 1_000_000_000)
        msg = item.message
        qk = self._msg_queue(msg)
        reg = self._registry()
        name = (qk.name,) if reg else ()
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
                    (ukey, tkey, qk.scheduled, *reg),
                    (tid, secs, at_s, encode_task_message(msg), *name),
                    qk,
                )
            return (
                _SCHEDULE,
                (tkey, qk.scheduled, *reg),
                (encode_task_message(msg), at_s, tid, *name),
                qk,
            )
        if item.group is not None:
            group = item.group
            check_group(group)
            gkey = qk.group_prefix + group
            if unique:
                return (
                    _ADD_TO_GROUP_UNIQUE,
                    (tkey, gkey, qk.groups, ukey, *reg),
                    (encode_task_message(msg), tid, now_s, group, secs, *name),
                    qk,
                )
            return (
                _ADD_TO_GROUP,
                (tkey, gkey, qk.groups, *reg),
                (encode_task_message(msg), tid, now_s, group, *name),
                qk,
            )
        if unique:
            return (
                _ENQUEUE_UNIQUE,
                (ukey, tkey, qk.pending, *reg),
                (tid, secs, encode_task_message(msg), now_ns, qk.wakeup, qk.name, *name),
                qk,
            )
        return (_ENQUEUE, *self._enqueue_call(qk, tid, encode_task_message(msg), now), qk)


def _where(item: BatchItem | PendingItem) -> tuple[str, str]:
    """An item's queue and task ID."""
    if isinstance(item, PendingItem):
        return item.queue, item.task_id
    return item.message.queue, item.message.id
