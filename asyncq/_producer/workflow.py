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

import asyncio
import contextlib
import json
import time
import types
import typing
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    Unpack,
    cast,
)

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
    cancel_workflow,
    read_workflow,
    start_workflow,
    workflow_key,
)
from asyncq._codec import encode_task_message
from asyncq._duration import wait_seconds
from asyncq._producer.client import Client
from asyncq._producer.compose import compose
from asyncq._serde import ArgumentsCodec, ResultCodec
from asyncq._suggest import suggest
from asyncq.errors import AsyncqError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task, TaskOptions, TaskState

__all__ = [
    "BoundTask",
    "Group",
    "Pipe",
    "Step",
    "StepFailure",
    "TypedSignature",
    "Workflow",
    "WorkflowExistsError",
    "WorkflowFailedError",
    "WorkflowHandle",
    "WorkflowInfo",
    "WorkflowNotFoundError",
    "WorkflowStepInfo",
    "chain",
    "chord",
    "group",
    "group_results",
    "typed_group",
]

P = ParamSpec("P")
P2 = ParamSpec("P2")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
S = TypeVar("S")

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


@dataclass(frozen=True, slots=True, eq=False)
class TypedSignature:
    """What a workflow knows of a typed task (``@app.task``): its name, argument and
    result codecs, and the client of its App."""

    name: str
    arguments: ArgumentsCodec
    results: ResultCodec
    client: Callable[[], Client]
    eager: Callable[[], bool] = lambda: False
    """Whether the task's App is in eager mode (``app.eager()``) now."""
    run_eager: Callable[[Task], Awaitable[tuple[bytes | None, str | None]]] | None = None
    """Run the task in-process as eager mode does: (result bytes, None) or (None, error)."""


class BoundTask(Task):
    """A :class:`~asyncq.Task` made by a typed task (``to_task``, ``.s(...)``).

    It is an ordinary Task; a workflow uses :attr:`signature` to check result
    passing when it is built and to decode the final result.
    """

    __slots__ = ("signature",)

    def __init__(
        self,
        signature: TypedSignature,
        type_name: str,
        payload: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[TaskOptions],
    ) -> None:
        super().__init__(type_name, payload, headers=headers, **options)
        self.signature = signature


class WorkflowFailedError(AsyncqError):
    """A workflow ended ``failed`` or ``canceled``; :attr:`info` has every step,
    :attr:`failures` the failed steps' errors by task ID."""

    def __init__(self, info: WorkflowInfo) -> None:
        self.info = info
        self.failures = {
            step.id: step.error or ""
            for stage in info.stages
            for step in stage
            if step.state == "failed"
        }
        detail = "; ".join(f"{tid}: {err}" for tid, err in self.failures.items())
        super().__init__(f"workflow {info.id!r} {info.state}" + (f" ({detail})" if detail else ""))


