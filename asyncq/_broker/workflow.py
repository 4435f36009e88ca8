"""Workflow transitions: start a workflow, acknowledge its steps with the hand-off, cancel, read.

A workflow is a list of *stages*; each stage is one or more tasks (a chain step is
a stage of one, a group is a stage of many). Its state lives in one hash,
``asynq:{<queue>}:wf:<id>``, under the hash tag of its first step's queue. The
messages of later stages are encoded when the workflow starts and kept in that
hash, so the hand-off reads them from Redis: the script that acknowledges a
stage's last member enqueues the next stage. A worker acknowledges a step's
success in its batch of successes (``lua/ack_many.lua``, see
:meth:`~asyncq._broker.processing.ProcessingTransitions.ack_many`), every other
outcome with :func:`ack_step` (``lua/workflow_done.lua``).

Tasks of a workflow carry the headers :data:`WORKFLOW_HEADER` (the workflow id),
:data:`WORKFLOW_QUEUE_HEADER` (the queue of its hash) and :data:`WORKFLOW_STEP_HEADER`
(``"<stage>.<member>"``); a worker acknowledges only those through this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast

from redis.exceptions import ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import (
    ARCHIVE_MAX_SIZE,
    ARCHIVED_EXPIRATION,
    LUA_PACKAGE,
    MAX_INT64,
    STATS_TTL,
    BrokerBase,
    encode_with,
    script_error,
)
from asyncq._codec import encode_task_message
from asyncq._logging import LazyLogger
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import Script, load_script
from asyncq.errors import AsyncqError, BrokerError
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "ADVANCE_LUA",
    "WORKFLOW_HEADER",
    "WORKFLOW_QUEUE_HEADER",
    "WORKFLOW_STEP_HEADER",
    "AckMode",
    "WorkflowExistsError",
    "WorkflowInfo",
    "WorkflowNotFoundError",
    "WorkflowStepInfo",
    "ack_step",
    "cancel_workflow",
    "is_workflow_step",
    "member_gone",
    "read_workflow",
    "start_workflow",
    "step_place",
    "workflow_key",
]

WORKFLOW_HEADER = "asyncq-workflow"
WORKFLOW_QUEUE_HEADER = "asyncq-workflow-queue"
WORKFLOW_STEP_HEADER = "asyncq-workflow-step"

_log = LazyLogger()  # resolved at each use: the application's structlog setup applies

_START = load_script(LUA_PACKAGE, "workflow_start")


ADVANCE_LUA = load_script(LUA_PACKAGE, "workflow_advance").source
"""``advance()`` and ``advance_ok()`` (lua/workflow_advance.lua), for the scripts that
acknowledge workflow steps to define before their body."""


def _with_advance(name: str) -> Script:
    """A script with ``advance()`` (lua/workflow_advance.lua) defined before its body."""
    return Script(name, ADVANCE_LUA + "\n" + load_script(LUA_PACKAGE, name).source)


_DONE = _with_advance("workflow_done")
_MEMBER_GONE = _with_advance("workflow_member_gone")
_CANCEL = load_script(LUA_PACKAGE, "workflow_cancel")

AckMode = Literal["done", "complete", "archive", "revoke"]


class WorkflowNotFoundError(AsyncqError):
    """No workflow with that id exists under that queue (never started, or expired;
    *queue* None: under any queue)."""

    def __init__(self, queue: str | None, workflow_id: str) -> None:
        self.queue = queue
        self.workflow_id = workflow_id
        where = "in any queue" if queue is None else f"queue={queue!r}"
        super().__init__(f"workflow not found: id={workflow_id!r} {where}")


class WorkflowExistsError(BrokerError):
    """A workflow with this id, or one of its first tasks' ids, already exists."""


def workflow_key(qname: str, workflow_id: str) -> str:
    """The hash holding a workflow's state, under the hash tag of *qname*."""
    keys.validate_queue_name(qname)
    if not workflow_id:
        raise ValueError("workflow id must not be empty")
    return f"{keys.queue_key_prefix(qname)}wf:{workflow_id}"


