"""Workflows: chains, groups and chords whose hand-offs survive crashes.

>>> wf = chain(Task("resize", img), Task("upload"), Task("notify"), pass_results=True)
>>> info = await wf.enqueue(client)

Every step is an ordinary asynq task. The workflow's state lives in one Redis
hash under the hash tag of its first step's queue; the tasks of later stages
are encoded when the workflow starts and stored there, and the Lua script that
acknowledges a stage's last member enqueues the next stage in the same call
(see docs/workflows.md for the guarantees).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from asyncq import _keys as keys
from asyncq._broker.workflow import (
    WORKFLOW_HEADER,
    WORKFLOW_QUEUE_HEADER,
    WORKFLOW_STEP_HEADER,
    WorkflowExistsError,
    WorkflowInfo,
    WorkflowNotFoundError,
    WorkflowStepInfo,
    start_workflow,
    workflow_key,
)
from asyncq._codec import encode_task_message
from asyncq._compose import compose
from asyncq.client import Client
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task, TaskState

__all__ = [
    "Group",
    "Step",
    "StepFailure",
    "Workflow",
    "WorkflowExistsError",
    "WorkflowInfo",
    "WorkflowNotFoundError",
    "WorkflowStepInfo",
    "chain",
    "chord",
    "group",
    "group_results",
]

FailurePolicy = Literal["fail", "run"]

_REFUSED_OPTIONS = ("unique", "group", "process_at", "process_in")


@dataclass(frozen=True, slots=True)
class Step:
    """One task of a workflow, with its enqueue options.

    *result_arg*: for a JSON-object payload (the typed task API's), the name of
    the argument that receives the previous stage's result (a group's results
    as a list, ``null`` for a failed member); a value the payload already has
    for it (a typed task's default, a placeholder) is replaced. Without it, a
    step that receives results gets them as its payload (the previous task's
    result bytes; for a group, :func:`group_results` decodes the payload).
    Whether results are passed at all is the workflow's ``pass_results``.

    *options* are :meth:`Client.enqueue` options (``queue``, ``max_retry``,
    ``timeout``, ``deadline``, ``retention``, ``task_id``, ``headers``);
    ``unique``, ``group``, ``process_at`` and ``process_in`` are refused.
    """

    task: Task
    result_arg: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.task, Task):
            raise TypeError(f"a workflow step is an asyncq Task, got {type(self.task).__name__}")
        for name in _REFUSED_OPTIONS:
            if self.task.options.get(name) is not None or self.options.get(name) is not None:
                raise ValueError(
                    f"workflow step {self.task.type!r}: option {name!r} is not supported "
                    "(a step runs when the workflow reaches it)"
                )
        if self.result_arg is not None and not self.result_arg:
            raise ValueError(f"workflow step {self.task.type!r}: result_arg must not be empty")


@dataclass(frozen=True, slots=True)
class Group:
    """Tasks run in parallel; the next stage starts when every one has finished."""

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a group needs at least one task")


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A failed group member in the results a callback receives (policy ``run``)."""

    error: str


def _as_step(part: Task | Step) -> Step:
    return part if isinstance(part, Step) else Step(part)


def group(*tasks: Task | Step) -> Group:
    """Run *tasks* in parallel as one stage of a workflow."""
    return Group(tuple(_as_step(t) for t in tasks))


@dataclass(frozen=True, slots=True)
class _Stage:
    steps: tuple[Step, ...]
    is_group: bool


@dataclass(frozen=True, slots=True)
class Workflow:
    """Stages run one after another; build it with :func:`chain` or :func:`chord`."""

    stages: tuple[_Stage, ...]
    pass_results: bool = False
    on_failure: FailurePolicy = "fail"

    async def enqueue(self, client: Client, *, workflow_id: str | None = None) -> WorkflowInfo:
        """Start the workflow: write its state and enqueue its first stage atomically.

        Returns its :class:`WorkflowInfo` (its ``id`` and ``queue`` find it again
        with ``Inspector.get_workflow``). Raises ValueError/TypeError for a bad
        step or option, WorkflowExistsError when the id (or a task id) is taken.
        On Redis Cluster every step's queue must hash to the first step's slot.
        """
        wid = workflow_id if workflow_id is not None else str(uuid.uuid4())
        keys.refuse_braces("workflow id", wid)
        now = datetime.now(UTC)
        msgs: list[list[TaskMessage]] = []
        for stage in self.stages:
            row = []
            for step in stage.steps:
                c = compose(step.task, [step.options], now)
                if c.state is not TaskState.PENDING or c.unique_ttl is not None:
                    raise ValueError(
                        f"workflow step {step.task.type!r} must be a plain pending task"
                    )
                row.append(c.message)
            msgs.append(row)
        qname = msgs[0][0].queue
        wkey = workflow_key(qname, wid)
        broker = client.broker
        if isinstance(broker.redis, RedisCluster):
            slot = key_slot(wkey.encode())
            for row in msgs:
                for msg in row:
                    if key_slot(keys.pending_key(msg.queue).encode()) != slot:
                        raise ValueError(
                            f"on Redis Cluster every step of a workflow must be in a queue "
                            f"of the first step's hash slot: queue {msg.queue!r} is not in "
                            f"the slot of {qname!r} (use one queue, or queue names sharing "
                            "a hash tag)"
                        )
        seen: set[tuple[str, str]] = set()
        fields: dict[str, bytes | str | int] = {
            "state": "running",
            "stage": 0,
            "stages": len(msgs),
            "policy": self.on_failure,
            "created": int(now.timestamp()),
            "ttl": max(msg.retention for msg in msgs[-1]),
        }
        for k, (stage, row) in enumerate(zip(self.stages, msgs, strict=True)):
            fields[f"n:{k}"] = len(row)
            fields[f"left:{k}"] = len(row)
            prev_group = k > 0 and self.stages[k - 1].is_group
            for j, (step, msg) in enumerate(zip(stage.steps, row, strict=True)):
                if (msg.queue, msg.id) in seen:
                    raise ValueError(f"task id {msg.id!r} appears twice in the workflow")
                seen.add((msg.queue, msg.id))
                m = f"{k}:{j}"
                msg.headers[WORKFLOW_HEADER] = wid
                msg.headers[WORKFLOW_QUEUE_HEADER] = qname
                msg.headers[WORKFLOW_STEP_HEADER] = f"{k}.{j}"
                fields[f"id:{m}"] = msg.id
                fields[f"q:{m}"] = msg.queue
                fields[f"t:{m}"] = msg.type
                fields[f"st:{m}"] = "pending" if k == 0 else "waiting"
                if k == 0:
                    continue
                if self.pass_results:
                    shape = "l" if prev_group else "s"
                    if step.result_arg is not None:
                        base = _object_payload(step, msg.payload)
                        if step.result_arg in base:
                            # a placeholder (a typed task's default): the result replaces it
                            del base[step.result_arg]
                            rest = json.dumps(base, separators=(",", ":"), ensure_ascii=False)
                            fields[f"p:{m}"] = rest.encode()
                        else:
                            fields[f"p:{m}"] = msg.payload or b"{}"
                        pass_mode = "j" + shape + json.dumps(step.result_arg)
                        msg.payload = b""
                    else:
                        if msg.payload:
                            raise ValueError(
                                f"workflow step {step.task.type!r} has a payload, but with "
                                "pass_results its payload is the previous result (give "
                                "result_arg for a JSON-object payload, or no payload)"
                            )
                        pass_mode = "b" + shape
                    if fields.setdefault(f"pass:{k}", pass_mode) != pass_mode:
                        raise ValueError(
                            f"stage {k} of the workflow mixes steps taking the result as "
                            "payload and as an argument (or different argument names)"
                        )
                fields[f"m:{m}"] = encode_task_message(msg)
        for q in {msg.queue for row in msgs for msg in row}:
            await broker._register_queue(broker._q(q))
        await start_workflow(
            broker, qname, wid, fields=fields, first=msgs[0], now_ns=time.time_ns()
        )
        return WorkflowInfo(
            id=wid,
            queue=qname,
            state="running",
            stage=0,
            policy=self.on_failure,
            created=int(now.timestamp()),
            finished=None,
            retention=timedelta(seconds=int(fields["ttl"])),
            stages=[
                [
                    WorkflowStepInfo(
                        msg.id, msg.queue, msg.type, "pending" if k == 0 else "waiting", None, None
                    )
                    for msg in row
                ]
                for k, row in enumerate(msgs)
            ],
        )


def _object_payload(step: Step, payload: bytes) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        value = json.loads(payload)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not payload.lstrip().startswith(b"{"):
        raise ValueError(
            f"workflow step {step.task.type!r}: result_arg needs a JSON object payload "
            "(the typed task API's)"
        )
    return value


def _stages(parts: Iterable[Task | Step | Group | Workflow]) -> list[_Stage]:
    out: list[_Stage] = []
    for part in parts:
        if isinstance(part, Workflow):
            out.extend(part.stages)
        elif isinstance(part, Group):
            out.append(_Stage(part.steps, True))
        else:
            out.append(_Stage((_as_step(part),), False))
    return out


def _check_policy(on_failure: str) -> None:
    if on_failure not in ("fail", "run"):
        raise ValueError(f"on_failure must be 'fail' or 'run', got {on_failure!r}")


def chain(
    *parts: Task | Step | Group | Workflow,
    pass_results: bool = False,
    on_failure: FailurePolicy = "fail",
) -> Workflow:
    """Run *parts* one after another: each starts when the previous one succeeded.

    A :class:`Group` part runs its tasks in parallel; the part after it starts
    when all of them have finished. With *pass_results*, each part receives the
    previous part's result (see :class:`Step`). *on_failure*: ``fail`` (default)
    stops at a failed task and marks the workflow failed; ``run`` goes on, and a
    failed member's result is a :class:`StepFailure` (``null`` for result_arg).
    """
    _check_policy(on_failure)
    stages = _stages(parts)
    if not stages:
        raise ValueError("a workflow needs at least one task")
    return Workflow(tuple(stages), pass_results, on_failure)


def chord(
    header: Group | Sequence[Task | Step],
    callback: Task | Step,
    *,
    pass_results: bool = True,
    on_failure: FailurePolicy = "fail",
) -> Workflow:
    """Run *header*'s tasks in parallel, then *callback* with their results in group order."""
    g = header if isinstance(header, Group) else group(*header)
    return chain(g, callback, pass_results=pass_results, on_failure=on_failure)


def group_results(payload: bytes) -> list[bytes | StepFailure]:
    """Decode the payload a step receives after a group: one entry per member, in order.

    A member that succeeded gives the bytes it wrote as its result (``b""`` when
    it wrote none); a failed one (policy ``run``) a :class:`StepFailure`.
    """
    out: list[bytes | StepFailure] = []
    view = memoryview(payload)
    i = 0
    while i < len(view):
        tag = bytes(view[i : i + 1])
        colon = payload.find(b":", i + 1)
        if tag not in (b"R", b"E") or colon < 0 or not payload[i + 1 : colon].isdigit():
            raise ValueError(f"not a workflow group result payload (at byte {i})")
        n = int(payload[i + 1 : colon])
        start = colon + 1
        if start + n > len(payload):
            raise ValueError("truncated workflow group result payload")
        data = payload[start : start + n]
        out.append(data if tag == b"R" else StepFailure(data.decode("utf-8", "replace")))
        i = start + n
    return out
