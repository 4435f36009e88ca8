"""Durable runs in Redis: suspend a run, acknowledge its steps, deliver signals, read a run.

A durable run is an ordinary asynq task (its function's type, JSON arguments) whose
record, ``asynq:{<queue>}:asyncq:run:<id>`` (:func:`asyncq._keys.run_key`), lists what
its attempts decided: each entry's signature and result. An attempt that needs what is
not recorded yet ends by *suspending* (:func:`suspend_run`, ``lua/durable_suspend.lua``):
in one script it records what it decided, enqueues the steps it asked for, and moves
the run task from ``active`` to ``scheduled``, scored by when time alone resumes it (far
in the future when only a step or a signal can). Go's CLI and asynqmon list a waiting
run as a scheduled task; running it by hand early only makes it replay and wait again.

A step is an ordinary task carrying the headers :data:`RUN_HEADER` (the run's id),
:data:`RUN_QUEUE_HEADER` (the run's queue) and :data:`STEP_HEADER` (its index in the
run). Its final outcome (success, archive, revoke) is acknowledged with
:func:`ack_step` (``lua/durable_step_done.lua``): the same script records the result (or
error) in the run's record and, when the run waits for nothing more, moves it to pending.
A success is acknowledged in the worker's batch of successes instead
(:meth:`~asyncq._broker.processing.ProcessingTransitions.ack_many`), which records it the
same way in the same call (``record_step()``, ``lua/_lib/durable_step.lua``).
A signal (:func:`send_signal`) does the same for the runs waiting for it.

An attempt that waits for one step which the worker running it takes may instead go on
while the step runs in its slot (an *inline* step, :func:`start_inline`,
``lua/durable_inline.lua``): the step is written active and leased to that worker, the
run task stays active, and the step's batched acknowledgement answers with the result
it recorded (:class:`Recorded`), with which the attempt goes on. Anything else (a retry,
a lost lease, a record that moved on) ends the attempt as a suspension after all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from redis.exceptions import RedisClusterException, ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import (
    ARCHIVE_MAX_SIZE,
    ARCHIVED_EXPIRATION,
    LUA_PACKAGE,
    MAX_INT64,
    STATS_TTL,
    BrokerBase,
    conflict_error,
    encode_with,
    script_error,
)
from asyncq._codec import encode_task_message
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import Script, load_script
from asyncq._redis.transport import FastConnection
from asyncq.errors import BrokerError
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "FAILED_RUN_KEPT",
    "FAR_FUTURE",
    "INLINE_STEPS",
    "PENDING_RUN_KEPT",
    "RUN_HEADER",
    "RUN_QUEUE_HEADER",
    "STEP_HEADER",
    "InlineSteps",
    "Recorded",
    "RunSuspended",
    "SignalWait",
    "StepAckMode",
    "SuspendPlan",
    "ack_step",
    "is_durable_step",
    "read_run",
    "record_wait",
    "send_signal",
    "settle_run",
    "start_inline",
    "start_run",
    "suspend_run",
]

FAILED_RUN_KEPT = ARCHIVED_EXPIRATION
"""Seconds a failed or cancelled run's record is kept: as long as asynq keeps an archived
task, so the archived run can be run again (after a fix) from its record."""

PENDING_RUN_KEPT = ARCHIVED_EXPIRATION
"""Seconds the record a run gets when it starts (state ``pending``) is kept unless an
attempt writes to it: the record of a run whose task was deleted before its first
attempt must not stay for good, and a run still waiting for a worker after this long
is only left out of the Inspector's views until its first attempt writes its record."""

RUN_HEADER = "asyncq-durable-run"
RUN_QUEUE_HEADER = "asyncq-durable-queue"
STEP_HEADER = "asyncq-durable-step"

FAR_FUTURE = 253402300799
"""The score of a run waiting for a step or a signal only: 9999-12-31T23:59:59Z, the
latest time asynq's tools show; no forwarder reaches it."""

_SUSPEND = load_script(LUA_PACKAGE, "durable_suspend")
_STEP_DONE = load_script(LUA_PACKAGE, "durable_step_done")
_SIGNAL = load_script(LUA_PACKAGE, "durable_signal")
_RECORD = load_script(LUA_PACKAGE, "durable_record")
_SETTLE = load_script(LUA_PACKAGE, "durable_settle")
_START = load_script(LUA_PACKAGE, "durable_start")
_INLINE = load_script(LUA_PACKAGE, "durable_inline")

StepAckMode = Literal["done", "complete", "archive", "revoke"]


