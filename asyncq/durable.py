"""Durable functions: the replay engine and :class:`Run`, what a durable function awaits.

::

    @app.durable(queue="onboarding")
    async def onboard(run: Run, user_id: int) -> str:
        await run.step(send_welcome, user_id)
        opened = await run.wait_for("email:opened", key=str(user_id), timeout=timedelta(days=3))
        ...

A run is an ordinary asynq task of the function's type. Each attempt replays the
function from the top against the run's record (:func:`asyncq._keys.run_key`): every
entry the function asks for (a step, a local call, a sleep, a wait, ``now()``,
``uuid()``) gets the next index, and an entry whose result is recorded returns it at
once. The first entry that needs what is not recorded ends the attempt by raising
:class:`~asyncq._broker.durable.RunSuspended` through the function; the worker writes
the suspension (its steps enqueued, the run parked) in one script, and the step's
acknowledgement, the signal or the time makes the run pending again. A wait for steps
awaited in the function's own coroutine parks it instead (:class:`ParkedRuns`,
:func:`drive`): the attempt ends the same way, and the next one on this worker resumes
the coroutine rather than replaying, while the record shows nothing it does not know.
Before that, a wait for one step in the run's queue is offered to the worker
(:data:`~asyncq._broker.durable.INLINE_STEPS`): run inline, in the attempt's slot, the
step's recorded result comes back and the coroutine goes on (:func:`drive` again)
without the attempt ending. See docs/durable.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

import pydantic_core

from asyncq import _keys as keys
from asyncq._broker.durable import (
    FAILED_RUN_KEPT,
    RUN_HEADER,
    RUN_QUEUE_HEADER,
    STEP_HEADER,
    RunSuspended,
    SignalWait,
    SuspendPlan,
    record_wait,
    settle_run,
)
from asyncq._codec import encode_task_message
from asyncq._producer.completion import TaskFailedError
from asyncq._producer.compose import Templates, compose
from asyncq._redis.options import RedisClient
from asyncq._redis.transport import FastConnection
from asyncq._serde import ResultCodec
from asyncq.errors import NonDeterminismError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task, TaskInfo, TaskState

__all__ = [
    "FAILED_RUN_KEPT",
    "MIN_RUN_KEPT",
    "Run",
    "StepCall",
    "StepFailedError",
    "StepTask",
]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


MIN_RUN_KEPT = 60
"""Seconds a succeeded run's record is kept at least (its retention when longer): an
acknowledgement that fails after the record says succeeded replays from the record."""

_SIGNATURE_ARGS = 64
"""Arguments up to this many bytes of JSON are written into a step's signature as they
are (readable in a non-determinism error); longer ones as a digest."""


class StepTask(Protocol[P, R_co]):
    """What :meth:`Run.step` runs: an ``@app.task`` typed task (or one with options bound,
    ``task.options(...)``) or another durable function (a child run)."""

    def to_task(self, *args: P.args, **kwargs: P.kwargs) -> Task: ...

    def _decode_result(self, data: bytes | None) -> R_co: ...


class StepFailedError(TaskFailedError):
    """A step of a durable run failed for good (archived after its retries, or revoked):
    raised where the function awaits it. ``index`` is the step's place in the run."""

    def __init__(self, info: TaskInfo, index: int) -> None:
        super().__init__(info)
        self.index = index


