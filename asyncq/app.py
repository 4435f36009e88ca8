"""The typed task API: ``App``, ``@app.task`` and awaitable results.

::

    app = App("redis://localhost:6379/0")

    @app.task(queue="email", max_retry=5, timeout=timedelta(seconds=30))
    async def send_welcome(user_id: int, lang: str = "en") -> Receipt: ...

    handle = await send_welcome.enqueue(42, lang="de")        # checked by mypy
    receipt = await handle.result(timeout=10)                  # a Receipt

An App is a registry on top of the interoperable core: every typed task is a
plain asynq task (type name + JSON payload) routed by the App's
:class:`~asyncq.ServeMux` (``app.mux``, where Go-shaped ``Task`` handlers can
be registered too), run by a :class:`~asyncq.Server` and enqueued through a
:class:`~asyncq.Client`. The payload is one JSON object keyed by parameter
name and the return value is stored as JSON in asynq's ``result`` field, so
Go producers and consumers interoperate (docs/typed-api.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fnmatch
import functools
import inspect
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio.to_thread
import pydantic_core
from typing_extensions import Unpack

from asyncq import _keys as keys
from asyncq._broker.durable import (
    INLINE_STEPS,
    RunSuspended,
    SuspendPlan,
    is_durable_step,
    read_run,
    send_signal,
)
from asyncq._broker.durable_cancel import CANCELED_ERROR
from asyncq._broker.workflow import read_workflow
from asyncq._duration import go_duration, wait_seconds
from asyncq._logging import get_logger
from asyncq._producer.client import Client
from asyncq._producer.completion import DEFAULT_POLL_INTERVAL, TaskFailedError
from asyncq._producer.compose import compose
from asyncq._producer.workflow import (
    BoundTask,
    Pipe,
    TypedSignature,
    WorkflowHandle,
    WorkflowNotFoundError,
)
from asyncq._redis.connection import Connection
from asyncq._redis.options import RedisTarget
from asyncq._scheduling.cron import parse_cronspec
from asyncq._scheduling.scheduler import Scheduler
from asyncq._serde import ArgumentsCodec, ResultCodec, TaskArgumentError, TaskResultError
from asyncq._suggest import suggest
from asyncq._worker.config import (
    ServerOptions,
    flat_name_warning,
    merge_groups,
    regroup,
)
from asyncq._worker.result_writer import TaskResultWriter
from asyncq._worker.server import Server
from asyncq.durable import (
    FAILED_RUN_KEPT,
    MIN_RUN_KEPT,
    ParkedRuns,
    Run,
    discard,
    drive,
)
from asyncq.errors import AmbiguousIdError, SkipRetry, TaskNotFoundError, wraps_error
from asyncq.hooks import WorkerHooks
from asyncq.lifespan import Lifespan, lifespan_state, state_var
from asyncq.mux import ServeMux, sync_limiter
from asyncq.progress import EagerProgress, settled
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskOptions, TaskProgress, TaskState

__all__ = [
    "DEFAULT_RESULT_RETENTION",
    "DEFAULT_SIGNAL_KEEP",
    "App",
    "CronEntry",
    "DurableFunction",
    "TaskCall",
    "TaskHandle",
    "TypedTask",
    "WorkerOptions",
    "current_task",
]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

DEFAULT_RESULT_RETENTION = timedelta(minutes=5)
"""How long a typed task's result stays readable after success, unless the task says otherwise."""

DEFAULT_SIGNAL_KEEP = timedelta(hours=24)
"""How long a durable signal no run waits for yet is kept for the first wait (``App.signal``)."""


class WorkerOptions(ServerOptions, total=False):
    """The :class:`~asyncq.Server` keyword options an App carries for its workers: the
    :class:`~asyncq.ServerOptions` (grouped: ``intervals=``, ``limits=``,
    ``aggregation=``) and the Server's ``logger`` and ``metrics``.

    Given to ``App(...)`` (``App(redis, queues={"email": 3}, concurrency=20)``)
    and, per call, to ``app.server(...)`` / ``app.run_worker(...)`` /
    ``app.worker_settings(...)``, which override them: a setting replaces the App's,
    and a group is merged field by field (the fields the call's group sets to other
    than their default replace the App's, the others keep the App's; see
    :meth:`App.worker_settings`). Each has the meaning and default of the ``Server``
    option of the same name; a key left out is not given at all (so ``queues`` left out
    means "every queue the App's tasks use"). Being a ``TypedDict`` unpacked into the
    signatures, a misspelled or mistyped option is a mypy error, and an unknown name a
    ``TypeError`` at run time.

    The flat names of the grouped settings (``heartbeat_interval=``,
    ``queue_concurrency=``... :class:`~asyncq._worker.config.GroupedOptions`) are
    deprecated here as on the Server: each still works for this release, warns
    (DeprecationWarning, at the call that gave it) and goes in 0.3.0. The App
    translates them to their group, so its Server gets grouped options only.
    """

    logger: Any
    metrics: WorkerHooks | None


WORKER_OPTION_NAMES = frozenset(WorkerOptions.__annotations__)


def _check_worker_options(options: Mapping[str, object], where: str) -> None:
    for name in options:
        if name not in WORKER_OPTION_NAMES:
            hint = suggest(name, WORKER_OPTION_NAMES)
            raise TypeError(
                f"{where} got an unknown worker option {name!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
            )


def _worker_options(
    base: Mapping[str, object], options: Mapping[str, object], where: str
) -> WorkerOptions:
    """*options* (given to *where*) over the App's *base*, grouped (see
    :meth:`App.worker_settings`): each deprecated flat name warns at the caller of the
    App method that called this one, which must call it directly."""
    _check_worker_options(options, f"{where}()")
    regrouped = regroup(options)
    for name in regrouped.flat:
        # stacklevel 3: the user's call (_worker_options < the App method < caller)
        warnings.warn(flat_name_warning(where, name), DeprecationWarning, stacklevel=3)
    return cast(WorkerOptions, merge_groups(base, regrouped))