def is_workflow_step(msg: TaskMessage) -> bool:
    """Whether *msg* is a step of a workflow whose acknowledgement advances it."""
    headers = msg.headers
    if WORKFLOW_HEADER not in headers:
        return False
    # Malformed headers (not written by asyncq) make it a plain task: acknowledged as one.
    stage, _, member = headers.get(WORKFLOW_STEP_HEADER, "").partition(".")
    if not (stage.isdigit() and member.isdigit() and headers[WORKFLOW_HEADER]):
        return False
    try:
        keys.validate_queue_name(headers.get(WORKFLOW_QUEUE_HEADER, ""))
    except ValueError:
        return False
    return True


def step_place(msg: TaskMessage) -> tuple[str, str]:
    """The workflow hash and ``"<stage>.<member>"`` place of a step (:func:`is_workflow_step`)."""
    headers = msg.headers
    # is_workflow_step checked the queue name and the id: workflow_key's checks, done
    wkey = f"{keys.queue_key_prefix(headers[WORKFLOW_QUEUE_HEADER])}wf:{headers[WORKFLOW_HEADER]}"
    return wkey, headers[WORKFLOW_STEP_HEADER]


def _step_of(msg: TaskMessage) -> tuple[str, str, str]:
    stage, _, member = msg.headers[WORKFLOW_STEP_HEADER].partition(".")
    if not (stage.isdigit() and member.isdigit()):
        raise ValueError(
            f"task {msg.id!r} has a malformed {WORKFLOW_STEP_HEADER} header: "
            f"{msg.headers[WORKFLOW_STEP_HEADER]!r}"
        )
    wkey = workflow_key(msg.headers[WORKFLOW_QUEUE_HEADER], msg.headers[WORKFLOW_HEADER])
    return wkey, stage, member


async def start_workflow(
    broker: BrokerBase,
    qname: str,
    workflow_id: str,
    *,
    fields: Mapping[str, bytes | str | int],
    first: Sequence[TaskMessage],
    now_ns: int,
) -> None:
    """Write the workflow hash and enqueue *first* (the first stage) in one script.

    *fields* are the hash's fields but those of the first stage's members (``id:``,
    ``q:``, ``t:``, ``st:`` of ``0:<j>``), which the script writes from *first*.
    """
    args: list[Any] = [now_ns, len(fields)]
    for name, value in fields.items():
        args += (name, value)
    for msg in first:
        args += (msg.queue, msg.id, msg.type, encode_task_message(msg))
    try:
        await _START(broker._cmd, (workflow_key(qname, workflow_id),), args)
    except ResponseError as exc:
        text = str(exc)
        if text.startswith(("WORKFLOW EXISTS", "TASK EXISTS")):
            raise WorkflowExistsError(
                f"cannot start workflow {workflow_id!r}: {text.lower()}"
            ) from exc
        raise BrokerError(f"Redis script workflow_start failed: {text}") from exc


async def ack_step(broker: BrokerBase, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
    """Acknowledge a finished workflow step and advance its workflow, atomically.

    *mode*: ``done`` (success, no retention), ``complete`` (success kept for
    its retention), ``archive`` (failed for good) or ``revoke`` (RevokeTask:
    deleted, counted as a failed member). Returns the workflow's state after
    the call (``gone`` when its hash no longer exists). Raises
    TaskNotFoundError when the task is not active (already acknowledged).
    """
    qk = broker._q(msg.queue)
    wkey, stage, member = _step_of(msg)
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
        qk.active,
        qk.lease,
        qk.task_prefix + tid,
        pday,
        qk.processed,
        qk.completed,
        qk.archived,
        fday,
        qk.failed,
        qk.task_prefix,
        wkey,
    )
    args = (
        tid,
        mode,
        now_s + STATS_TTL,
        MAX_INT64,
        now_s,
        data,
        now_s + msg.retention,
        stage,
        member,
        err_msg or mode,
        now_s - ARCHIVED_EXPIRATION,
        ARCHIVE_MAX_SIZE,
        int(now * 1e9),
    )
    try:
        if broker.replication is not None:  # min_replicas: the write and WAIT together
            reply = await broker.replication.script(
                broker._pipeline, broker._cmd, _DONE, keys_, args, queue=qk.name, task_id=tid
            )
        else:
            reply = await _DONE(broker._cmd, keys_, args)
    except ResponseError as exc:
        raise script_error(exc, _DONE, qk.name, tid) from exc
    return reply.decode() if isinstance(reply, bytes) else str(reply)