@dataclass(frozen=True, slots=True)
class SignalWait:
    """What a run suspended on ``wait_for`` waits for: the signal and the wait's index."""

    name: str
    key: str
    index: int


@dataclass(frozen=True, slots=True)
class SuspendPlan:
    """What a suspended attempt writes (:func:`suspend_run`).

    *records*: record fields written unless already there (signatures, deadlines, the
    results of local calls). *steps*: the step messages to enqueue, by index, each
    enqueued only when neither recorded nor already enqueued. *waits*: the step indices
    the run waits for (``mode`` ``steps``); *signal* the wait of mode ``signal``;
    *until*: unix seconds when time alone resumes the run (None: never). *encoded*: the
    encodings of step messages, by index, where the caller has them already.
    """

    mode: Literal["steps", "signal", "sleep"]
    records: Mapping[str, bytes] = field(default_factory=dict)
    steps: Sequence[tuple[int, TaskMessage]] = ()
    waits: Sequence[int] = ()
    signal: SignalWait | None = None
    until: float | None = None
    encoded: Mapping[int, bytes] = field(default_factory=dict)


class RunSuspended(BaseException):
    """Raised through a durable function by the replay when it needs what is not recorded
    yet: the worker ends the attempt by writing :attr:`plan` (:func:`suspend_run`).

    A BaseException so that a function's ``except Exception`` does not swallow it.
    """

    def __init__(self, plan: SuspendPlan) -> None:
        super().__init__(plan.mode)
        self.plan = plan


@dataclass(frozen=True, slots=True)
class Recorded:
    """What an inline step's acknowledgement recorded in its run: its result, as stored."""

    value: bytes


class InlineSteps(Protocol):
    """The worker's side of inline steps, as a run's attempt sees it (:data:`INLINE_STEPS`)."""

    async def run_inline(self, run_id: str, plan: SuspendPlan) -> bytes | None:
        """Run *plan*'s one step in the slot of run *run_id*'s attempt, which awaits it;
        the result it recorded, or None when the attempt must suspend on *plan* instead
        (the step was not taken here, or its outcome was not recorded by it)."""
        ...


INLINE_STEPS: ContextVar[InlineSteps | None] = ContextVar("asyncq_inline_steps", default=None)
"""Set by the worker in each attempt's task: where a durable run's attempt runs a step
inline. None outside a worker."""


def is_durable_step(msg: TaskMessage) -> bool:
    """Whether *msg* is a step of a durable run, acknowledged with :func:`ack_step`."""
    headers = msg.headers
    run_id = headers.get(RUN_HEADER)
    index = headers.get(STEP_HEADER, "")
    if not run_id or not (index.isascii() and index.isdigit()):  # "²" is a digit too
        return False  # malformed headers (not written by asyncq): acknowledged as a task
    try:
        keys.validate_queue_name(headers.get(RUN_QUEUE_HEADER, ""))
        keys.refuse_braces("run id", run_id)
    except ValueError:
        return False
    return True


async def start_run(broker: BrokerBase, msg: TaskMessage) -> None:
    """Enqueue *msg*, a run's task, as pending and write the run's record with the state
    ``pending`` in one script (``lua/durable_start.lua``): the Inspector knows the run
    before its first attempt. Raises TaskIdConflictError when the task or a record of
    its id exists.
    """
    qk = broker._q(msg.queue)
    tid = msg.id
    keys_ = [qk.task_prefix + tid, qk.pending, keys.run_key(qk.name, tid)]
    if broker.on_cluster:  # asynq:queues lives in another slot: registered apart, once
        if qk.name not in broker._published:
            await broker._register_queue(qk)
    else:
        keys_.append(keys.ALL_QUEUES)
    args = (
        encode_task_message(msg), tid, int(broker.clock() * 1e9), keys.wakeup_channel(qk.name),
        qk.name, PENDING_RUN_KEPT,
    )  # fmt: skip
    if await _write(broker, _START, keys_, args, qname=qk.name, tid=tid) != "1":
        await broker.confirm_existing(qk.name, tid)
        raise conflict_error(qk.name, tid)