_current_task: contextvars.ContextVar[Task | None] = contextvars.ContextVar(
    "asyncq_current_task", default=None
)


def current_task() -> Task:
    """The asynq Task a typed handler is running for (id, queue, retry_count, headers...).

    Raises RuntimeError outside a typed handler.
    """
    task = _current_task.get()
    if task is None:
        raise RuntimeError("current_task() is only available inside a typed task handler")
    return task


@dataclass(frozen=True, slots=True)
class CronEntry:
    """A schedule declared with ``@app.cron``: what the App's workers enqueue on each tick."""

    spec: str
    """The cron spec the scheduler runs (``CRON_TZ=<zone>`` first when a timezone was
    given; ``@every <duration>`` for the interval form), as ``asynq cron ls`` shows it."""
    task: TypedTask[Any, Any]
    call: Task
    """The task enqueued on each tick: the encoded arguments and the task's options."""
    jitter: timedelta | None
    """Each tick's task runs a delay in ``[0, jitter)`` after the tick (None: at the tick)."""


@dataclass(frozen=True, slots=True)
class _Eager:
    """An eager block: the lifespan state it opened."""

    state: Any


class _EagerRun:
    """One eager task run: what its result writer stores, and whether it may still write.

    It is both the writer's context and its store, so a handler's
    ``current_task().result_writer.write(...)`` behaves as under a worker: the
    bytes become the task's result, and a write after the handler returned is
    refused with ResultWriteError.
    """

    __slots__ = ("done", "queue", "result", "task_id")

    def __init__(self, task_id: str, queue: str) -> None:
        self.task_id = task_id
        self.queue = queue
        self.result: bytes | None = None
        self.done = False

    def done_reason(self) -> str | None:
        return "the handler returned" if self.done else None

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int:
        self.result = bytes(data)
        return len(data)


class TaskHandle(Generic[R]):
    """An enqueued typed task: its ``id``, ``queue``, and ``await result()``.

    ``info`` is the TaskInfo the enqueue returned (None for a handle made
    from a task ID with ``task.handle_of(...)``).
    """

    __slots__ = ("_appear", "_client", "_codec", "_eager", "_reports", "id", "info", "queue")

    def __init__(
        self,
        task_id: str,
        queue: str,
        codec: ResultCodec,
        client: Client | None,
        *,
        info: TaskInfo | None = None,
        eager: tuple[Any, BaseException | None] | None = None,
        reports: Sequence[TaskProgress] = (),
        appear: bool = False,
    ) -> None:
        self.id = task_id
        self.queue = queue
        self.info = info
        self._codec = codec
        self._client = client
        self._eager = eager
        self._reports = tuple(reports)
        self._appear = appear

    async def result(
        self,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 - the result's own timeout, as arq/saq/streaq
        *,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    ) -> R:
        """Wait for the task to complete and return its decoded return value.

        Raises TimeoutError after *timeout* (None: wait forever),
        :class:`~asyncq.TaskFailedError` (with ``last_error``) when the task
        was archived, :class:`~asyncq.TaskNotFoundError` when it is gone (its
        retention ran out, or it was deleted). A handle made with
        ``handle_of`` waits for a task that does not exist yet (a workflow's
        later step) until *timeout*, then raises TaskNotFoundError.
        """
        if self._eager is not None:
            value, error = self._eager
            if error is not None:
                assert self.info is not None
                raise TaskFailedError(_failed_info(self.info, error)) from error
            return cast(R, value)
        assert self._client is not None
        if not self._appear:
            info = await self._client.wait(
                self.id, queue=self.queue, timeout=timeout, poll_interval=poll_interval
            )
            return cast(R, self._codec.decode(info.result))
        limit = wait_seconds(timeout, "timeout")
        deadline = None if limit is None else time.monotonic() + limit
        delay, cap = 0.01, max(0.01, poll_interval.total_seconds())
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                info = await self._client.wait(
                    self.id, queue=self.queue, timeout=remaining, poll_interval=poll_interval
                )
            except TaskNotFoundError:
                if remaining is not None and remaining <= 0:
                    raise
                await asyncio.sleep(delay if remaining is None else min(delay, remaining))
                delay = min(cap, delay * 2)
                continue
            return cast(R, self._codec.decode(info.result))

    def progress(
        self, *, poll_interval: timedelta = DEFAULT_POLL_INTERVAL
    ) -> AsyncIterator[TaskProgress]:
        """Stream the task's progress (``async for update in handle.progress()``).

        See :meth:`asyncq.Client.progress`; ends when the task is finished. In
        eager mode it replays what the handler reported, in order (the task has
        finished by then: a succeeded task's last report reads 100 %).
        """
        if self._client is None:
            return _replay(self._reports)
        return self._client.progress(self.id, queue=self.queue, poll_interval=poll_interval)

    def __repr__(self) -> str:
        return f"<TaskHandle id={self.id!r} queue={self.queue!r}>"


async def _replay(reports: Sequence[TaskProgress]) -> AsyncIterator[TaskProgress]:
    for report in reports:
        yield report


def _failed_info(info: TaskInfo, error: BaseException) -> TaskInfo:
    return replace(
        info, state=TaskState.ARCHIVED, last_error=f"{error.__class__.__name__}: {error}"
    )


def _eager_deadline(timeout: timedelta | None, deadline: datetime | None) -> float | None:
    """The eager attempt's deadline (unix seconds) as a worker computes it: the earlier
    of now + timeout and the task's deadline; None when it has neither."""
    ends = [time.time() + timeout.total_seconds()] if timeout else []
    if deadline is not None:
        ends.append(deadline.timestamp())
    return min(ends) if ends else None


def _ran(info: TaskInfo, run: _EagerRun, reports: EagerProgress, data: bytes | None) -> TaskInfo:
    """*info* after the eager run: its result and its last progress (settled when it
    succeeded, as the Inspector shows a completed task)."""
    last = reports.reports[-1] if reports.reports else None
    return replace(
        info,
        result=data if data is not None else run.result,
        progress=settled(last, info.state) if data is not None else last,
    )