class WorkflowHandle(Generic[R]):
    """A started workflow: ``await result()`` for the final step's result, ``status()``,
    ``cancel()``. ``enqueue()`` returns one; ``App.workflow_of(id)`` makes one from an id.

    The attributes of the :class:`WorkflowInfo` the start returned (``id``,
    ``queue``, ``stages``...) read through :attr:`info`, as at the start.
    """

    __slots__ = ("_client", "_final", "info")

    def __init__(
        self,
        info: WorkflowInfo,
        client: Client | None,
        final: tuple[TypedSignature | None, ...],
    ) -> None:
        self.info = info
        self._client = client
        self._final = final

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def queue(self) -> str:
        """The queue of the workflow's first step (where its state lives)."""
        return self.info.queue

    @property
    def stages(self) -> list[list[WorkflowStepInfo]]:
        """The steps by stage, as at the start (their IDs and queues do not change)."""
        return self.info.stages

    async def status(self) -> WorkflowInfo:
        """The workflow's state now, step by step (raises WorkflowNotFoundError when it
        expired)."""
        if self._client is None:  # run in eager mode: finished when enqueue() returned
            return self.info
        info = await read_workflow(self._client.broker.redis, self.queue, self.id)
        if info is None:
            raise WorkflowNotFoundError(self.queue, self.id)
        return info

    async def result(
        self,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 - as TaskHandle.result
        *,
        poll_interval: timedelta = timedelta(milliseconds=500),
    ) -> R:
        """Wait for the workflow to finish; the final step's decoded result.

        For a final group, a list in group order (a failed member, under
        ``on_failure="run"``, as a :class:`StepFailure`). Typed steps' results
        are decoded with their return annotation, others are the raw bytes.
        Raises TimeoutError, :class:`WorkflowFailedError` (failed or canceled)
        and WorkflowNotFoundError (the state expired: give the last step a
        ``retention`` longer than the wait).
        """
        limit = wait_seconds(timeout, "timeout")
        deadline = None if limit is None else time.monotonic() + limit
        delay, cap = 0.01, max(0.01, poll_interval.total_seconds())
        while True:
            info = await self.status()
            if info.state != "running":
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"workflow {self.id!r} did not finish within {limit}s")
            last = info.stages[-1]
            if info.stage == len(info.stages) - 1 and len(last) == 1:
                # The final step runs: its completion is published, so wait on it.
                wait = min(cap, remaining) if remaining is not None else cap
                assert self._client is not None
                with contextlib.suppress(TimeoutError, AsyncqError):
                    await self._client.wait(last[0].id, queue=last[0].queue, timeout=wait)
                    await asyncio.sleep(0.01)  # the state is written with the ack: read it
            else:
                await asyncio.sleep(min(delay, remaining) if remaining is not None else delay)
                delay = min(cap, delay * 2)
        if info.state != "succeeded":
            raise WorkflowFailedError(info)
        values: list[Any] = []
        for step, signature in zip(info.stages[-1], self._final, strict=True):
            if step.state == "failed":
                values.append(StepFailure(step.error or ""))
            elif signature is None:
                values.append(step.result or b"")
            else:
                values.append(signature.results.decode(step.result))
        return cast(R, values if len(values) > 1 or self._is_group() else values[0])

    async def cancel(self) -> str:
        """Cancel the workflow if it still runs: no further hand-off, its steps not
        started yet deleted (:meth:`asyncq.Inspector.cancel_workflow`).

        Returns its state before the call (only ``running`` changes; ``result()``
        then raises WorkflowFailedError). Steps already running finish; stop them
        with ``Inspector.cancel(step_id, retry=False)``. Raises WorkflowNotFoundError
        when the state expired. In eager mode the workflow has finished: its state.
        """
        if self._client is None:
            return self.info.state
        state = await cancel_workflow(self._client.broker.redis, self.queue, self.id, time.time())
        if state is None:
            raise WorkflowNotFoundError(self.queue, self.id)
        return state

    def _is_group(self) -> bool:
        return len(self.info.stages[-1]) > 1

    def __repr__(self) -> str:
        return f"<WorkflowHandle id={self.id!r} queue={self.queue!r}>"


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
class Workflow(Generic[R]):
    """Stages run one after another; build it with :func:`chain`, :func:`chord` or a
    typed :class:`Pipe`. ``R`` is what :meth:`WorkflowHandle.result` returns."""

    stages: tuple[_Stage, ...]
    pass_results: bool = False
    on_failure: FailurePolicy = "fail"

    async def enqueue(
        self, client: Client | None = None, *, workflow_id: str | None = None
    ) -> WorkflowHandle[R]:
        """Start the workflow: write its state and enqueue its first stage atomically.

        Returns a :class:`WorkflowHandle` (its ``id`` and ``queue`` find it again
        with ``Inspector.get_workflow``; ``await handle.result()`` waits for the
        final step). *client* defaults to the App's client of a typed step.
        Raises ValueError/TypeError for a bad step or option, WorkflowExistsError
        when the id (or a task id) is taken. On Redis Cluster every step's queue
        must hash to the first step's slot.
        """
        steps = [step for stage in self.stages for step in stage.steps]
        if any((sig := _signature(s.task)) is not None and sig.eager() for s in steps):
            return await self._run_eagerly(workflow_id)
        if client is None:
            client = _typed_client(self)
        info = await self._start(client, workflow_id)
        final = tuple(_signature(step.task) for step in self.stages[-1].steps)
        return WorkflowHandle(info, client, final)

    async def _run_eagerly(self, workflow_id: str | None) -> WorkflowHandle[R]:
        """Eager mode: run the stages in order, in-process, passing results as Redis would.

        Only workflows of typed steps that take results through ``result_arg``
        (what typed pipes build); anything else is refused, naming the step.
        """
        for k, stage in enumerate(self.stages):
            for step in stage.steps:
                signature = _signature(step.task)
                if signature is None or signature.run_eager is None:
                    raise RuntimeError(
                        f"eager mode runs workflows of typed tasks only; step "
                        f"{step.task.type!r} is a plain Task (test this workflow against a "
                        "Redis with a worker: the asyncq_worker fixture)"
                    )
                if k and self.pass_results and step.result_arg is None:
                    raise RuntimeError(
                        f"eager mode passes results as JSON arguments only; step "
                        f"{step.task.type!r} takes the result as its payload (give result_arg)"
                    )
        wid = workflow_id if workflow_id is not None else str(uuid.uuid4())
        now = int(time.time())
        rows: list[list[WorkflowStepInfo]] = []
        state, reached = "succeeded", 0
        for k, stage in enumerate(self.stages):
            row: list[WorkflowStepInfo] = []
            for step in stage.steps:
                task = step.task
                options = {**task.options, **{o: v for o, v in step.options.items() if v}}
                tid = str(options.get("task_id") or uuid.uuid4())
                queue = str(options.get("queue") or "default")
                if state == "failed":
                    row.append(WorkflowStepInfo(tid, queue, task.type, "waiting", None, None))
                    continue
                if k and self.pass_results and step.result_arg is not None:
                    arguments = json.loads(task.payload or b"{}")
                    arguments[step.result_arg] = _eager_passed(rows[-1], self.stages[k - 1])
                    task = Task(
                        task.type, json.dumps(arguments).encode(), headers=dict(task.headers)
                    )
                signature = _signature(step.task)
                assert signature is not None and signature.run_eager is not None
                # The handler's current_task() names the step as status() shows it.
                given = {o: v for o, v in options.items() if o != "headers"}
                run = Task(
                    task.type,
                    task.payload,
                    headers=dict(task.headers),
                    **cast(TaskOptions, {**given, "task_id": tid, "queue": queue}),
                )
                result, error = await signature.run_eager(run)
                done = "failed" if error is not None else "succeeded"
                row.append(WorkflowStepInfo(tid, queue, task.type, done, result, error))
            rows.append(row)
            if state != "failed":
                reached = k
                if any(s.state == "failed" for s in row) and self.on_failure == "fail":
                    state = "failed"
        info = WorkflowInfo(
            id=wid,
            queue=rows[0][0].queue,
            state=state,
            stage=reached,
            policy=self.on_failure,
            created=now,
            finished=now,
            retention=timedelta(0),
            stages=rows,
        )
        final = tuple(_signature(step.task) for step in self.stages[-1].steps)
        return WorkflowHandle(info, None, final)

    async def _start(self, client: Client, workflow_id: str | None) -> WorkflowInfo:
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
                if k == 0:
                    continue  # its fields id:, q:, t:, st: are the start script's to write
                fields[f"id:{m}"] = msg.id
                fields[f"q:{m}"] = msg.queue
                fields[f"t:{m}"] = msg.type
                fields[f"st:{m}"] = "waiting"
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
            await broker.register_queue(q)
        await start_workflow(
            broker, qname, wid, fields=fields, first=msgs[0], now_ns=time.time_ns()
        )
        events = client._events
        if events is not None:  # the first stage is enqueued now (the later ones by handoff)
            for msg in msgs[0]:
                events.add("enqueued", msg.queue, msg.type, msg.id, workflow=wid)
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