async def suspend_run(
    broker: BrokerBase, msg: TaskMessage, plan: SuspendPlan, *, step_here: float | None = None
) -> str:
    """End the run task's attempt as *plan* says; ``parked`` or ``ready`` (pending again),
    or ``cancelled`` (nothing written: the run was cancelled while the attempt ran).

    With *step_here* (a lease expiry, unix s) the plan's first step, when this call
    enqueues it, is written active and leased to the caller until then instead of
    pending (its queue paused, limited or ordered: pending all the same), and the answer
    is ``here``: the caller runs it in the slot the run leaves (not under
    ``min_replicas``, where the step goes to pending).

    Raises TaskNotFoundError when the run task is not active (its lease was taken over).
    """
    qk = broker._q(msg.queue)
    tid = msg.id
    record = keys.run_key(qk.name, tid)
    keys_: list[str] = [qk.active, qk.lease, qk.task_prefix + tid, qk.scheduled, qk.pending, record]
    waits: Sequence[int] = plan.waits
    if plan.signal is not None:
        keys_ += (
            keys.awaiting_key(qk.name, plan.signal.name, plan.signal.key),
            keys.signal_key(qk.name, plan.signal.name, plan.signal.key),
        )
        waits = (plan.signal.index,)
    score = FAR_FUTURE if plan.until is None else min(FAR_FUTURE, int(plan.until) + 1)
    now = broker.clock()
    args: list[Any] = [
        tid, plan.mode, score, int(now * 1e9), keys.wakeup_channel(qk.name), qk.name,
        len(plan.records),
    ]  # fmt: skip
    for name, value in plan.records.items():
        args += (name, value)
    args.append(len(waits))
    args += waits
    args.append(len(plan.steps))
    encoded = plan.encoded
    for index, step in plan.steps:
        data = encoded.get(index)
        args += (step.queue, step.id, index, encode_task_message(step) if data is None else data)
    # Under min_replicas a write may come back unconfirmed (an error): the step would
    # then wait out its lease unstarted, so it goes to pending, as a continued run does.
    if step_here is not None and plan.steps and broker.replication is None:
        args.append(int(step_here))
    return await _write(broker, _SUSPEND, keys_, args, qname=qk.name, tid=tid)


async def start_inline(
    broker: BrokerBase,
    qname: str,
    attempts: Sequence[tuple[str, SuspendPlan]],
    lease_expiry: float,
) -> list[str]:
    """For each ``(run id, plan)`` of queue *qname*: write what the run's attempt decided
    (*plan*'s records) and its one step, in the run's queue, active and leased to the
    caller until *lease_expiry* (unix s), the run task staying active, all in one
    script call (``lua/durable_inline.lua``). One answer per attempt: ``here``, the step
    is the caller's to run; otherwise nothing was written for it (``seen``, ``there``,
    ``fetch``, ``waiting``, ``cancelled``, or the error reading its record: see the
    script) and the caller suspends the attempt on its plan. Not under
    ``min_replicas`` (``fetch``): an unconfirmed write would strand the steps.
    """
    if broker.replication is not None:
        return ["fetch"] * len(attempts)
    qk = broker._q(qname)
    args: list[Any] = [keys.queue_key_prefix(qk.name), int(lease_expiry)]
    for run_id, plan in attempts:
        ((index, step),) = plan.steps
        if step.queue != qk.name:
            raise ValueError(f"inline step {step.id!r} is not in its run's queue {qk.name!r}")
        keys.refuse_braces("run id", run_id)
        data = plan.encoded.get(index)
        if data is None:
            data = encode_task_message(step)
        args += (run_id, index, step.id, data, len(plan.records))
        for name, value in plan.records.items():
            args += (name, value)
    try:
        reply = await _INLINE(broker._cmd, (qk.active, qk.lease), args)
    except ResponseError as exc:
        raise script_error(exc, _INLINE, qk.name, attempts[0][0]) from exc
    return [a.decode() if isinstance(a, bytes) else str(a) for a in reply]


async def ack_step(
    broker: BrokerBase, msg: TaskMessage, mode: StepAckMode, err_msg: str = ""
) -> str:
    """Acknowledge a finished step (:func:`is_durable_step`) and record it in its run.

    *mode* as a workflow step's (``done``, ``complete``, ``archive``, ``revoke``).
    Returns ``woken`` (the run went to pending), ``recorded``, ``seen`` (recorded
    before) or ``gone`` (no record). Raises TaskNotFoundError when the task is not
    active (already acknowledged).
    """
    qk = broker._q(msg.queue)
    headers = msg.headers
    run_q = broker._q(headers[RUN_QUEUE_HEADER])
    run_id = headers[RUN_HEADER]
    tid = msg.id
    now = broker.clock()
    now_s = int(now)
    pday, fday = qk.daily(now)
    if mode == "complete":
        data = encode_with(msg, completed_at=now_s)
    elif mode == "archive":
        data = encode_with(msg, error_msg=err_msg, last_failed_at=now_s)
    else:
        data = b""
    keys_ = (
        qk.active, qk.lease, qk.task_prefix + tid, pday, qk.processed, qk.completed,
        qk.archived, fday, qk.failed, qk.task_prefix, keys.run_key(run_q.name, run_id),
        run_q.scheduled, run_q.pending, run_q.task_prefix + run_id,
    )  # fmt: skip
    args = (
        tid, mode, now_s + STATS_TTL, MAX_INT64, now_s, data, now_s + msg.retention,
        headers[STEP_HEADER], err_msg or mode, now_s - ARCHIVED_EXPIRATION, ARCHIVE_MAX_SIZE,
        int(now * 1e9), run_id, keys.wakeup_channel(run_q.name), run_q.name,
    )  # fmt: skip
    return await _write(broker, _STEP_DONE, keys_, args, qname=qk.name, tid=tid)