class StepCall(Generic[R]):
    """A step asked for with :meth:`Run.step`: await it (or pass it to :meth:`Run.gather`)
    for its result. Its place in the run is taken when it is created."""

    __slots__ = ("_data", "_message", "_target", "_task", "index", "run")

    def __init__(self, run: Run, index: int, task: Task, target: StepTask[..., R]) -> None:
        self.run = run
        self.index = index
        self._task = task
        self._target = target
        self._message: TaskMessage | None = None
        self._data = b""

    @property
    def message(self) -> TaskMessage:
        """The step's task message, composed when first needed (a replay reading the
        step's recorded result needs none). Raises ValueError for a step that would
        not run at once (scheduled, grouped or unique)."""
        if self._message is None:
            self._message, self._data = self._compose()
        return self._message

    @property
    def data(self) -> bytes:
        """The encoding of :attr:`message`."""
        if self._message is None:
            self._message, self._data = self._compose()
        return self._data

    def _compose(self) -> tuple[TaskMessage, bytes]:
        """The step's message and its encoding: composed as a task enqueued with its id
        and headers, or from the composition of its option set learned then."""
        task = self._task
        task_id = f"{self.run.id}-{self.index}"
        headers = {
            RUN_HEADER: self.run.id,
            RUN_QUEUE_HEADER: self.run.queue,
            STEP_HEADER: str(self.index),
        }
        key = _STEP_TEMPLATES.key(task, ())
        template = None if key is None else _STEP_TEMPLATES.get(key)
        if template is not None:
            return template.message(task, task_id, headers)
        composed = compose(task, [{"task_id": task_id, "headers": headers}], datetime.now(UTC))
        if composed.state is not TaskState.PENDING or composed.unique_ttl is not None:
            raise ValueError(
                f"step {task.type!r} of a durable function must run at once (no "
                "process_at, process_in, group or unique); wait with run.sleep() instead"
            )
        if key is not None:
            _STEP_TEMPLATES.learn(key, composed)
        # Without a retention of its own the step is deleted when acknowledged: its result
        # (written by its handler all the same) lives on in the run's record.
        return composed.message, encode_task_message(composed.message)

    def _outcome(self) -> R:
        """The recorded result, or the recorded failure raised."""
        error = self.run._field(f"e:{self.index}")
        if error is not None:
            msg = self.message
            msg.error_msg = error.decode("utf-8", "replace")
            info = TaskInfo.from_message(msg, TaskState.ARCHIVED, None)
            raise StepFailedError(info, self.index)
        return self._target._decode_result(self.run._field(f"r:{self.index}"))

    def __await__(self) -> Generator[Any, None, R]:
        results = yield from self.run.gather(self).__await__()
        return results[0]

    def __repr__(self) -> str:
        return f"<StepCall {self.index} {self.message.type!r} of run {self.run.id}>"


_STEP_TEMPLATES = Templates()
"""The compositions of the option sets steps were composed with (see :class:`Templates`)."""

_ENTRY_FIELDS = frozenset(("s:", "r:", "e:", "d:"))
"""The prefixes of a record's entry fields (see :func:`asyncq._keys.run_key`)."""


class _Park:
    """Awaited by a run waiting for steps: yields itself, with the attempt's plan, up to
    :func:`drive`, which ends the attempt there and keeps the coroutine."""

    __slots__ = ("plan",)

    def __init__(self, plan: SuspendPlan) -> None:
        self.plan = plan

    def __await__(self) -> Generator[Any, None, None]:
        yield self


class _Pass:
    """Passes what the driven coroutine yielded (a future, or None) on to the task driving
    it, and what the task answers back."""

    __slots__ = ("yielded",)

    def __init__(self, yielded: object) -> None:
        self.yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self.yielded)


@dataclass(frozen=True, slots=True)
class Finished(Generic[R]):
    """What the driven function returned."""

    value: R


async def drive(
    coro: Coroutine[Any, Any, R], *, throw: BaseException | None = None
) -> Finished[R] | SuspendPlan:
    """Run a durable function's *coro* in this task until it returns (:class:`Finished`)
    or parks waiting for steps (the plan its attempt ends on; *coro* may be driven
    again by a later attempt, which the :class:`Run` resumes first).

    Everything else the coroutine awaits passes through: its futures are this task's
    to wait on, and what this task is thrown (a cancellation) is thrown into the
    coroutine, so it runs as if awaited here. *throw*: thrown in first.
    """
    sent: Any = None
    thrown = throw
    while True:
        try:
            yielded = coro.send(sent) if thrown is None else coro.throw(thrown)
        except StopIteration as stop:
            return Finished(stop.value)
        sent = thrown = None
        if isinstance(yielded, _Park):
            return yielded.plan
        try:
            sent = await _Pass(yielded)
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # the coroutine's to handle, as if awaited here
            thrown = exc