class TaskCall(Generic[P, R]):
    """A typed task with enqueue options bound (``task.options(...)``); enqueue with it."""

    __slots__ = ("_client", "_options", "_task")

    def __init__(
        self, task: TypedTask[P, R], options: EnqueueOptions, client: Client | None
    ) -> None:
        self._task = task
        self._options = options
        self._client = client

    @property
    def task(self) -> TypedTask[P, R]:
        return self._task

    def options(
        self, *, client: Client | None = None, **options: Unpack[EnqueueOptions]
    ) -> TaskCall[P, R]:
        """These options over the bound ones (None: keep the bound value)."""
        given = {k: v for k, v in options.items() if v is not None}
        merged: dict[str, Any] = dict(self._options)
        if "process_at" in given or "process_in" in given:  # one setting, as in Client
            merged.pop("process_at", None)
            merged.pop("process_in", None)
        merged.update(given)
        return TaskCall(self._task, cast(EnqueueOptions, merged), client or self._client)

    def to_task(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """The plain asynq :class:`~asyncq.Task` this call enqueues (for ``enqueue_many``)."""
        return self._task._make(args, kwargs, self._options)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Pipe[R]:
        """This call as the first stage of a typed workflow: ``a.s(x).then(b).then(c)``.

        See :class:`~asyncq._producer.workflow.Pipe`; ``await pipe.enqueue()`` starts it.
        """
        return Pipe.of(self._task._make(args, kwargs, self._options))

    def _bind_without_first(self, *args: Any, **kwargs: Any) -> BoundTask:
        """The task for a workflow step whose first argument is the previous result."""
        typed = self._task
        first = typed._args.names[0] if typed._args.names else ""
        payload = typed._args.encode_without(first, args, kwargs)
        return typed._task_for(payload, self._options)

    @property
    def _result_type(self) -> R:
        raise AttributeError("only for type checkers")

    def _decode_result(self, data: bytes | None) -> R:
        """A stored result of this task, decoded as its return type (a durable step's)."""
        return cast(R, self._task._results.decode(data))

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Check and encode the arguments, enqueue, and return a handle to await the result.

        Raises :class:`~asyncq.TaskArgumentError` naming a bad argument, and
        every error :meth:`Client.enqueue` raises.
        """
        typed = self._task
        app = typed.app
        eager = app._eager
        if eager is not None:
            return await typed._run_eager(typed._make(args, kwargs, self._options), eager)
        task = typed._make(args, kwargs, None)
        client = self._client or app.client
        info = await client.enqueue(task, **self._options)
        return TaskHandle(info.id, info.queue, typed._results, client, info=info)


class TypedTask(TaskCall[P, R]):
    """A function registered with ``@app.task``: enqueue it, await it, or call it directly."""

    def __init__(
        self,
        app: App[Any],
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        name: str,
        defaults: TaskOptions,
    ) -> None:
        super().__init__(self, {}, None)
        self.app = app
        self.fn = fn
        self.name = name
        self.defaults = defaults
        self._args = ArgumentsCodec(fn, name)
        self._results = ResultCodec(fn, name)
        self._signature = TypedSignature(
            name,
            self._args,
            self._results,
            lambda: app.client,
            lambda: app._eager is not None,
            self._eager_step,
        )
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function in-process, now (no Redis, no JSON): for tests and composition."""
        result = self.fn(*args, **kwargs)
        if inspect.isawaitable(result):
            return cast(R, await result)
        return result

    def _make(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: EnqueueOptions | None
    ) -> BoundTask:
        """The asynq Task: the encoded arguments, the decorator's defaults, then *options*."""
        return self._task_for(self._args.encode(args, kwargs), options)

    def _task_for(self, payload: bytes, options: EnqueueOptions | None) -> BoundTask:
        if not options:
            return BoundTask(self._signature, self.name, payload, **self.defaults)
        given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        headers = given.pop("headers", None)
        merged: dict[str, Any] = dict(self.defaults)
        if "process_at" in given or "process_in" in given:
            merged.pop("process_at", None)
            merged.pop("process_in", None)
        merged.update(given)
        return BoundTask(self._signature, self.name, payload, headers=headers, **merged)

    def handle_of(
        self, task_id: str, *, queue: str | None = None, client: Client | None = None
    ) -> TaskHandle[R]:
        """A handle on a task of this type by its ID (e.g. one a web client sent back, or
        a workflow step not enqueued yet).

        *queue* defaults to the task's decorator queue (or ``"default"``). Its
        ``result(timeout=...)`` waits for the task to appear (a workflow's later
        step is enqueued when the stage before it finishes) and then to complete.
        """
        if not isinstance(task_id, str) or not task_id:
            raise ValueError("task ID cannot be empty")
        queue = queue or self.defaults.get("queue") or "default"
        if self.app._eager is not None:
            raise RuntimeError(
                "handle_of() is not available in eager mode: eager tasks run at enqueue and "
                "are not stored; keep the handle enqueue() returned"
            )
        return TaskHandle(task_id, queue, self._results, client or self.app.client, appear=True)

    async def serve(self, task: Task) -> None:
        """The ServeMux handler: decode, run, store the JSON result."""
        try:
            arguments = self._args.decode(task.payload)
        except TaskArgumentError as exc:
            raise SkipRetry(str(exc)) from exc
        token = _current_task.set(task)
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self._args.call(self.fn, arguments)
            else:
                ctx = contextvars.copy_context()
                value = await anyio.to_thread.run_sync(
                    functools.partial(ctx.run, self._args.call, self.fn, arguments),
                    abandon_on_cancel=True,
                    limiter=sync_limiter(),
                )
        finally:
            _current_task.reset(token)
        message = task._message
        if task.result_writer is None or (
            message is not None and message.retention <= 0 and not is_durable_step(message)
        ):
            # Nobody can read a result deleted at once; but a durable run's step's result
            # is read by its acknowledgement, which records it in the run.
            return
        try:
            data = self._results.encode(value)
        except TaskResultError as exc:
            raise SkipRetry(str(exc)) from exc
        await task.result_writer.write(data)

    async def _run_eager(self, task: Task, eager: _Eager) -> TaskHandle[R]:
        """Eager mode: run the handler in-process as a worker would (JSON both ways).

        The eager block's lifespan state is set here too, so a SyncClient's
        loop thread sees it.
        """
        arguments = self._args.decode(task.payload)
        info = TaskInfo(
            id=task.options.get("task_id") or str(uuid.uuid4()),
            queue=task.options.get("queue") or "default",
            type=task.type,
            payload=task.payload or b"",
            state=TaskState.COMPLETED,
            max_retry=task.options.get("max_retry") or 0,
            retried=0,
            last_error="",
            last_failed_at=None,
            timeout=task.options.get("timeout"),
            deadline=task.options.get("deadline"),
            group=task.options.get("group") or "",
            next_process_at=None,
            retention=task.options.get("retention"),
            completed_at=None,
            result=None,
            headers=dict(task.headers),
        )
        # The handler sees the Task a worker would give it: identity, attempt, deadline,
        # a result writer, and progress() (eager runs are task runs).
        task.id, task.queue = info.id, info.queue
        task.retry_count, task.max_retry = 0, info.max_retry
        task._deadline_ts = _eager_deadline(info.timeout, info.deadline)
        run = _EagerRun(info.id, info.queue)
        task.result_writer = TaskResultWriter(run, run)
        reports = EagerProgress()
        token = _current_task.set(task)
        state_token = state_var.set(eager.state) if self.app.lifespan is not None else None
        progress_token = reports.begin(task)
        try:
            value = await self._args.call(self.__call__, arguments)
            data = self._results.encode(value)
        except Exception as exc:
            return TaskHandle(
                info.id,
                info.queue,
                self._results,
                None,
                info=_failed_info(_ran(info, run, reports, None), exc),
                eager=(None, exc),
                reports=reports.reports,
            )
        finally:
            run.done = True
            reports.end(progress_token)
            _current_task.reset(token)
            if state_token is not None:
                state_var.reset(state_token)
        value = self._results.decode(data)
        # As TypedTask.serve: the return value is the result, over what the handler wrote.
        ran = _ran(info, run, reports, data)
        last = ran.progress
        replayed = [*reports.reports[:-1], last] if last is not None else []
        return TaskHandle(
            info.id,
            info.queue,
            self._results,
            None,
            info=ran,
            eager=(value, None),
            reports=replayed,
        )

    async def _eager_step(self, task: Task) -> tuple[bytes | None, str | None]:
        """One workflow step in eager mode: its result bytes, or its error."""
        eager = self.app._eager
        if eager is None:
            raise RuntimeError("not in eager mode")
        handle = await self._run_eager(task, eager)
        assert handle._eager is not None
        value, error = handle._eager
        if error is not None:
            return None, f"{error.__class__.__name__}: {error}"
        return self._results.encode(value), None

    def __repr__(self) -> str:
        return f"<TypedTask {self.name!r}>"


class DurableFunction(TypedTask[P, R]):
    """A function registered with ``@app.durable``: ``await f.start(...)`` starts a run.

    A run is a typed task of the function's type (its arguments the JSON payload, its
    return value the result), which the worker replays against the run's record
    (:class:`~asyncq.Run`, docs/durable.md). ``start`` returns the run's
    :class:`TaskHandle`, whose ``id`` is the run's id and ``result()`` its return value.
    A durable function is also a step another durable function can run (a child run).
    """

    def __init__(
        self,
        app: App[Any],
        fn: Callable[Concatenate[Run, P], Awaitable[R]],
        name: str,
        defaults: TaskOptions,
    ) -> None:
        self.function = fn
        """The durable function itself (its first parameter the :class:`~asyncq.Run`)."""
        super().__init__(app, _without_run(fn), name, defaults)
        self._parked = ParkedRuns()

    async def start(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Start a run with these arguments (checked and encoded as a task's) and return
        its handle: ``handle.id`` is the run's id, ``await handle.result()`` its result.
        The run's task and its record (state ``pending``) are written together, so the
        Inspector lists the run before its first attempt.

        Raises RuntimeError in eager mode (a run needs a worker), and every error
        :meth:`TypedTask.enqueue` raises.
        """
        if self.app._eager is not None:
            raise RuntimeError(f"durable function {self.name} cannot run in eager mode")
        task = self._make(args, kwargs, None)
        client = self.app.client
        info = await client._start_run(task)
        return TaskHandle(info.id, info.queue, self._results, client, info=info)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        raise TypeError(
            f"durable function {self.name} runs on a worker: start it with "
            "`await <function>.start(...)` (or run it as a step of another)"
        )

    async def serve(self, task: Task) -> None:
        """The ServeMux handler: replay the function against the run's record (or resume
        its coroutine parked on this worker, :class:`~asyncq.durable.ParkedRuns`); record
        its end and store its JSON result, or suspend the attempt (RunSuspended)."""
        try:
            arguments = self._args.decode(task.payload)
        except TaskArgumentError as exc:
            raise SkipRetry(str(exc)) from exc
        run_id, qname = task.id, task.queue
        if run_id is None or qname is None:
            raise RuntimeError(f"durable function {self.name} runs on a worker, as a task")
        broker = self.app.client.broker
        redis = broker.fast or broker.redis  # the pipelined connection, when there is one
        record = await read_run(redis, qname, run_id) or {}
        if record.get("state") == b"cancelled":
            # cancelled while an earlier attempt ran, which failed and was retried before
            # the stop reached it: this attempt ends as the stop would have ended that one
            await Run(run_id, qname, record, redis=redis)._settle("cancelled", FAILED_RUN_KEPT)
            raise SkipRetry(CANCELED_ERROR)
        parked = self._parked.take(run_id)
        if parked is not None and parked.run._resumes_from(record):
            run, coro = parked.run, parked.coro
            run._resume(record)
        else:
            if parked is not None:  # its record moved on without it: replay instead
                await discard(parked.coro)
            run = Run(run_id, qname, record, redis=redis)
            coro = self._args.call(functools.partial(self.function, run), arguments)
        token = _current_task.set(task)
        run._driver = asyncio.current_task()
        inline = INLINE_STEPS.get()  # on a worker: where a step awaited alone may run
        try:
            ended = await drive(coro)
            while isinstance(ended, SuspendPlan) and inline is not None:
                value = await inline.run_inline(run_id, ended)
                if value is None:
                    break  # not run inline, or not recorded by it: the attempt suspends
                run._ran_inline(ended, value)
                ended = await drive(coro)
        except Exception as exc:
            final = task.retry_count >= (task.max_retry or 0) or wraps_error(exc, SkipRetry)
            await run._settle("failed" if final else "running", FAILED_RUN_KEPT if final else 0)
            raise
        finally:
            run._driver = None
            _current_task.reset(token)
        if isinstance(ended, SuspendPlan):  # waits for steps: kept for its next attempt
            for old in self._parked.keep(run, coro):
                await discard(old.coro)
            raise RunSuspended(ended)
        value = ended.value
        try:
            data = self._results.encode(value)
        except TaskResultError as exc:
            await run._settle("failed", FAILED_RUN_KEPT)
            raise SkipRetry(str(exc)) from exc
        message = task._message
        retention = message.retention if message is not None else 0
        await run._settle("succeeded", max(retention, MIN_RUN_KEPT))
        child = message is not None and is_durable_step(message)  # its parent records it
        if task.result_writer is not None and (retention > 0 or child):
            await task.result_writer.write(data)

    def __repr__(self) -> str:
        return f"<DurableFunction {self.name!r}>"


def _without_run(fn: Callable[..., Any]) -> Callable[..., Any]:
    """*fn* as its run's task sees it: its signature and annotations without the first
    parameter (the Run), so the arguments encode and decode as a task's."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(
            f"a durable function takes its Run as its first parameter: "
            f"{getattr(fn, '__qualname__', fn)!r} has none"
        )

    def view(*args: Any, **kwargs: Any) -> Any:
        # It carries the run's signature only: the worker calls fn itself, with the Run.
        raise TypeError(f"{fn.__qualname__} is a durable function: start it with .start(...)")

    functools.update_wrapper(view, fn)
    first = params[0].name
    view.__signature__ = inspect.signature(fn).replace(parameters=params[1:])  # type: ignore[attr-defined]
    view.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != first}
    return view