def _eager_passed(row: list[WorkflowStepInfo], stage: _Stage) -> Any:
    """What a stage passes on as a JSON value (a group: a list, null for a failed member)."""
    values = [None if s.state == "failed" or not s.result else json.loads(s.result) for s in row]
    return values if stage.is_group else values[0]


def _typed_client(workflow: Workflow[Any]) -> Client:
    for stage in workflow.stages:
        for step in stage.steps:
            signature = _signature(step.task)
            if signature is not None:
                return signature.client()
    raise TypeError("Workflow.enqueue needs a client: no step is a typed task of an App")


def _signature(task: Task) -> TypedSignature | None:
    return task.signature if isinstance(task, BoundTask) else None


def _stage_result_type(stage: _Stage, on_failure: str) -> Any:
    """The annotation of what *stage* passes on (None: not known)."""
    produced = []
    for step in stage.steps:
        signature = _signature(step.task)
        if signature is None:
            return None
        produced.append(signature.results.hint())
    if not stage.is_group:
        return produced[0]
    element: Any = produced[0]
    for other in produced[1:]:
        element = element | other if other != element else element
    if on_failure == "run":
        element = element | None
    return list[element]


def _compatible(produced: Any, expected: Any) -> bool:
    """False only when a value of *produced* can certainly not be *expected*."""
    if produced is Any or expected is Any or produced is None or expected is object:
        return True
    if expected is None or expected is type(None):
        return produced in (None, type(None))
    e_origin, p_origin = typing.get_origin(expected), typing.get_origin(produced)
    if p_origin in (typing.Union, types.UnionType):  # every value it may be must fit
        return all(_compatible(arm, expected) for arm in typing.get_args(produced))
    if e_origin in (typing.Union, types.UnionType):
        return any(_compatible(produced, arm) for arm in typing.get_args(expected))
    if e_origin is typing.Annotated:
        return _compatible(produced, typing.get_args(expected)[0])
    if p_origin is typing.Annotated:
        return _compatible(typing.get_args(produced)[0], expected)
    e_cls, p_cls = e_origin or expected, p_origin or produced
    if not isinstance(e_cls, type) or not isinstance(p_cls, type):
        return True  # a Literal, a TypeVar...: left to the run-time check
    if p_cls is int and e_cls is float:
        return True
    try:
        if not issubclass(p_cls, e_cls):
            return False
    except TypeError:
        return True
    e_args, p_args = typing.get_args(expected), typing.get_args(produced)
    if e_args and p_args and len(e_args) == len(p_args) and Ellipsis not in e_args:
        return all(_compatible(p, e) for p, e in zip(p_args, e_args, strict=True))
    return True


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) and not typing.get_args(hint) else str(hint)


