"""One task's life on this server, top to bottom: start, run, decide, write, release.

A fetch or a delivery hands the processor a :class:`~asyncq._broker.DequeuedTask`
and a slot; :meth:`Attempts.start` registers it in the server's
:class:`~asyncq._worker.active.ActiveTasks` and starts its coroutine,
:meth:`Attempts.live`, owned by the processor's TaskGroup (see
:mod:`asyncq._worker.processor`). That coroutine is asynq's
``exec``:

* **run** (:meth:`Attempts.run`): its type's rate token, then the handler,
  awaited inline inside a :class:`~asyncq._worker.select.FirstOf`: the
  coroutine waits for the first of {the handler done, its lease's
  :attr:`~asyncq._worker.lease.Lease.expired` event, a cancel request
  (:attr:`~asyncq._worker.active.ActiveTask.cancelled`), its deadline}, as
  asynq's ``select`` does, and acts on which came first. When it is not the
  handler, the handler is cancelled and gets ``CANCEL_GRACE`` (5 s; 1 s, 0.1 s
  on shutdown) to return; one that ignores its cancellation past that goes on
  as an *orphan* in a task of its own (:mod:`asyncq._worker.swallowed`;
  :attr:`Attempts.orphans`: logged, counted by shutdown, awaited by nothing, as
  asynq does not wait for a handler that ignores its context), and its failure
  is written at once.
* **decide** (:func:`~asyncq._worker.outcome.decide`) and **write**
  (:class:`OutcomeWriter`): exactly as asynq (spec 5.3/5.4), unless the local
  lease expired, in which case nothing is written and the recoverer takes over.
  Successes finished in the same event-loop turn are acknowledged together;
  writes Redis could not take go to the syncer.
* **release**: the slot, the in-flight bytes and the queue's local count go back
  to the processor (its ``released`` callback).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from asyncq._broker.durable import Recorded, RunSuspended, SuspendPlan
from asyncq._broker.durable_cancel import CANCELED_ERROR
from asyncq._broker.processing import DequeuedTask
from asyncq._broker.workflow import AckMode
from asyncq._logging import RateLimiter, error_text, task_fields
from asyncq._redis.errors import REDIS_ERRORS, is_transient
from asyncq._worker import active as registry
from asyncq._worker.active import ActiveTask, ActiveTasks
from asyncq._worker.batched import AckBatcher, InlineStarts, TypeTokens
from asyncq._worker.lease import Lease
from asyncq._worker.limits import Rate
from asyncq._worker.outcome import LeaseState, Outcome, decide, not_run
from asyncq._worker.result_writer import TaskResultWriter
from asyncq._worker.roles import RoleDeps
from asyncq._worker.select import DEADLINE, Deadlines, FirstOf
from asyncq._worker.swallowed import Rest, outlive, until_swallowed
from asyncq.errors import (
    DeadlineExceededError,
    HandlerNotFoundError,
    LeaseExpiredError,
    RateLimited,
    RevokeTask,
    SkipRetry,
    TaskCanceledError,
    find_error,
    wraps_error,
)
from asyncq.history import HistoryRecorder
from asyncq.hooks import WorkerHooks
from asyncq.mux import Handler
from asyncq.progress import ProgressWriter
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task

if TYPE_CHECKING:
    from asyncq._broker import DequeuedTask

__all__ = ["DEFAULT_TIMEOUT", "Attempts", "DeferWrite", "Notifier", "compute_deadline"]

DEFAULT_TIMEOUT = 1800.0
"""Seconds a task may run when its message has neither timeout nor deadline (asynq's 30 min)."""


def compute_deadline(msg: TaskMessage, now: float) -> float:
    """The unix time at which the handler is cancelled (asynq's computeDeadline, spec 5.7)."""
    if msg.timeout == 0 and msg.deadline == 0:
        return now + DEFAULT_TIMEOUT
    deadline = math.inf
    if msg.timeout != 0:
        deadline = now + msg.timeout
    if msg.deadline != 0 and msg.deadline < deadline:
        deadline = float(msg.deadline)
    return deadline


class Notifier(Protocol):
    """Wakes the result waiters of finished tasks.

    See :class:`asyncq._worker.completion.CompletionNotifier`.
    """

    def notify(self, queue: str, task_id: str) -> None: ...

    async def aclose(self) -> None: ...


class DeferWrite(Protocol):
    """Hands a write that failed because Redis was unreachable to the syncer."""

    def __call__(
        self, write: Callable[[], Awaitable[None]], *, deadline: float, what: str, msg: TaskMessage
    ) -> None: ...


_Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]
"""Starts a coroutine as a task of the processor's TaskGroup."""

