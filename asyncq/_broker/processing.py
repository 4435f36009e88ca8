"""Processing transitions: dequeue, ack, requeue, retry, archive, forward and leases."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from redis.exceptions import NoScriptError, ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import (
    ARCHIVE_MAX_SIZE,
    ARCHIVED_EXPIRATION,
    LUA_PACKAGE,
    MAX_INT64,
    STATS_TTL,
    AckCall,
    BrokerBase,
    ack_results,
    encode_with,
)
from asyncq._broker.durable import (
    RUN_HEADER,
    RUN_QUEUE_HEADER,
    STEP_HEADER,
    Recorded,
    ack_step,
    is_durable_step,
)
from asyncq._broker.workflow import ADVANCE_LUA, is_workflow_step, step_place
from asyncq._redis.scripts import Script, load_script
from asyncq._time import to_unix
from asyncq.errors import (
    AsyncqError,
    ReplicationTimeoutError,
)
from asyncq.proto.asynq import (
    TaskMessage,
)

_log = structlog.get_logger("asyncq")

__all__ = ["DequeuedTask", "ProcessingTransitions"]

_DONE = load_script(LUA_PACKAGE, "done")
_MARK_AS_COMPLETE = load_script(LUA_PACKAGE, "mark_as_complete")
# advance_ok() of workflow_advance.lua records the workflow steps among the tasks.
_ACK_MANY = Script("ack_many", ADVANCE_LUA + "\n" + load_script(LUA_PACKAGE, "ack_many").source)
# ack_many.lua as a function, called once per queue by ack_queues.lua (one round trip).
_ACK_QUEUES = Script(
    "ack_queues",
    ADVANCE_LUA
    + "\nlocal function ack_one(KEYS, ARGV)\n"
    + load_script(LUA_PACKAGE, "ack_many").source
    + "\nend\n"
    + load_script(LUA_PACKAGE, "ack_queues").source,
)
_REQUEUE = load_script(LUA_PACKAGE, "requeue")
_RETRY = load_script(LUA_PACKAGE, "retry")
_ARCHIVE = load_script(LUA_PACKAGE, "archive")


@dataclass(slots=True)
class DequeuedTask:
    """A task leased to this worker, fetched from its queue or delivered by an enqueue: the
    decoded message and its lease expiry (unix s)."""

    message: TaskMessage
    lease_expiry: float


class ProcessingTransitions(BrokerBase):
    """Server-side transitions of a task: pending, active, retry, archived, completed."""

    # -- server-side processing (spec section 3.2) ------------------------------------------

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
        data = encode_with(msg, completed_at=now_s)
        args = (tid, now_s + STATS_TTL, now_s + msg.retention, data, MAX_INT64)
        await self._run(_MARK_AS_COMPLETE, keys_, args, qk.name, tid)

    # -- batched acknowledgement (asyncq extension) --------------------------------------------

    async def ack_many(
        self,
        items: Sequence[tuple[TaskMessage, bool]],
        *,
        runs_here: Callable[[str], bool] | None = None,
        inline: Mapping[str, bytes | None] | None = None,
    ) -> list[Exception | DequeuedTask | Recorded | None]:
        """Acknowledge finished tasks given as ``(msg, complete)`` pairs.

        ``complete=True`` is :meth:`mark_as_complete` (kept for ``msg.retention``),
        ``False`` is :meth:`done`; each task gets exactly that method's effect, in
        the given order, with one "now" for the whole batch. A workflow step
        (:func:`~asyncq._broker.workflow.is_workflow_step`) gets the effect of
        ``ack_step`` with mode ``complete`` or ``done`` instead: its workflow
        records it and hands off to the next stage in the same call, so a step's
        success is never acknowledged without it. A durable run's step
        (:func:`~asyncq._broker.durable.is_durable_step`) gets the effect of its
        ``ack_step``: its result is recorded in its run's record, which goes to
        pending when it waits for nothing more. All tasks of a queue take one
        script call; on one server all queues share it (``ack_queues.lua``), on a
        cluster one call per queue in a pipeline.

        One result per item: None when acknowledged, TaskNotFoundError when the
        task is not active (any more), ValueError for a message without id or
        queue, BrokerError when the queue's script failed (then every item of
        that queue gets it and their state is unknown). A task whose unique_key
        lies outside its queue's hash tag (never written by asynq or asyncq) is
        acknowledged afterwards with the single-task method, and so is, on a
        cluster, a durable step whose run is in another queue (another hash slot:
        it fails alone, as docs/durable.md says, not its batch). Connection errors
        raise; the tasks may or may not be acknowledged.

        *runs_here* (without replication: a continued run's write is confirmed by nothing
        but this reply) says of a run's queue whether this worker takes a run its step
        wakes: the run then continues here instead of going to pending (active, leased
        until now + ``lease_duration``, as a fetch leaves it), and the step's result is
        the run's :class:`DequeuedTask`, to be started in the step's slot.

        *inline* maps the ids of durable steps run inline, in the slot of their run's
        attempt, which goes on on this worker (:func:`~asyncq._broker.durable.start_inline`),
        to the result each handler wrote, held until now (None: none): this call writes
        it. Such a step's result is :class:`~asyncq._broker.durable.Recorded` with the
        result this call recorded in the run, or None (acknowledged, nothing recorded by
        this call: the attempt suspends to learn what the record holds).
        """
        results: list[Exception | DequeuedTask | Recorded | None] = [None] * len(items)
        if self.replication is not None:
            runs_here = None
        now = self.clock()
        now_s = int(now)
        stats_exp = now_s + STATS_TTL
        calls: dict[str, AckCall] = {}
        strays: list[int] = []
        for i, (msg, complete) in enumerate(items):
            # A queue met earlier in the batch was checked then: only the id is left.
            call = calls.get(msg.queue)
            if call is None or not msg.id:
                try:
                    qk = self._msg_queue(msg)
                except ValueError as exc:
                    results[i] = exc
                    continue
                call = calls[qk.name] = AckCall(qk, stats_exp)
            # Only a message with headers can be a workflow step.
            if msg.headers and is_workflow_step(msg):
                # A step has no unique key (refused when the workflow starts), as ack_step.
                wkey, place = step_place(msg)
                call.indices.append(i)
                call.args += (msg.id, wkey, place)
                if complete:
                    call.kinds.append("W")
                    call.args += (now_s + msg.retention, encode_with(msg, completed_at=now_s))
                else:
                    call.kinds.append("w")
                continue
            if msg.headers and is_durable_step(msg):
                # A step has no unique key either; its run's record is written as ack_step.
                headers = msg.headers
                if self.on_cluster and headers[RUN_QUEUE_HEADER] != call.qk.name:
                    strays.append(i)  # its run's keys are in another slot: not in the batch
                    continue
                run_queue = headers[RUN_QUEUE_HEADER]
                call.indices.append(i)
                call.args += (msg.id, run_queue, headers[RUN_HEADER], headers[STEP_HEADER])
                if inline and msg.id in inline:
                    kind = "i"
                    held = inline[msg.id]
                    call.args.append(b"" if held is None else b"=" + held)
                elif runs_here is not None and runs_here(run_queue):
                    kind = "h"
                else:
                    kind = "r"
                if complete:
                    call.kinds.append(kind.upper())
                    call.args += (now_s + msg.retention, encode_with(msg, completed_at=now_s))
                else:
                    call.kinds.append(kind)
                continue
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
                args.append(encode_with(msg, completed_at=now_s))
            else:
                call.kinds.append("D" if ukey else "d")
        planned = [call for call in calls.values() if call.indices]
        if planned:
            expiry = now + self.lease_duration  # of the runs that continue here
            replies = await self._ack_calls(planned, now, int(expiry))
            for call, reply in zip(planned, replies, strict=True):
                ack_results(results, items, call.qk.name, call.indices, reply)
                if isinstance(reply, Exception):
                    continue
                kinds = call.args[4]  # a run continues here only from an h or H
                if "h" in kinds or "H" in kinds:
                    await self._runs_continued(results, items, call, reply, expiry)
                if "i" in kinds or "I" in kinds:
                    for i, kind, code in zip(call.indices, kinds, reply, strict=True):
                        if kind in "iI":
                            results[i] = Recorded(code) if isinstance(code, bytes) else None
        for i in strays:
            msg, complete = items[i]
            try:
                if msg.headers and is_durable_step(msg):
                    await ack_step(self, msg, "complete" if complete else "done")
                else:
                    await (self.mark_as_complete(msg) if complete else self.done(msg))
            except AsyncqError as exc:
                results[i] = exc
        return results

    async def _runs_continued(
        self,
        results: list[Exception | DequeuedTask | Recorded | None],
        items: Sequence[tuple[TaskMessage, bool]],
        call: AckCall,
        reply: Sequence[Any],
        expiry: float,
    ) -> None:
        """Read the message of each run that continues here (the reply of an h or H step
        has it in place of 1) into its step's result; a message unusable here is
        archived, as a fetch would, and the step's result stays None (acknowledged)."""
        for i, kind, code in zip(call.indices, call.args[4], reply, strict=True):
            if kind not in "hH" or not isinstance(code, bytes):
                continue
            headers = items[i][0].headers
            run_q, run_id = self._q(headers[RUN_QUEUE_HEADER]), headers[RUN_HEADER]
            found = await self._decode_or_archive(
                run_q, run_id, code, self.clock(), run_q.active, check_queue=True
            )
            if found is not None:
                results[i] = DequeuedTask(found, expiry)

    async def _ack_calls(self, planned: list[AckCall], now: float, expiry: int) -> list[Any]:
        """Run ack_many.lua once per queue; replies (or ResponseErrors) in order."""
        calls: list[tuple[tuple[str, ...], list[Any]]] = []
        for call in planned:
            qk = call.qk
            kinds = call.args[4] = "".join(call.kinds)
            if any(kind in kinds for kind in "hH"):
                call.args.append(expiry)  # the lease of a run continuing here
            if any(step in kinds for step in "wWrRhHiI"):
                call.args += (int(now), int(now * 1e9))  # the hand-off's "now"
            pday = qk.daily(now)[0]
            calls.append(((qk.active, qk.lease, qk.completed, pday, qk.processed), call.args))
        rep = self.replication
        if len(calls) == 1 and rep is None:
            try:
                return [await _ACK_MANY(self._cmd, *calls[0])]
            except ResponseError as exc:
                return [exc]
        if rep is None and not self.on_cluster:
            # Several queues on one server: one script call for all of them.
            flat: list[Any] = []
            for k, args in calls:
                flat += (*k, len(args), *args)
            try:
                replies: list[Any] = await _ACK_QUEUES(self._cmd, (), flat)
            except ResponseError as exc:
                return [exc] * len(calls)
            return replies
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", _ACK_MANY.sha, len(k), *k, *args) for k, args in calls
        ]
        if rep is not None:
            commands.append(rep.wait)  # min_replicas: in the same pipeline, same connection
        replies = await self._pipeline(commands)
        waited = replies.pop() if rep is not None else None
        for n, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                # Not loaded (restart, SCRIPT FLUSH, new node): the call did not run.
                try:
                    if rep is None:
                        replies[n] = await _ACK_MANY(self._cmd, *calls[n])
                    else:
                        replies[n] = await rep.script(
                            self._pipeline, self._cmd, _ACK_MANY, *calls[n]
                        )
                except (ResponseError, ReplicationTimeoutError) as exc:
                    replies[n] = exc
            elif rep is not None and not isinstance(reply, Exception):
                try:
                    rep.check(waited)
                except (ResponseError, ReplicationTimeoutError) as exc:
                    # Written, replication unconfirmed: each task of the call gets the error.
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
        self,
        msg: TaskMessage,
        process_at: datetime,
        err_msg: str,
        *,
        is_failure: bool,
        lease_expired_by: float | None = None,
    ) -> None:
        """Move an active task to ``retry`` at *process_at*, recording the error.

        The stored message gets ``error_msg``, ``last_failed_at`` = now and,
        when *is_failure*, ``retried`` + 1; *msg* itself is unchanged. With
        *lease_expired_by* (the recoverer's cutoff, unix seconds) the task is
        taken only while its lease still ends by then, else TaskNotFoundError.
        """
        qk = self._msg_queue(msg)
        at = to_unix(process_at)
        tid = msg.id
        now = self.clock()
        now_s = int(now)
        pday, fday = qk.daily(now)
        if is_failure:
            data = encode_with(
                msg, retried=msg.retried + 1, error_msg=err_msg, last_failed_at=now_s
            )
        else:
            data = encode_with(msg, error_msg=err_msg, last_failed_at=now_s)
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
        args: tuple[str | bytes | int | float, ...] = (
            tid, data, at, now_s + STATS_TTL, "1" if is_failure else "0", MAX_INT64,
        )  # fmt: skip
        if lease_expired_by is not None:
            args += (lease_expired_by,)
        await self._run(_RETRY, keys_, args, qk.name, tid)
        if self.on_retry is not None:
            self.on_retry(at)

    async def archive(
        self, msg: TaskMessage, err_msg: str, *, lease_expired_by: float | None = None
    ) -> None:
        """Move an active task to ``archived``, trimming old/excess archived tasks.

        *lease_expired_by* as for :meth:`retry`.

        The stored message gets ``error_msg`` and ``last_failed_at`` = now.
        Archived tasks older than 90 days and all but the newest 9,999 are
        deleted together with their task hashes.
        """
        qk = self._msg_queue(msg)
        tid = msg.id
        now = self.clock()
        now_s = int(now)
        pday, fday = qk.daily(now)
        data = encode_with(msg, error_msg=err_msg, last_failed_at=now_s)
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
        args: tuple[str | bytes | int | float, ...] = (
            tid,
            data,
            now_s,
            now_s - ARCHIVED_EXPIRATION,
            ARCHIVE_MAX_SIZE,
            now_s + STATS_TTL,
            MAX_INT64,
        )
        if lease_expired_by is not None:
            args += (lease_expired_by,)
        await self._run(_ARCHIVE, keys_, args, qk.name, tid)

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

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int:
        """HSET the task's ``result`` field; returns len(data)."""
        qk = self._q(qname)
        await self._cmd.execute_command("HSET", qk.task_prefix + task_id, "result", data)
        return len(data)

    async def publish_cancelation(self, task_id: str) -> None:
        """PUBLISH the task ID on ``asynq:cancel``."""
        await self._cmd.execute_command("PUBLISH", keys.CANCEL_CHANNEL, task_id)