def _check_result_passing(stages: Sequence[_Stage], on_failure: str) -> None:
    """Refuse, when the workflow is built, a result_arg that a typed next step does not
    have, or a previous result of a type that argument cannot take."""
    for k in range(1, len(stages)):
        produced = _stage_result_type(stages[k - 1], on_failure)
        for step in stages[k].steps:
            signature = _signature(step.task)
            if signature is None or step.result_arg is None:
                continue
            names = signature.arguments.names
            if step.result_arg not in names:
                hint = suggest(step.result_arg, names)
                raise ValueError(
                    f"workflow step {signature.name!r}: result_arg {step.result_arg!r} is not "
                    f"one of its parameters ({', '.join(names)})"
                    + (f"; did you mean {hint!r}?" if hint else "")
                )
            expected = signature.arguments.hints()[step.result_arg]
            if produced is not None and not _compatible(produced, expected):
                raise TypeError(
                    f"workflow step {signature.name!r}: argument {step.result_arg!r} takes "
                    f"{_type_name(expected)}, but the stage before it returns "
                    f"{_type_name(produced)}"
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


def _stages(parts: Iterable[Task | Step | Group | Workflow[Any]]) -> list[_Stage]:
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
    *parts: Task | Step | Group | Workflow[Any],
    pass_results: bool = False,
    on_failure: FailurePolicy = "fail",
) -> Workflow[Any]:
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
    if pass_results:
        _check_result_passing(stages, on_failure)
    return Workflow(tuple(stages), pass_results, on_failure)