_Write = Callable[[], Awaitable[None]]
"""One outcome's write to Redis, retried by the syncer when Redis was unreachable."""

_Ran = tuple[BaseException | None, timedelta | None]
"""How the handler's run ended: its failure (or the stop's), or its type's wait for a token."""


class Attempts:
    """Starts each task's coroutine and runs it; see the module docstring."""

    def __init__(
        self,
        deps: RoleDeps,
        *,
        handler: Handler,
        active: ActiveTasks,
        spawn: _Spawn,
        released: Callable[[ActiveTask], None],
        writer: OutcomeWriter,
        progress: ProgressWriter | None,
        debug: bool,
        runs_here: Callable[[str], bool] | None = None,
    ) -> None:
        """*runs_here* says of a queue whether this worker takes a task of it without a
        fetch (see :class:`OutcomeWriter`): a durable run's step, inline."""
        self.handler = handler
        self.broker = deps.broker
        self.clock = deps.broker.clock
        self.log = deps.log
        self.stats = deps.stats
        self.active = active
        self.writer = writer
        self._spawn = spawn  # with the processor's context (its limiter of sync handlers)
        self._released = released
        self._progress = progress
        self._type_rates: Mapping[str, Rate] = deps.config.type_rate_limits
        self._tokens = TypeTokens(deps.broker, writer.spawn)
        self._inline = InlineStarts(deps.broker, writer.spawn)
        self._debug = debug
        self.abandon_wait = 1.0  # what an abandoned task's handler gets to return
        self.orphans: set[asyncio.Task[None]] = set()
        """Handlers that ignored their cancellation past the grace: their failure is written
        and their slot freed; they run on, not awaited by anything (shutdown included)."""
        self._deadlines: Deadlines | None = None  # of the loop the tasks run in, from the first
        self._runs_here = runs_here

    def start(self, got: DequeuedTask) -> None:
        """Start *got*, fetched or delivered, in the slot its caller took for it."""
        msg, now = got.message, self.clock()
        if self._deadlines is None:
            self._deadlines = Deadlines(asyncio.get_running_loop())
        loop = self._deadlines.loop
        # Redis holds the lease in whole seconds (truncated): never trust it for longer.
        lease = Lease(math.floor(got.lease_expiry), clock=self.clock, loop=loop)
        active = ActiveTask(msg, lease, compute_deadline(msg, now), now, loop)
        if msg.id in self.active:
            # The same ID twice means a stale lease was recovered while we still ran it;
            # keep tracking the newest run (the older one can no longer write).
            self.log.warning("task is already running on this server", **task_fields(msg))
        self.active[msg.id] = active
        active.task = self._spawn(self.live(active))
        if self._debug:
            self.log.debug("task started", **task_fields(msg))

    async def live(self, active: ActiveTask) -> None:
        """One task's life: run its handler until the first of {it returns, its lease
        expires, a cancel request, its deadline}, write the outcome, free its slot."""
        task = Task._from_message(active.msg)
        task._deadline_ts = active.deadline
        store = self.broker if active.host is None else _Held(active)
        task.result_writer = TaskResultWriter(store, active)
        try:
            try:
                exc, limited = await self.run(active, task)
            except GeneratorExit as err:  # a sync handler's, thrown in here by the event loop:
                exc, limited = err, None  # PEP 380 closed run() instead of throwing it there
            if active.abandoned:
                return  # shutdown requeued it, or left it to recovery
            if limited is not None:
                await self.writer.type_limited(active, limited)
            elif exc is None:
                self.stats.succeeded += 1
                await self.writer.finish(active, None)
            else:
                await self.writer.failed(active, task, exc)
        except Exception as bug:  # one task's bookkeeping must not stop the others'
            self.log.error("task bookkeeping failed", exc_info=bug, **task_fields(active.msg))
        finally:
            self._release(active)

    async def run(self, active: ActiveTask, task: Task) -> _Ran:
        """Await the handler until the first of its end, its lease's expiry, a cancel request
        and its deadline (:class:`~asyncq._worker.select.FirstOf`, asynq's ``select``); the
        handler's failure or the stop's, or its type's wait for a token."""
        now = self.clock()
        if active.cancel_exc is None and now >= active.deadline:
            active.cancel_exc = DeadlineExceededError()
        elif active.cancel_exc is None and not active.lease.valid_at(now):
            # The loop stalled between the fetch and this first step for longer than the
            # lease: the recoverer may have given the task to another server already.
            active.cancel_exc = LeaseExpiredError()
        if active.cancel_exc is not None or active.abandoned:
            return active.cancel_exc, None  # stopped before it started
        active.state = "running"
        deadlines = self._deadlines
        assert deadlines is not None  # set by start()
        expired, cancelled = active.lease.expired, active.cancelled
        when = deadlines.loop.time() + active.deadline - now
        select = active.select = FirstOf((expired, cancelled), when, deadlines, active.task)
        active.given = task  # while its deadline can move: no cycle left once it ran
        exc: BaseException | None = None
        limited: timedelta | None = None  # its type's rate had no token: put back unrun
        returned = False  # the handler returned (did not raise or swallow a stop)
        try:
            with select:
                rate = self._type_rates.get(active.msg.type) if self._type_rates else None
                if rate is not None:
                    limited = await self._type_token(active, rate)
                if limited is None:
                    active.began = now if rate is None else self.clock()
                    handler = self.handler(task)
                    if self._progress is not None:
                        self._progress.begin(task, self.writer.spawn)
                    rest = await until_swallowed(handler, select.came, partial(self._grace, active))
                    returned = rest is None
                    if rest is not None:
                        self._orphan(active, rest)
        except asyncio.CancelledError as err:
            if not select.came():
                current = asyncio.current_task()
                if current is not None and current.cancelling() > 0:
                    raise  # cancelled from outside (loop shutdown): write nothing
                exc = err  # raised by the handler's own code: a failure
        except BaseException as err:  # SystemExit & co. from a handler: a failure too
            exc = err
        finally:
            active.state = "writing"  # from here on a cancel request changes nothing
            active.select = active.given = None
            if active.began:
                if self.writer.history is not None:
                    active.ran = (active.began, self.clock())
                if self._progress is not None:
                    self._progress.end(task, returned and not select.came())
        first = select.first
        if first is expired:
            active.cancel_exc = LeaseExpiredError()
            if self._debug:
                self.log.debug("lease expired; cancelling handler", **task_fields(active.msg))
        elif first is DEADLINE:
            active.cancel_exc = DeadlineExceededError()
        if first is not None:  # a done context wins over what the handler did after it
            return active.cancel_exc, None
        return exc, limited

    def _grace(self, active: ActiveTask) -> float:
        """How long a stopped handler may take to return before it is left behind."""
        return self.abandon_wait if active.abandoned else registry.CANCEL_GRACE

    def _orphan(self, active: ActiveTask, rest: Rest) -> None:
        """The handler ignored its cancellation past its grace: it goes on in a task of
        its own, as an orphan, and the caller writes its failure."""
        orphan = asyncio.get_running_loop().create_task(outlive(rest))
        if orphan.done():
            return
        self.orphans.add(orphan)
        orphan.add_done_callback(self.orphans.discard)
        self.log.error(
            "handler ignored its cancellation; freeing its slot (the handler goes on in the "
            "background, its return writes nothing)",
            grace=self._grace(active), error=error_text(active.cancel_exc or TaskCanceledError()),
            **task_fields(active.msg),
        )  # fmt: skip

    async def _type_token(self, active: ActiveTask, rate: Rate) -> timedelta | None:
        """Take a token of the task type's bucket, waiting up to 1 s for a reserved one.

        None: the handler may run now. Otherwise the delay after which a token
        should be there: the task goes back to the retry set unrun. A Redis
        error counts as no token (retried in a second): running the handler
        unchecked could pass the rate.
        """
        msg = active.msg
        try:
            granted, wait_us = await self._tokens.take(msg.type, rate)
        except REDIS_ERRORS as exc:
            if self.writer.errors.allow():
                self.log.warning(
                    "could not take a token of the task type's rate limit; rescheduling the task",
                    error=error_text(exc),
                    suppressed_since_last=self.writer.errors.take_suppressed(),
                    **task_fields(msg),
                )  # fmt: skip
            return timedelta(seconds=1)
        if not granted:
            return timedelta(microseconds=wait_us)
        if wait_us > 0:
            # The token is ours from now + wait on: the handler must not start earlier.
            await asyncio.sleep(wait_us / 1_000_000)
        return None

    def _release(self, active: ActiveTask) -> None:
        """Forget the task and give its slot back: an inline step's is its run's attempt's,
        freed by whichever of the two ends last."""
        active.state = "finished"
        # The active task and its coroutine's task refer to one another: cut the cycle, so
        # that reference counting frees them now instead of the cyclic garbage collector
        # later (which cost a quarter of the worker's CPU per task).
        active.task = None
        if self.active.get(active.msg.id) is active:
            del self.active[active.msg.id]
        host = active.host
        if host is not None:  # an inline step
            active.host = None
            host.guest = None
            if host.state != "finished":
                return  # its run's attempt goes on in the slot
            active = host  # the attempt ended first: the slot, and its counts, end here
        elif active.guest is not None:
            return  # its inline step runs on in the slot, and frees it
        self._released(active)

    # -- inline steps -------------------------------------------------------------------------

    async def run_inline(self, run_id: str, plan: SuspendPlan) -> bytes | None:
        """Run the one step a durable run's attempt awaits (*plan*) here, in the attempt's
        slot, the run task staying active (an inline step: no suspension, no fetch of
        the run again); the result its acknowledgement recorded in the run, or None when
        the attempt must suspend on *plan* after all: the step was not taken here (see
        below), or its outcome is anything but a success this worker recorded.

        Taken here when it is in the run's queue, which this worker takes without a
        fetch (:class:`OutcomeWriter`'s *runs_here*), and ``durable_inline.lua`` finds it
        neither recorded nor enqueued. While it runs, the attempt's deadline is moved
        on by the step's timeout, and after it back to what the step took: the attempt
        spends its own time on the replay only. Stopped while it awaits the step (a cancel,
        its lease, shutdown), the attempt ends and the step runs on in its slot.
        """
        host = self.active.get(run_id)
        runs_here = self._runs_here
        if (
            host is None or host.select is None or host.guest is not None
            or host.host is not None  # an inline step's own steps are not inline
            or host.task is not asyncio.current_task() or runs_here is None
            or plan.mode != "steps" or len(plan.steps) != 1
        ):  # fmt: skip
            return None
        index, step = plan.steps[0]
        if list(plan.waits) != [index] or step.queue != host.msg.queue or not runs_here(step.queue):
            return None
        try:
            got, expiry = await self._inline.start(step.queue, run_id, plan)
        except REDIS_ERRORS as exc:  # the suspension's write, next, reports it
            if self._debug:
                fields = task_fields(step)
                self.log.debug("inline step not started", error=error_text(exc), **fields)
            return None
        if got != "here":
            return None
        now = self.clock()
        deadlines = self._deadlines
        assert deadlines is not None  # set by start(), before the run's attempt
        guest = ActiveTask(
            step, Lease(math.floor(expiry), clock=self.clock, loop=deadlines.loop),
            compute_deadline(step, now), now, deadlines.loop,
        )  # fmt: skip
        allowance = guest.deadline - now
        host.move_deadline(allowance)
        guest.host, host.guest = host, guest
        self.stats.inline += 1
        self.active[step.id] = guest
        done = guest.task = self._spawn(self.live(guest))
        ended = deadlines.loop.create_future()  # not the step's task: a stop here is not its
        done.add_done_callback(partial(_resolve, ended))
        if self._debug:
            self.log.debug("inline step started", run=run_id, **task_fields(step))
        try:
            await ended  # stopped here, the attempt ends; the step runs on
        finally:
            if host.select is not None:  # the attempt goes on: what the step took is not its own
                host.move_deadline(self.clock() - now - allowance)
        return guest.recorded