PARKED_LIMIT = 1024
"""Parked coroutines a durable function keeps on a worker at most (the oldest go first)."""
PARKED_SECONDS = 300.0
"""How long a parked coroutine is kept: its steps finished on another worker (the run
went on there) or have not finished yet."""


@dataclass(slots=True)
class Parked:
    """A run's coroutine kept between two attempts on this worker."""

    run: Run
    coro: Coroutine[Any, Any, Any]
    since: float


class ParkedRuns:
    """A durable function's parked coroutines on this worker, by run id.

    A run that waits for steps ends its attempt as any suspension does (written to
    Redis: the record is the truth), but its coroutine is kept here: when its step's
    success wakes it on this worker (it continues in the step's slot), the next
    attempt resumes the coroutine where it waited instead of replaying the function
    from the top. An attempt that finds no coroutine, or one whose record moved on
    without it, replays.
    """

    __slots__ = ("_clock", "_loop", "_runs")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._runs: dict[str, Parked] = {}  # in the order they were parked
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None  # the one they were parked in

    def __len__(self) -> int:
        return len(self._runs)

    def _in_this_loop(self) -> dict[str, Parked]:
        """The parked coroutines, dropped first if they were parked in another event loop
        (a worker started again in a new loop of the same process): what they hold may
        belong to that loop, so they are closed, not resumed, and those runs replay."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            for parked in self._runs.values():
                with contextlib.suppress(RuntimeError):  # an `await` in its cleanup
                    parked.coro.close()
            self._runs.clear()
            self._loop = loop
        return self._runs

    def take(self, run_id: str) -> Parked | None:
        return self._in_this_loop().pop(run_id, None)

    def keep(self, run: Run, coro: Coroutine[Any, Any, Any]) -> list[Parked]:
        """Park *coro*; returns those it pushes out (too many, or too old) to discard."""
        now = self._clock()
        runs = self._in_this_loop()
        runs[run.id] = Parked(run, coro, now)
        out: list[Parked] = []
        for parked in runs.values():
            if len(runs) - len(out) <= PARKED_LIMIT and now - parked.since < PARKED_SECONDS:
                break
            out.append(parked)
        for parked in out:
            del runs[parked.run.id]
        return out


async def discard(coro: Coroutine[Any, Any, Any]) -> None:
    """End a parked coroutine as a suspension ends an attempt's: RunSuspended is raised
    where it waits, so its ``finally`` blocks and ``async with`` exits run (driven
    here). Whatever it raises then is dropped; one that parks again is closed."""
    try:
        ended = await drive(coro, throw=RunSuspended(SuspendPlan("steps")))
    except Exception:  # the run replays from its record: nothing is lost
        return
    except RunSuspended:
        return
    if isinstance(ended, SuspendPlan):
        coro.close()


class Run:
    """A durable run, as its function sees it (the function's first argument).

    Everything the function does that is not deterministic goes through it: steps
    (tasks run by any worker), local calls, sleeps, signal waits, the time and random
    ids. Each is recorded once and replayed from the record afterwards.
    """

    def __init__(
        self,
        run_id: str,
        queue: str,
        record: Mapping[str, bytes],
        *,
        redis: RedisClient | FastConnection,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.id = run_id
        """The run's id: the id of its task."""
        self.queue = queue
        """The queue of the run's task (and of its record)."""
        self._record = dict(record)
        self._writes: dict[str, bytes] = {}  # what this attempt decided, written as it ends
        self._next = 0
        self._redis = redis
        self._clock = clock
        self._codecs: dict[Callable[..., Any], ResultCodec] = {}
        self._driver: asyncio.Task[Any] | None = None
        """The task driving the function's coroutine (:func:`drive`), where a wait for
        steps may park it instead of ending it."""

    # -- the record ---------------------------------------------------------------------

    def _field(self, name: str) -> bytes | None:
        got = self._record.get(name)
        return got if got is not None else self._writes.get(name)

    def _resumes_from(self, record: Mapping[str, bytes]) -> bool:
        """Whether the coroutine parked on this run may go on against *record*: every
        entry it knows (signature, result, failure, deadline; written once, never
        changed) is there as it knows it, and no entry after the last it reached (no other
        attempt went further)."""
        if f"s:{self._next}" in record:
            return False
        for known in (self._record, self._writes):
            for name, value in known.items():
                if name[:2] in _ENTRY_FIELDS and record.get(name) != value:
                    return False
        return True

    def _resume(self, record: Mapping[str, bytes]) -> None:
        """Go on from where the coroutine parked, against *record* (its writes are in it)."""
        self._record = dict(record)
        self._writes = {}

    def _ran_inline(self, plan: SuspendPlan, value: bytes) -> None:
        """The one step *plan* waited for ran inline and recorded *value*, *plan*'s records
        written with it: the coroutine goes on against the record as it now stands."""
        ((index, _),) = plan.steps
        self._record.update(plan.records)
        self._writes = {}
        self._record[f"r:{index}"] = value

    def _entry(self, signature: str) -> int:
        """The next entry's index, its *signature* checked against the record's."""
        index = self._next
        self._next += 1
        recorded = self._field(f"s:{index}")
        if recorded is None:
            self._writes[f"s:{index}"] = signature.encode()
        elif recorded != signature.encode():
            raise NonDeterminismError(
                self.id, index, recorded.decode("utf-8", "replace"), signature
            )
        return index

    async def _settle(self, state: str, expire_in: int) -> None:
        """Write what this attempt decided and the run's state (the attempt ends)."""
        await settle_run(
            self._redis, self.queue, self.id, state, records=self._writes, expire_in=expire_in
        )

    # -- steps --------------------------------------------------------------------------

    def step(self, task: StepTask[P, R], /, *args: P.args, **kwargs: P.kwargs) -> StepCall[R]:
        """Run *task* (an ``@app.task`` or a durable function) with these arguments as the
        run's next step, on any worker of its queue; await the result for its return value.

        Recorded, the result is returned without running the task again; otherwise the
        task is enqueued (its id derived from the run's and the step's index, so no
        replay enqueues it twice) and the run waits, holding no worker, until the task's
        acknowledgement records it. A step that fails for good raises
        :class:`StepFailedError` (a :class:`~asyncq.TaskFailedError`) here. A step
        cannot be scheduled, aggregated or unique (ValueError where it is awaited, not
        recorded yet): use :meth:`sleep` to wait.
        """
        plain = task.to_task(*args, **kwargs)
        payload = plain.payload or b""
        shown = (
            payload.decode("utf-8", "replace")
            if len(payload) <= _SIGNATURE_ARGS
            else "sha256:" + hashlib.sha256(payload).hexdigest()[:32]
        )
        index = self._entry(f"step {plain.type} {shown}")
        return StepCall(self, index, plain, task)

    async def gather(self, *steps: StepCall[R]) -> list[R]:
        """Await several steps at once: every one not recorded is enqueued together and
        the run waits once, until all are recorded; their results in order.

        When one failed, the first failure (in the order given) is raised once all are
        recorded.
        """
        while True:
            missing = [
                s for s in steps if self._field(f"r:{s.index}") is None
                and self._field(f"e:{s.index}") is None
            ]  # fmt: skip
            if not missing:
                return [s._outcome() for s in steps]
            plan = SuspendPlan(
                "steps",
                records=self._writes,
                steps=[(s.index, s.message) for s in missing],
                waits=[s.index for s in missing],
                encoded={s.index: s.data for s in missing},
            )
            if self._driver is None or asyncio.current_task() is not self._driver:
                raise RunSuspended(plan)  # awaited in a task of its own (a TaskGroup's)
            # The attempt ends on the plan; a later attempt on this worker resumes here
            # with the record its steps completed (see drive()), or replays from the top.
            await _Park(plan)

    # -- local values -------------------------------------------------------------------

    @overload
    async def call(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    @overload
    async def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run *fn* here, in the attempt, as the run's next entry, and record its return value
        (JSON, by its return annotation): a replay returns the recorded value instead of
        calling *fn* again.

        The value is written with the run's next suspension (or its end): a crash
        before that calls *fn* again. A call that raises records nothing.
        """
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        index = self._entry(f"call {name}")
        codec = self._codecs.get(fn)
        if codec is None:
            codec = self._codecs[fn] = ResultCodec(fn, name)
        recorded = self._field(f"r:{index}")
        if recorded is None:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            recorded = codec.encode(value)
            self._writes[f"r:{index}"] = recorded
        # decoded in both cases, so a replay sees exactly what the first run saw
        return codec.decode(recorded)

    def now(self) -> datetime:
        """The time (UTC) this entry was first reached, the same on every replay."""
        index = self._entry("now")
        recorded = self._field(f"r:{index}")
        if recorded is None:
            recorded = self._writes[f"r:{index}"] = repr(self._clock()).encode()
        return datetime.fromtimestamp(float(recorded), UTC)

    def uuid(self) -> uuid.UUID:
        """A random UUID drawn once, the same on every replay."""
        index = self._entry("uuid")
        recorded = self._field(f"r:{index}")
        if recorded is None:
            recorded = self._writes[f"r:{index}"] = uuid.uuid4().hex.encode()
        return uuid.UUID(recorded.decode())

    # -- time and signals ---------------------------------------------------------------

    def _deadline(self, index: int, wait: timedelta | None) -> float | None:
        """The entry's deadline as first recorded (unix s), or *wait* from now."""
        recorded = self._field(f"d:{index}")
        if recorded is not None:
            return float(recorded)
        if wait is None:
            return None
        deadline = self._clock() + wait.total_seconds()
        self._writes[f"d:{index}"] = repr(deadline).encode()
        return deadline

    async def sleep(self, duration: timedelta, /) -> None:
        """Wait *duration* (from when the run first got here) holding no worker: the run
        waits as a scheduled task, due at the sleep's end."""
        if not isinstance(duration, timedelta):
            raise TypeError(f"sleep takes a timedelta, got {type(duration).__name__}")
        index = self._entry("sleep")
        if self._field(f"r:{index}") is not None:
            return
        deadline = self._deadline(index, duration)
        assert deadline is not None
        if self._clock() >= deadline:
            self._writes[f"r:{index}"] = b""
            return
        raise RunSuspended(SuspendPlan("sleep", records=self._writes, until=deadline))

    async def wait_for(
        self,
        name: str,
        /,
        *,
        key: str = "",
        timeout: timedelta | None = None,  # noqa: ASYNC109 - the wait's own timeout, recorded
    ) -> Any:
        """Wait for the signal *name* / *key* (:meth:`asyncq.App.signal`) holding no worker;
        its payload (decoded JSON), or None when *timeout* passed first (None: no timeout).

        A signal sent before the run waits for it is kept for a while (``keep=`` of
        ``App.signal``) and taken by the first wait for it; the first of the signal and
        the timeout is recorded, for good.
        """
        keys.refuse_braces("signal name", name)
        keys.refuse_braces("signal key", key)
        if timeout is not None and not isinstance(timeout, timedelta):
            raise TypeError(f"timeout must be a timedelta, got {type(timeout).__name__}")
        index = self._entry(f"wait {name} {key}")
        recorded = self._field(f"r:{index}")
        wait = SignalWait(name, key, index)
        if recorded is None:
            deadline = self._deadline(index, timeout)
            if deadline is None or self._clock() < deadline:
                raise RunSuspended(
                    SuspendPlan("signal", records=self._writes, signal=wait, until=deadline)
                )
            recorded = await record_wait(self._redis, self.queue, self.id, wait, b"")
            self._record[f"r:{index}"] = recorded
        return pydantic_core.from_json(recorded) if recorded else None

    def __repr__(self) -> str:
        return f"<Run {self.id} queue={self.queue!r}>"