def chord(
    header: Group | Sequence[Task | Step],
    callback: Task | Step,
    *,
    pass_results: bool = True,
    on_failure: FailurePolicy = "fail",
) -> Workflow[Any]:
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


class _TypedCallable(Protocol[P, R_co]):
    """What :meth:`Pipe.then` takes: a typed task (``@app.task``), seen through the part
    a workflow needs."""

    def _bind_without_first(self, *args: Any, **kwargs: Any) -> BoundTask: ...

    def to_task(self, *args: P.args, **kwargs: P.kwargs) -> Task: ...

    @property
    def _result_type(self) -> R_co: ...


class Pipe(Generic[R]):
    """A typed workflow under construction; its last stage returns ``R``.

    ::

        wf = resize.s(image_id).then(upload, bucket="media").then(notify)
        handle = await wf.enqueue()          # WorkflowHandle[bool] if notify returns bool
        ok = await handle.result(timeout=60)

        total = typed_group(price.s(1), price.s(2)).then(add_up)   # add_up(prices: list[int])

    ``then(task, *args, **kwargs)`` runs *task* after this stage with the result
    as its **first** parameter and *args*/*kwargs* as the others: mypy checks
    that ``R`` fits that parameter (``Concatenate``) and the other arguments, and
    the annotations are checked again when the pipe is built.
    """

    __slots__ = ("_stages", "on_failure")

    def __init__(self, stages: tuple[_Stage, ...], on_failure: FailurePolicy = "fail") -> None:
        self._stages = stages
        self.on_failure = on_failure

    def then(
        self,
        task: _TypedCallable[Concatenate[R, P2], S],
        /,
        *args: P2.args,
        **kwargs: P2.kwargs,
    ) -> Pipe[S]:
        """This pipe, then *task* with this stage's result as its first argument."""
        bound = task._bind_without_first(*args, **kwargs)
        first = bound.signature.arguments.names[0]
        stages = (*self._stages, _Stage((Step(bound, result_arg=first),), False))
        _check_result_passing(stages, self.on_failure)
        return Pipe(stages, self.on_failure)

    @classmethod
    def of(cls, task: BoundTask) -> Pipe[Any]:
        """A pipe of one typed task (what ``task.s(...)`` returns)."""
        return Pipe((_Stage((Step(task),), False),))

    def workflow(self) -> Workflow[R]:
        """The :class:`Workflow` (results passed to each next stage)."""
        return Workflow(self._stages, True, self.on_failure)

    async def enqueue(
        self, client: Client | None = None, *, workflow_id: str | None = None
    ) -> WorkflowHandle[R]:
        """Start it (see :meth:`Workflow.enqueue`)."""
        return await self.workflow().enqueue(client, workflow_id=workflow_id)


def typed_group(*calls: Pipe[R], on_failure: FailurePolicy = "fail") -> Pipe[list[R]]:
    """Typed calls (``task.s(...)``) run in parallel: a stage whose result is the list of
    their results, in order. With ``on_failure="run"`` the next stage also runs after a
    failed member (its entry is ``None``)."""
    _check_policy(on_failure)
    steps: list[Step] = []
    for call in calls:
        if not isinstance(call, Pipe) or len(call._stages) != 1 or call._stages[0].is_group:
            raise TypeError("typed_group takes single typed calls (task.s(...))")
        steps.extend(call._stages[0].steps)
    return Pipe((_Stage(Group(tuple(steps)).steps, True),), on_failure)