async def member_gone(redis: RedisClient, msg: TaskMessage, reason: str, now: float) -> str:
    """Resolve a workflow member deleted or archived by hand as failed (see the script).

    Returns the workflow's state afterwards, ``alive`` when the task still
    exists (not archived) and nothing changed.
    """
    wkey, stage, member = _step_of(msg)
    tkey = keys.task_key(msg.queue, msg.id)
    reply = await _MEMBER_GONE(
        redis, (wkey, tkey), (stage, member, reason, int(now), int(now * 1e9))
    )
    return reply.decode() if isinstance(reply, bytes) else str(reply)


async def cancel_workflow(
    redis: RedisClient, qname: str, workflow_id: str, now: float
) -> str | None:
    """Cancel a running workflow; its state before the call, None when it does not exist."""
    reply = await _CANCEL(redis, (workflow_key(qname, workflow_id),), (int(now),))
    if reply is None:
        return None
    return reply.decode() if isinstance(reply, bytes) else str(reply)


@dataclass(frozen=True, slots=True)
class WorkflowStepInfo:
    """One task of a workflow as the workflow records it.

    *state*: ``waiting`` (a later stage, not enqueued yet), ``pending`` (enqueued:
    pending, active or retrying; see the task itself for which), ``succeeded``,
    ``failed`` (archived, revoked or deleted) or ``canceled``. *result* is the
    bytes the task wrote with its result writer, *error* its last error.
    """

    id: str
    queue: str
    type: str
    state: str
    result: bytes | None
    error: str | None


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow's state: ``running``, ``succeeded``, ``failed`` or ``canceled``.

    *stages* lists the workflow's stages in order (a chain step is a stage of
    one task, a group a stage of many); *stage* is the index of the current
    one. *policy* is what a failed member does: ``fail`` or ``run``. *created*
    and *finished* are unix seconds; *retention* how long the state is kept
    after the workflow finishes.
    """

    id: str
    queue: str
    state: str
    stage: int
    policy: str
    created: int
    finished: int | None
    retention: timedelta
    stages: list[list[WorkflowStepInfo]]


async def read_workflow(redis: RedisClient, qname: str, workflow_id: str) -> WorkflowInfo | None:
    """The workflow's record, or None when it does not exist (never or expired).

    A record no asyncq script writes reads as far as it goes: a key of another type
    as None, a number that is not one as 0 (or no finish time), undecodable text with
    U+FFFD, a stage or member count beyond the fields stored as those stored; each
    with a warning naming the key, so that one damaged record neither fails a listing
    nor makes it loop over a count of a billion.
    """
    key = workflow_key(qname, workflow_id)
    try:
        raw = cast(dict[bytes, bytes], await redis.hgetall(key))
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        _log.warning("ignored an asyncq key of the wrong type", key=key, expected="hash")
        return None
    if not raw:
        return None
    h = {k.decode("utf-8", "replace"): v for k, v in raw.items()}
    bad: list[str] = []

    def text(name: str, default: str = "") -> str:
        value = h.get(name)
        return value.decode("utf-8", "replace") if value is not None else default

    def number(name: str, default: int = 0, most: int = _INT64) -> int:
        value = text(name)
        if not value:
            return default
        if value.lstrip("-").isdigit() and -_INT64 - 1 <= int(value) <= most:
            return int(value)
        bad.append(name)
        return default

    stages: list[list[WorkflowStepInfo]] = []
    for k in range(number("stages", most=len(h))):
        members: list[WorkflowStepInfo] = []
        for j in range(number(f"n:{k}", most=len(h))):
            m = f"{k}:{j}"
            members.append(
                WorkflowStepInfo(
                    id=text(f"id:{m}"),
                    queue=text(f"q:{m}"),
                    type=text(f"t:{m}"),
                    state=text(f"st:{m}", "waiting"),
                    result=h.get(f"r:{m}"),
                    error=text(f"e:{m}") or None,
                )
            )
        stages.append(members)
    finished = number("finished", -1)
    info = WorkflowInfo(
        id=workflow_id,
        queue=qname,
        state=text("state"),
        stage=number("stage"),
        policy=text("policy"),
        created=number("created"),
        finished=None if finished == -1 else finished,
        retention=timedelta(seconds=number("ttl", most=_MAX_TTL)),
        stages=stages,
    )
    if bad:
        _log.warning("ignored unreadable workflow fields", key=key, fields=bad)
    return info


_INT64 = 2**63 - 1
_MAX_TTL = 10**12  # seconds: far beyond any retention, within what a timedelta holds