class App(Generic[S]):
    """A typed-task application: a registry of ``@app.task`` functions, its client and workers.

    - *redis*: where tasks go (URI, options, a redis-py client or a
      :class:`~asyncq.Connection`); the same target a worker serves.
    - *lifespan*: a zero-argument callable returning an async context
      manager, entered once per worker process; handlers read what it yields
      as ``app.state`` (typed: ``App[State]``).
    - *result_retention*: how long results stay readable after success for
      tasks that set no ``retention`` (default 5 minutes).
    - the other keywords are worker settings (:class:`WorkerOptions`: queues,
      concurrency, limits, rates, ordered queues, lease...), used by every
      worker of the App (``asyncq worker module:app``, :meth:`run_worker`,
      :meth:`server`); CLI flags and per-call options override them. Without
      ``queues``, a worker serves ``default`` and every queue the App's tasks
      declare.

    The App's :attr:`client` is opened on first use in the running event
    loop, or explicitly with ``async with app:`` (a web app's lifespan).
    """

    @overload
    def __init__(
        self: App[None],
        redis: RedisTarget | Connection = ...,
        *,
        lifespan: None = None,
        result_retention: timedelta = DEFAULT_RESULT_RETENTION,
        **worker: Unpack[WorkerOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: App[S],
        redis: RedisTarget | Connection = ...,
        *,
        lifespan: Callable[[], AbstractAsyncContextManager[S]],
        result_retention: timedelta = DEFAULT_RESULT_RETENTION,
        **worker: Unpack[WorkerOptions],
    ) -> None: ...

    def __init__(
        self,
        redis: RedisTarget | Connection = "redis://localhost:6379/0",
        *,
        lifespan: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
        result_retention: timedelta = DEFAULT_RESULT_RETENTION,
        **worker: Unpack[WorkerOptions],
    ) -> None:
        if lifespan is not None and not callable(lifespan):
            raise TypeError(f"lifespan must be callable, got {type(lifespan).__name__}")
        if not isinstance(result_retention, timedelta):
            raise TypeError(
                f"result_retention must be a datetime.timedelta, got "
                f"{type(result_retention).__name__}"
            )
        self._redis = redis
        self.lifespan = lifespan
        self.result_retention = result_retention
        self.worker_options: WorkerOptions = _worker_options({}, worker, "App")
        """The worker settings given to ``App(...)``, grouped (a deprecated flat name given
        is in its group); every worker of the App starts with them."""
        self.mux = ServeMux()
        self.tasks: dict[str, TypedTask[Any, Any]] = {}
        self.crons: list[CronEntry] = []
        """The schedules declared with ``@app.cron``; the App's workers run them."""
        self._client: Client | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._eager: _Eager | None = None

    @property
    def redis(self) -> RedisTarget | Connection:
        """Where the App's client and workers connect."""
        return self._redis

    @redis.setter
    def redis(self, value: RedisTarget | Connection) -> None:
        """Point the App elsewhere (tests); the next use opens a new client.

        Close the old client first (``await app.aclose()``) if it was used.
        """
        self._redis = value
        self._client = None

    # -- registration ------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> TypedTask[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> TypedTask[P, R]: ...

    @overload
    def task(
        self,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_retry: int | None = None,
        timeout: timedelta | None = None,
        deadline: datetime | None = None,
        unique: timedelta | None = None,
        retention: timedelta | None = None,
        group: str | None = None,
    ) -> _TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_retry: int | None = None,
        timeout: timedelta | None = None,
        deadline: datetime | None = None,
        unique: timedelta | None = None,
        retention: timedelta | None = None,
        group: str | None = None,
    ) -> Any:
        """Register a function as a typed task (``@app.task`` or ``@app.task(...)``).

        *name* is the asynq task type (default: ``module.qualname`` of the
        function; give an explicit, stable name when Go code or another
        deployment enqueues it). The other options are per-type defaults that
        ``task.options(...)`` overrides.
        """
        defaults: dict[str, Any] = {
            "queue": queue,
            "max_retry": max_retry,
            "timeout": timeout,
            "deadline": deadline,
            "unique": unique,
            "retention": self.result_retention if retention is None else retention,
            "group": group,
        }
        options = cast(TaskOptions, {k: v for k, v in defaults.items() if v is not None})

        def register(func: Callable[..., Any]) -> TypedTask[Any, Any]:
            if not callable(func):
                raise TypeError(f"@app.task needs a function, got {type(func).__name__}")
            type_name = self._type_name(name, func)
            # The option values are checked now, as an enqueue would check them.
            compose(Task(type_name, b"", **options), [], datetime.now(UTC))
            typed: TypedTask[Any, Any] = TypedTask(self, func, type_name, options)
            self.mux.handle(type_name, typed.serve)
            self.tasks[type_name] = typed
            return typed

        if fn is not None:
            return register(fn)
        return _TaskDecorator(register)

    @overload
    def durable(
        self, fn: Callable[Concatenate[Run, P], Coroutine[Any, Any, R]], /
    ) -> DurableFunction[P, R]: ...

    @overload
    def durable(
        self,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_retry: int | None = None,
        timeout: timedelta | None = None,
        retention: timedelta | None = None,
    ) -> _DurableDecorator: ...

    def durable(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_retry: int | None = None,
        timeout: timedelta | None = None,
        retention: timedelta | None = None,
    ) -> Any:
        """Register ``async def f(run: Run, ...)`` as a durable function (``@app.durable``
        or ``@app.durable(...)``); ``await f.start(...)`` starts a run (docs/durable.md).

        *name* is the run task's asynq type (default ``module.qualname``, as a task's);
        *queue* where its runs (and their records) live; *max_retry* and *timeout* apply
        to each attempt (a replay up to its next wait); *retention* how long the result
        and the run's record stay readable after the run ends.
        """
        defaults: dict[str, Any] = {
            "queue": queue,
            "max_retry": max_retry,
            "timeout": timeout,
            "retention": self.result_retention if retention is None else retention,
        }
        options = cast(TaskOptions, {k: v for k, v in defaults.items() if v is not None})

        def register(func: Callable[..., Any]) -> DurableFunction[Any, Any]:
            if not inspect.iscoroutinefunction(func):
                raise TypeError("@app.durable needs an async function `async def f(run: Run, ...)`")
            type_name = self._type_name(name, func)
            compose(Task(type_name, b"", **options), [], datetime.now(UTC))
            durable: DurableFunction[Any, Any] = DurableFunction(self, func, type_name, options)
            self.mux.handle(type_name, durable.serve)
            self.tasks[type_name] = durable
            return durable

        if fn is not None:
            return register(fn)
        return _DurableDecorator(register)

    async def signal(
        self,
        name: str,
        /,
        *,
        key: str = "",
        payload: Any = None,
        queue: str | None = None,
        keep: timedelta = DEFAULT_SIGNAL_KEEP,
    ) -> int:
        """Send the signal *name* / *key* with a JSON *payload* to the durable runs waiting
        for it (``run.wait_for(name, key=...)``); how many took it.

        It goes to the runs of *queue* (None: of every queue the App's durable functions
        use). Where no run waits for it yet, it is kept for *keep* (a later signal of the
        same name and key replaces it) and the first run to wait for it takes it.
        """
        keys.refuse_braces("signal name", name)
        keys.refuse_braces("signal key", key)
        if not isinstance(keep, timedelta) or keep <= timedelta(0):
            raise ValueError(f"keep must be a positive timedelta, got {keep!r}")
        if queue is not None:
            queues = [queue]
        else:
            queues = sorted(
                {
                    typed.defaults.get("queue") or "default"
                    for typed in self.tasks.values()
                    if isinstance(typed, DurableFunction)
                }
            ) or ["default"]
        data = pydantic_core.to_json(payload)
        redis = self.client.broker.redis
        keep_ms = max(1, int(keep.total_seconds() * 1000))
        took = 0
        for qname in queues:
            took += await send_signal(
                redis, qname, name, key, payload=data, keep_ms=keep_ms, now=time.time()
            )
        return took

    def _type_name(self, name: str | None, func: Callable[..., Any]) -> str:
        """The asynq type of a function registered as *name* (None: ``module.qualname``)."""
        type_name = name if name is not None else f"{func.__module__}.{func.__qualname__}"
        if not isinstance(type_name, str) or not type_name.strip():
            raise ValueError("task name cannot be empty")
        if type_name in self.tasks:
            raise ValueError(f"a task named {type_name!r} is already registered")
        return type_name

    def cron(
        self,
        spec: str | None = None,
        /,
        *,
        every: timedelta | None = None,
        timezone: str | tzinfo | None = None,
        jitter: timedelta | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> _CronDecorator:
        """Enqueue a typed task on a schedule, run by the App's workers themselves.

        ::

            @app.cron("*/5 * * * *", timezone="Europe/Paris", kwargs={"days": 30})
            @app.task(queue="maintenance")
            async def cleanup(days: int) -> int: ...

            @app.cron(every=timedelta(minutes=10), jitter=timedelta(seconds=30))
            async def refresh() -> None: ...   # a plain function is registered as a task

        *spec* is a cron spec as asynq reads it (5 fields, ``@daily``, ``@every
        1h``...); *every* the interval form (whole seconds, ticks aligned to the
        Unix epoch). *timezone* (a zone name or tzinfo) is the zone the spec is
        read in (default UTC). *args*/*kwargs* are the task's arguments, checked
        now as an enqueue checks them. *jitter* spreads each tick's run over
        ``[0, jitter)`` after the tick.

        Every worker of the App (``asyncq worker module:app``, :meth:`run_worker`;
        not burst runs) runs the schedules; each tick is enqueued once whatever
        the number of workers, listed once by ``asyncq cron ls``, the web UI and
        Go's ``asynq cron ls``, with one history (``Scheduler(shared=True)``).
        """
        if (spec is None) == (every is None):
            raise TypeError("@app.cron needs a cron spec or every=..., not both")
        if every is not None:
            if not isinstance(every, timedelta):
                raise TypeError(f"every must be a timedelta, got {every.__class__.__name__}")
            if every < timedelta(seconds=1) or every % timedelta(seconds=1):
                raise ValueError(f"every must be a whole number of seconds, at least 1s: {every}")
            spec = f"@every {go_duration(every)}"
        assert spec is not None
        if not isinstance(spec, str):
            raise TypeError(f"a cron spec is a str, got {spec.__class__.__name__}")
        if timezone is not None:
            if spec.lstrip().startswith(("CRON_TZ=", "TZ=")):
                raise ValueError(f"cron spec {spec!r} names its zone; do not give timezone too")
            zone = _zone_name(timezone)
            spec = f"CRON_TZ={zone} {spec.strip()}"
        parse_cronspec(spec)
        if jitter is not None:
            if not isinstance(jitter, timedelta):
                raise TypeError(f"jitter must be a timedelta, got {jitter.__class__.__name__}")
            if jitter <= timedelta(0):
                raise ValueError(f"jitter must be positive, got {jitter}")
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(f"args must be a sequence of arguments, got {args!r}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping of argument names, got {kwargs!r}")
        cron_spec = spec

        def register(target: Callable[..., Any]) -> TypedTask[Any, Any]:
            typed = target if isinstance(target, TypedTask) else self.task(target)
            if typed.app is not self:
                raise ValueError(f"{typed.name!r} is a task of another App")
            call = typed._make(tuple(args), dict(kwargs or {}), None)
            self.crons.append(CronEntry(cron_spec, typed, call, jitter))
            return typed

        return _CronDecorator(register)

    def _cron_lifespan(self, redis: RedisTarget) -> Lifespan:
        """The worker lifespan: the App's own, then a shared Scheduler running the crons."""
        user = self.lifespan

        @contextlib.asynccontextmanager
        async def lifespan() -> AsyncIterator[Any]:
            async with contextlib.AsyncExitStack() as stack:
                state = None if user is None else await stack.enter_async_context(user())
                scheduler = Scheduler(redis, shared=True)
                for entry in self.crons:
                    scheduler.register(entry.spec, entry.call, jitter=entry.jitter)
                await scheduler.start()
                stack.push_async_callback(scheduler.shutdown)
                yield state

        return lifespan

    # -- client ------------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The App's Client, made on first use in the running event loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client.closed or self._client_loop is not loop:
            # App(events=...) covers the App's own enqueues too (``enqueued`` events).
            self._client = Client(self.redis, events=self.worker_options.get("events", False))
            self._client_loop = loop
        return self._client

    async def __aenter__(self) -> App[S]:
        self.client  # noqa: B018 - opened in this loop
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the App's client (if it made one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def workflow_of(
        self,
        workflow_id: str,
        *,
        queue: str | None = None,
        client: Client | None = None,
    ) -> WorkflowHandle[Any]:
        """A handle on a started workflow by its id (e.g. one a web client sent back):
        ``await handle.result()``, ``status()``, ``cancel()``, as the handle
        ``enqueue()`` returned.

        *queue* is the workflow's first step's queue (where its state lives); without
        it every queue is looked in. The final steps' results decode as their
        ``@app.task`` return types (the raw bytes for a type this App does not
        register). Raises WorkflowNotFoundError when there is no such workflow (never
        started, or its state expired), AmbiguousIdError when the id is in several
        queues, ValueError for an empty id, RuntimeError in eager mode.
        """
        if not isinstance(workflow_id, str) or not workflow_id.strip():
            raise ValueError("workflow ID cannot be empty")
        if self._eager is not None:
            raise RuntimeError(
                "workflow_of() is not available in eager mode: eager workflows run at "
                "enqueue and are not stored; keep the handle enqueue() returned"
            )
        client = client or self.client
        redis = client.broker.redis
        if queue is not None:
            names = [queue]
        else:
            stored = await redis.smembers(keys.ALL_QUEUES)
            names = sorted(q.decode() if isinstance(q, bytes) else q for q in stored)
        limit = asyncio.Semaphore(16)  # a few reads in flight, not one per queue at once

        async def read(name: str) -> Any:
            async with limit:
                return await read_workflow(redis, name, workflow_id)

        found = [info for info in await asyncio.gather(*map(read, names)) if info is not None]
        if not found:
            raise WorkflowNotFoundError(queue, workflow_id)
        if len(found) > 1:
            where = [f"{w.queue}/{w.id}" for w in found]
            raise AmbiguousIdError("workflow", workflow_id, where, more=False)
        info = found[0]
        final = tuple(
            typed._signature if (typed := self.tasks.get(step.type)) is not None else None
            for step in info.stages[-1]
        )
        return WorkflowHandle(info, client, final)

    async def wait(
        self,
        task_id: str,
        *,
        queue: str = "default",
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 - the result's own timeout, as arq/saq/streaq
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    ) -> TaskInfo:
        """``self.client.wait(...)``: the completed task's info."""
        return await self.client.wait(
            task_id, queue=queue, timeout=timeout, poll_interval=poll_interval
        )

    # -- workers -----------------------------------------------------------------------------

    @property
    def state(self) -> S:
        """What the App's lifespan yielded, inside a handler run by its worker (or eager block)."""
        return cast(S, lifespan_state())

    def task_queues(self) -> dict[str, list[str]]:
        """Queue -> the registered task types that are enqueued there by default."""
        out: dict[str, list[str]] = {}
        for typed in self.tasks.values():
            out.setdefault(typed.defaults.get("queue") or "default", []).append(typed.name)
        return out

    def worker_settings(self, **overrides: Unpack[WorkerOptions]) -> WorkerOptions:
        """The options a worker of this App gets: the App's, then *overrides*, grouped.

        An override replaces the App's setting, but a group (``intervals``, ``limits``,
        ``aggregation``) is merged field by field: the fields the override's group sets
        to other than their default replace the App's, the others keep the App's.
        ``App(intervals=Intervals(heartbeat=2s))`` then
        ``worker_settings(intervals=Intervals(recoverer=30s))`` has both. A field given
        at its default does not override (to put an App's field back to its default,
        leave it out of the App). A deprecated flat name (``heartbeat_interval=``) is
        the field of its group, given to the App or per call, and resolves the same way.

        Without ``queues`` in either: ``default`` and every queue a registered
        task declares, each with weight 1.
        """
        return self._settings(_worker_options(self.worker_options, overrides, "worker_settings"))

    def _settings(self, merged: WorkerOptions) -> WorkerOptions:
        if merged.get("queues") is None:
            queues = dict.fromkeys(["default", *sorted(self.task_queues())], 1)
            merged["queues"] = queues
        return merged

    def server(
        self, *, redis: RedisTarget | None = None, **options: Unpack[WorkerOptions]
    ) -> Server:
        """A :class:`Server` for this App (its Redis unless *redis*), lifespan and settings.

        *options* override the App's worker settings (merged as
        :meth:`worker_settings` says). Unless it is a burst run, the server also runs
        the App's ``@app.cron`` schedules (started and stopped with its
        lifespan). Logs a warning naming every registered task whose queue this
        server does not serve.
        """
        settings = _worker_options(self.worker_options, options, "app.server")
        return self._server(redis, self._settings(settings))

    def _server(self, redis: RedisTarget | None, settings: WorkerOptions) -> Server:
        target: RedisTarget | Connection = self.redis if redis is None else redis
        if isinstance(target, Connection):
            target = target.redis
        lifespan = self.lifespan
        if self.crons and not settings.get("burst"):
            lifespan = self._cron_lifespan(target)
        server = Server(target, lifespan=lifespan, **settings)
        self._warn_unserved(server)
        return server

    def _warn_unserved(self, server: Server) -> None:
        served = list(server.config.queues)
        for queue, types in sorted(self.task_queues().items()):
            if queue in served or any(fnmatch.fnmatchcase(queue, q) for q in served):
                continue
            get_logger().warning(
                "this worker does not serve a queue that registered tasks use; "
                "their tasks wait for another worker",
                queue=queue,
                task_types=types,
                served=served,
            )

    def run_worker(self, **options: Unpack[WorkerOptions]) -> Coroutine[Any, Any, None]:
        """Run a worker until SIGTERM/SIGINT (or, with ``burst=True``, until the queues
        empty): ``await app.run_worker(...)``.

        *options* override the App's worker settings (see :meth:`server`); they are read
        at the call (an unknown name raises there, a deprecated one warns there), the
        server is made when the coroutine runs.
        """
        settings = _worker_options(self.worker_options, options, "app.run_worker")
        return self._run_worker(settings)

    async def _run_worker(self, settings: WorkerOptions) -> None:
        await self._server(None, self._settings(settings)).run(self.mux)

    @contextlib.asynccontextmanager
    async def eager(self) -> AsyncIterator[App[S]]:
        """Run enqueued tasks in-process, at once, for unit tests.

        Inside the block ``task.enqueue(...)`` encodes the arguments as a
        worker would receive them, runs the handler (its lifespan entered once
        for the block) and returns a handle whose ``result()`` returns the
        value or raises :class:`~asyncq.TaskFailedError` from the exception.
        Nothing touches Redis; no retries.
        """
        if self._eager is not None:
            raise RuntimeError("already in eager mode")
        async with contextlib.AsyncExitStack() as stack:
            state: Any = None
            token = None
            if self.lifespan is not None:
                state = await stack.enter_async_context(self.lifespan())
                token = state_var.set(state)
            self._eager = _Eager(state)
            try:
                yield self
            finally:
                self._eager = None
                if token is not None:
                    state_var.reset(token)

    def __repr__(self) -> str:
        return f"<App tasks={len(self.tasks)}>"