class _Held:
    """Where an inline step's result goes while it runs (:attr:`ActiveTask.held`): its
    acknowledgement writes it, so the step costs no write, and no read, of its own."""

    __slots__ = ("_active",)

    def __init__(self, active: ActiveTask) -> None:
        self._active = active

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int:
        self._active.held = data
        return len(data)


def _resolve(fut: asyncio.Future[None], _: object) -> None:
    if not fut.done():
        fut.set_result(None)


def _after(first: Callable[[], Awaitable[object]], then: _Write) -> _Write:
    """The write *first*, then *then*."""

    async def write() -> None:
        await first()
        await then()

    return write


_EXPECTED: tuple[type[BaseException], ...] = (
    HandlerNotFoundError,
    TaskCanceledError,
    DeadlineExceededError,
    LeaseExpiredError,
    asyncio.CancelledError,
)
"""Failures that are outcomes, not bugs: logged as one line without a traceback."""


def _rate_limited(exc: BaseException | None) -> RateLimited | None:
    """The ``RateLimited`` a handler raised (not a failure), or None."""
    if exc is None or isinstance(exc, LeaseExpiredError):
        return None
    return find_error(exc, RateLimited)


class OutcomeWriter:
    """Decides a finished attempt's outcome, reports it (logs, hooks, history) and writes it."""

    def __init__(
        self,
        deps: RoleDeps,
        *,
        spawn: _Spawn,
        write_slots: asyncio.Semaphore,
        defer_write: DeferWrite,
        notifier: Notifier,
        hooks: WorkerHooks,
        history: HistoryRecorder | None,
        debug: bool,
        runs_here: Callable[[str], bool] | None = None,
    ) -> None:
        """*runs_here* says of a queue whether a task of it that an outcome hands on runs
        on this worker, in the slot the finished task leaves: a durable run's first step
        (:meth:`_suspend`), the run a step's success wakes (:class:`AckBatcher`)."""
        self.broker = deps.broker
        self.config = deps.config
        self.clock = deps.broker.clock
        self.log = deps.log
        self.stats = deps.stats
        self.spawn = spawn
        self.hooks = hooks
        self.history = history
        self.defer_write = defer_write
        self.errors = RateLimiter(3.0)  # failed writes, logged at most every 3 s
        # Outcome writes share the client's connection pool with the fetches, the
        # heartbeat and the handlers; bounding them keeps a high concurrency from
        # exhausting the pool (redis-py raises instead of waiting).
        self._slots = write_slots
        self._acks = AckBatcher(deps.broker, write_slots, spawn, runs_here)
        self._runs_here = runs_here
        self._notifier = notifier  # wakes result waiters
        self._debug = debug

    async def failed(self, active: ActiveTask, task: Task, exc: BaseException) -> None:
        msg = active.msg
        fields = task_fields(msg)
        limited = _rate_limited(exc)
        if limited is not None:
            # Not a failure: no count, no error handler.
            self.log.info(
                "task rate limited; rescheduled", retry_in=str(limited.retry_in), **fields
            )
        elif find_error(exc, RunSuspended) is None:  # a durable run waiting is no failure
            self._report_failure(msg, exc, fields)
            if self.config.error_handler is not None:
                await self._call_error_handler(task, exc, fields)
        await self.finish(active, exc, task)

    def _report_failure(self, msg: TaskMessage, exc: BaseException, fields: dict[str, Any]) -> None:
        stats = self.stats
        if wraps_error(exc, RevokeTask):
            stats.succeeded += 1
            self.log.info("task revoked", **fields)
        elif isinstance(exc, LeaseExpiredError):
            stats.failed += 1
            self.hooks.lease_expired(msg.queue, msg.type)
            self.log.warning("task lease expired; handler cancelled", **fields)
        else:
            stats.failed += 1
            # Expected outcomes are one line; only an unexpected error gets its traceback
            # (plain, without local variables, unless the application configured otherwise).
            expected = isinstance(exc, _EXPECTED) or wraps_error(exc, SkipRetry)
            self.log.warning(
                "task failed", error=error_text(exc), retried=msg.retried, max_retry=msg.retry,
                **fields, exc_info=None if expected else exc,
            )  # fmt: skip

    async def finish(
        self, active: ActiveTask, exc: BaseException | None, task: Task | None = None
    ) -> None:
        """Decide the attempt's outcome (:func:`~asyncq._worker.outcome.decide`) and write it."""
        msg = active.msg
        # A success's end is its "now" for decide and its lease: no other clock read (the
        # outcome is decided as the handler returns). A failure reads the clock again:
        # its error handler may have taken a while.
        ran = active.ran
        now = ran[1] if ran is not None and exc is None else self.clock()
        lease: LeaseState = "held" if active.lease.valid_at(now) else "expired"
        outcome = decide(
            msg, exc, lease=lease, config=self.config, now=now, task=task, log=self.log
        )
        kind = outcome.kind
        retried = kind == "retry" and _rate_limited(exc) is None  # a rate limit is no retry
        history = self.history
        if history is not None and ran is not None:
            began, ended = ran
            failed = exc is not None and kind != "suspend"
            history.record(msg.queue, msg.type, began, ended, failed, retried, kind == "archive")
        self.hooks.task_finished(msg.queue, msg.type, msg.id, kind, error=outcome.err_msg, exc=exc)
        if kind == "lost":
            self._lost(msg, exc)
            return
        if kind == "archive":
            self.log.warning("task archived", error=outcome.err_msg, **task_fields(msg))
            self.hooks.task_archived(msg.queue, msg.type)
        elif retried:
            self.hooks.task_retried(msg.queue, msg.type)
        if kind not in ("done", "complete"):
            await self._write_outcome(active, outcome)
            return
        # Acknowledged here rather than in _write_outcome: one coroutine frame fewer for
        # nearly every task (issue 40). A workflow step's batched acknowledgement
        # includes its workflow's hand-off, a durable step's its record in its run.
        complete = kind == "complete"
        inline = active.host is not None
        error = await self._acks.ack(msg, complete, inline, active.held if inline else None)
        if isinstance(error, DequeuedTask):  # a durable step: the run it woke continues here
            active.then = error
        elif isinstance(error, Recorded):  # an inline step: its run's attempt goes on with it
            active.recorded = error.value
        elif error is not None:
            self._ack_failed(active, outcome, complete, error)
            return
        if self._debug:
            self.log.debug("task done", **task_fields(msg))
        if complete and not outcome.durable:
            # wakes result waiters; a durable step has none (its run reads its record)
            self._notifier.notify(msg.queue, msg.id)

    def _ack_failed(
        self, active: ActiveTask, outcome: Outcome, complete: bool, error: BaseException
    ) -> None:
        """Handled as a failed single write: the syncer retries it with done(),
        mark_as_complete() or the step's acknowledgement when Redis was unreachable."""
        msg, broker = active.msg, self.broker
        write: _Write = partial(broker.mark_as_complete if complete else broker.done, msg)
        if outcome.workflow:
            write = self._workflow_ack(msg, outcome.ack_mode)
        elif outcome.durable:
            write = self._durable_ack(msg, outcome.ack_mode)
            held = active.held
            if held is not None:  # an inline step's result, written first this time
                write = _after(partial(broker.write_result, msg.queue, msg.id, held), write)
        self._write_failed(active, write, "done", error)

    def _lost(self, msg: TaskMessage, exc: BaseException | None) -> None:
        """The local lease ran out: nothing is written, the recoverer owns the task."""
        fields = task_fields(msg)
        if exc is None:
            self.hooks.lease_expired(msg.queue, msg.type)
            self.log.warning(
                "task finished after its lease expired; not writing its outcome, the recoverer "
                "will retry it",
                **fields,
            )
        elif not isinstance(exc, LeaseExpiredError):  # that one was reported already
            if _rate_limited(exc) is None:
                self.hooks.lease_expired(msg.queue, msg.type)
            self.log.warning(
                "task lease expired; not writing its outcome, the recoverer will retry it",
                **fields,
            )

    async def _write_outcome(self, active: ActiveTask, outcome: Outcome) -> None:
        """Write *outcome*, other than an acknowledgement (:meth:`finish` sends those);
        a write Redis could not take goes to the syncer."""
        msg = active.msg
        broker = self.broker
        kind = outcome.kind
        write: Callable[[], Awaitable[None]]
        if outcome.workflow:  # acknowledged together with the workflow's hand-off
            write = self._workflow_ack(msg, outcome.ack_mode, outcome.err_msg)
            await self._write(active, write, "archive" if kind == "archive" else "done")
        elif outcome.durable:  # acknowledged together with its record in the run
            write = self._durable_ack(msg, outcome.ack_mode, outcome.err_msg)
            await self._write(active, write, "archive" if kind == "archive" else "done")
        elif kind == "suspend":
            assert outcome.plan is not None
            suspend = partial(self._suspend, active, outcome.plan)
            write = self._logged(msg, "durable run suspended", "run", suspend)
            await self._write(active, write, "suspend")
        elif kind == "revoke":
            await self._write(active, partial(broker.done, msg), "done")
        elif kind == "archive":
            await self._write(active, partial(broker.archive, msg, outcome.err_msg), "archive")
        else:
            assert outcome.retry_at is not None
            retry = partial(
                broker.retry, msg, outcome.retry_at, outcome.err_msg,
                is_failure=outcome.is_failure,
            )  # fmt: skip
            await self._write(active, retry, "retry")
        if kind in ("complete", "archive") and not outcome.durable:
            self._notifier.notify(msg.queue, msg.id)  # wakes result waiters (as above)

    async def _suspend(self, active: ActiveTask, plan: SuspendPlan) -> str:
        """Write a durable run's suspension. Its first step, when this worker takes the
        step's queue, is leased to us and runs in the slot the run leaves (not when the
        syncer writes the suspension later: that slot is gone by then)."""
        first = plan.steps[0][1] if plan.steps else None
        here: float | None = None
        runs_here = self._runs_here
        # not the syncer's later write, nor an inline step's (a child run's): the slot is
        # its run's, whose attempt goes on in it
        writing = active.state == "writing" and active.host is None
        if first is not None and writing and runs_here is not None and runs_here(first.queue):
            here = self.clock() + self.broker.lease_duration
        got = await self.broker.suspend_run(active.msg, plan, step_here=here)
        if got == "here" and first is not None and here is not None:
            active.then = DequeuedTask(first, here)
        elif got == "cancelled":  # cancelled while it ran: archived as the stop would have
            self.log.info("durable run cancelled", **task_fields(active.msg))
            await self.broker.archive(active.msg, CANCELED_ERROR)
        return got

    async def type_limited(self, active: ActiveTask, retry_in: timedelta) -> None:
        """No token for the task's type: back to the retry set, unrun, no retry used."""
        msg = active.msg
        self.stats.type_rate_limited += 1
        rate = self.config.type_rate_limits.get(msg.type)
        if self._debug:
            self.log.debug(
                "task type over its rate limit; rescheduled",
                rate=str(rate), retry_in=str(retry_in), **task_fields(msg),
            )  # fmt: skip
        if not active.lease.valid():
            return  # the recoverer takes it over
        err_msg = f"asyncq: rate limit of task type {msg.type!r} ({rate}) reached; not run"
        await self._write_outcome(active, not_run(self.clock(), retry_in, err_msg))

    def _logged(
        self, msg: TaskMessage, what: str, field: str, call: Callable[[], Awaitable[str]]
    ) -> Callable[[], Awaitable[None]]:
        """The write *call* (a workflow's or a durable run's hand-off), its answer (the
        workflow's or the run's state after it) logged at debug level as *field*."""

        async def write() -> None:
            got = await call()
            if self._debug:
                self.log.debug(what, **{field: got}, **task_fields(msg))

        return write

    def _durable_ack(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> _Write:
        """The write acknowledging a durable run's step together with its record."""
        ack = partial(self.broker.ack_durable_step, msg, mode, err_msg)
        return self._logged(msg, "durable step acknowledged", "run", ack)

    def _workflow_ack(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> _Write:
        """The write acknowledging a workflow step together with its hand-off."""
        ack = partial(self.broker.ack_workflow_step, msg, mode, err_msg)
        return self._logged(msg, "workflow step acknowledged", "workflow_state", ack)

    async def _call_error_handler(
        self, task: Task, exc: BaseException, fields: dict[str, Any]
    ) -> None:
        handler = self.config.error_handler
        assert handler is not None
        try:
            result = handler(task, exc)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError as err:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # cancelled from outside (loop shutdown)
            # Raised by the error handler's own code: the outcome must still be written.
            self.log.error("error_handler raised", exc_info=err, **fields)
        except BaseException as err:  # SystemExit & co from user code: the outcome still counts
            self.log.error("error_handler raised", exc_info=err, **fields)

    async def _write(
        self, active: ActiveTask, write: Callable[[], Awaitable[None]], what: str
    ) -> None:
        try:
            async with self._slots:
                await write()
        except REDIS_ERRORS as exc:
            self._write_failed(active, write, what, exc)

    def _write_failed(
        self,
        active: ActiveTask,
        write: Callable[[], Awaitable[None]],
        what: str,
        exc: BaseException,
    ) -> None:
        msg = active.msg
        if is_transient(exc):
            self.defer_write(write, deadline=active.lease.expires_at, what=what, msg=msg)
            if self.errors.allow():
                self.log.warning(
                    "could not write task outcome; the syncer will retry it",
                    outcome=what, error=error_text(exc),
                    suppressed_since_last=self.errors.take_suppressed(),
                    **task_fields(msg),
                )  # fmt: skip
        else:
            self.log.error(
                "task outcome rejected by Redis",
                outcome=what, error=error_text(exc), **task_fields(msg),
            )  # fmt: skip