async def _write(
    broker: BrokerBase,
    script: Script,
    keys_: Sequence[str],
    args: Sequence[Any],
    *,
    qname: str,
    tid: str,
) -> str:
    """Run a worker's durable write, followed by WAIT under ``min_replicas`` as every
    acknowledgement is; the script's text reply."""
    try:
        if broker.replication is not None:
            reply = await broker.replication.script(
                broker._pipeline, broker._cmd, script, keys_, args, queue=qname, task_id=tid
            )
        else:
            reply = await script(broker._cmd, keys_, args)
    except ResponseError as exc:
        raise script_error(exc, script, qname, tid) from exc
    except RedisClusterException as exc:  # refused before it was sent: nothing written
        raise BrokerError(
            f"Redis script {script.name} refused for task {tid!r} of queue {qname!r}: {exc} "
            "(on a cluster, a durable run's steps must run in the run's queue)"
        ) from exc
    return reply.decode() if isinstance(reply, bytes) else str(reply)


async def record_wait(
    redis: RedisClient | FastConnection, qname: str, run_id: str, wait: SignalWait, value: bytes
) -> bytes:
    """Record *value* as the result of a run's signal wait unless a signal came first;
    the result that stands."""
    try:
        reply = await _RECORD(
            redis,
            (keys.run_key(qname, run_id), keys.awaiting_key(qname, wait.name, wait.key)),
            (wait.index, value, f"{run_id} {wait.index}"),
        )
    except ResponseError as exc:
        raise BrokerError(f"Redis script durable_record failed: {exc}") from exc
    return cast(bytes, reply)


async def settle_run(
    redis: RedisClient | FastConnection,
    qname: str,
    run_id: str,
    state: str,
    *,
    records: Mapping[str, bytes],
    expire_in: int,
) -> None:
    """Write an attempt's records (unless there) and the run's state; expire the record
    after *expire_in* seconds (0: keep it)."""
    args: list[Any] = [state, expire_in, len(records)]
    for name, value in records.items():
        args += (name, value)
    try:
        await _SETTLE(redis, (keys.run_key(qname, run_id),), args)
    except ResponseError as exc:
        raise BrokerError(f"Redis script durable_settle failed: {exc}") from exc


async def send_signal(
    redis: RedisClient,
    qname: str,
    name: str,
    key: str,
    *,
    payload: bytes,
    keep_ms: int,
    now: float,
) -> int:
    """Deliver a signal to the runs of *qname* waiting for it; how many took it (0: it is
    kept *keep_ms* for the first wait that comes)."""
    try:
        reply = await _SIGNAL(
            redis,
            (
                keys.awaiting_key(qname, name, key),
                keys.signal_key(qname, name, key),
                keys.scheduled_key(qname),
                keys.pending_key(qname),
            ),
            (
                payload, keep_ms, int(now * 1e9), keys.queue_key_prefix(qname),
                keys.wakeup_channel(qname), qname,
            ),
        )  # fmt: skip
    except ResponseError as exc:
        raise BrokerError(f"Redis script durable_signal failed: {exc}") from exc
    return int(reply)


async def read_run(
    redis: RedisClient | FastConnection, qname: str, run_id: str
) -> dict[str, bytes] | None:
    """A run's record as stored (field name: value), or None when it has none yet (no
    attempt recorded anything) or any more (expired after its end).

    *redis* may be a broker's pipelined connection (a worker replaying a run reads the
    record there, beside its other commands), which answers HGETALL as a flat list.
    """
    key = keys.run_key(qname, run_id)
    try:
        raw = await redis.execute_command("HGETALL", key)
    except ResponseError as exc:
        raise BrokerError(f"reading durable run record {key}: {exc}") from exc
    if not raw:
        return None
    pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
    return {k.decode("utf-8", "replace"): v for k, v in pairs}