def _zone_name(timezone: str | tzinfo) -> str:
    """The IANA name of *timezone* (as ``CRON_TZ=`` takes it); ValueError naming a bad one."""
    if isinstance(timezone, str):
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {timezone!r}") from None
        return timezone
    if isinstance(timezone, ZoneInfo):
        return timezone.key
    if timezone is UTC:
        return "UTC"
    raise TypeError(
        f"timezone must be a zone name or a zoneinfo.ZoneInfo (Go reads the name), got {timezone!r}"
    )


class _CronDecorator:
    """What ``@app.cron(...)`` returns: applied to a typed task or a function, schedules it."""

    __slots__ = ("_register",)

    def __init__(self, register: Callable[[Callable[..., Any]], TypedTask[Any, Any]]) -> None:
        self._register = register

    @overload
    def __call__(self, fn: TypedTask[P, R], /) -> TypedTask[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> TypedTask[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> TypedTask[P, R]: ...

    def __call__(self, fn: Callable[..., Any], /) -> TypedTask[Any, Any]:
        return self._register(fn)


class _TaskDecorator:
    """What ``@app.task(...)`` returns: applied to a function, registers it."""

    __slots__ = ("_register",)

    def __init__(self, register: Callable[[Callable[..., Any]], TypedTask[Any, Any]]) -> None:
        self._register = register

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> TypedTask[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> TypedTask[P, R]: ...

    def __call__(self, fn: Callable[..., Any], /) -> TypedTask[Any, Any]:
        return self._register(fn)


class _DurableDecorator:
    """What ``@app.durable(...)`` returns: applied to a function, registers it."""

    __slots__ = ("_register",)

    def __init__(self, register: Callable[[Callable[..., Any]], DurableFunction[Any, Any]]) -> None:
        self._register = register

    def __call__(
        self, fn: Callable[Concatenate[Run, P], Coroutine[Any, Any, R]], /
    ) -> DurableFunction[P, R]:
        return self._register(fn)
