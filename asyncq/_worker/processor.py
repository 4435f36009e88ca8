"""The processor role: fetches tasks and runs their handlers (asynq's processor).

* A :class:`~asyncq._worker.slots.Slots` semaphore of ``concurrency`` slots
  bounds the running handlers. Each fetch takes every free slot
  (``take_all``) and asks for that many tasks from all queues in one script
  call per Redis node (:class:`~asyncq._broker.multiqueue.MultiQueue`), each
  with its own lease; unfilled slots are released at once, each handler
  releases its own when it is done. ``max_inflight_bytes`` bounds the payload
  bytes of the running tasks: a fetch stops before it, no fetch runs while it
  is reached, and a single task larger than the bound runs alone.
* Each task's life is one coroutine, :meth:`Processor._run_task`, in the
  processor's TaskGroup (``run()``): it runs the handler, awaiting it
  directly, decides the outcome (:func:`~asyncq._worker.outcome.decide`),
  writes it and frees the slot. Running tasks are tracked in the server's
  :class:`~asyncq._worker.active.ActiveTasks` registry. The deadline (a timer
  handle), a cancel message and the loss of the lease (the lease's
  ``on_expired`` callback, when the heartbeater declares it expired) all stop
  the handler by cancelling that coroutine's asyncio task, with the reason as
  the failure: a running handler costs one asyncio task and no extra future.
  The ack and type-token calls are tasks of the same group, so leaving
  ``run()`` waits for every task's coroutine and every write in flight.
* Queue order per fetch: weighted and shuffled (priorities divided by their GCD;
  the distribution of asynq's repeat-``priority``-times, shuffle, de-duplicate,
  drawn with Efraimidis-Spirakis keys),
  or fixed by priority with ``strict_priority``. Paused queues look empty.
* Idle wait: asynq sleeps 0.5-1.5 s when every queue is empty. Here the
  processor clears a wake-up event before each fetch and, after an empty one,
  waits on it: an eighth of ``task_check_interval`` (80 ms) at first, doubling
  after each empty fetch up to ``task_check_interval``. The subscriber sets the
  event when an asyncq client publishes on a queue's wake-up channel, so an idle
  worker starts a task within milliseconds; tasks enqueued by Go asynq (no
  wake-up) are picked up within ``task_check_interval``. Since one fetch is one
  script call whatever the number of queues, an idle worker costs about one
  command per ``task_check_interval``.
* Direct delivery (:mod:`asyncq._broker.delivery`): after an empty fetch the
  idle processor *arms* itself (a credit of one task in Redis, and its name in
  the waiters list of each queue without a local limit), so that an asyncq
  enqueue into an empty queue writes the task active with this server's lease
  and publishes it on the server's delivery channel. The subscriber passes it to
  :meth:`Processor.receive_delivery`, which starts it in a free slot without a
  fetch (or requeues it when there is none) and arms again.
* A handler is cancelled at min(timeout, deadline) (spec 5.7), on a cancel
  message, or when its lease is declared expired. Its outcome is written
  exactly as asynq's (spec 5.3/5.4) unless the local lease has expired, in
  which case nothing is written and the recoverer takes over. A handler that
  ignores its cancellation (still running ``CANCEL_GRACE``, 5 s, after the
  stop request; :func:`_until_swallowed` bounds its awaits from then on, so
  cleanup that awaits finishes in its own task) is moved to an asyncio task
  of its own and becomes an *orphan* (:attr:`Processor.orphans`, logged,
  counted by shutdown, awaited by nothing); its task's coroutine writes its
  failure and frees its slot (asynq does not wait for a handler that ignores its context either).
  Successes finished in the same event-loop turn, workflow steps' included,
  are acknowledged together (one ``ack_many`` script call per queue); each
  worker still waits for its own acknowledgement. Writes that fail because
  Redis is unreachable are handed to the syncer.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import random
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from datetime import timedelta
from functools import partial, reduce
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import anyio

from asyncq._broker.delivery import DeliveryNote, delivered_message, parse_note
from asyncq._broker.workflow import AckMode
from asyncq._logging import Backoff, RateLimiter, error_text, is_debug_enabled, task_fields
from asyncq._redis.errors import REDIS_ERRORS, is_transient
from asyncq._worker import active as registry
from asyncq._worker.active import ActiveTask, ActiveTasks
from asyncq._worker.lease import Lease
from asyncq._worker.limits import TYPE_RATE_MAX_WAIT_US, QueueLimits, Rate
from asyncq._worker.outcome import LeaseState, Outcome, decide, not_run
from asyncq._worker.result_writer import TaskResultWriter
from asyncq._worker.roles import Role, RoleDeps
from asyncq._worker.slots import Slots
from asyncq._worker.wakeup import QueueWakeup
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
from asyncq.hooks import NO_HOOKS, WorkerHooks
from asyncq.mux import Handler, sync_limiter
from asyncq.progress import ProgressWriter
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task

if TYPE_CHECKING:
    from asyncq._broker import DequeuedTask
    from asyncq._worker.broker import WorkerBroker

__all__ = [
    "DEFAULT_TIMEOUT",
    "DeferWrite",
    "Processor",
    "QueueOrder",
    "compute_deadline",
    "normalize_queues",
]

DELIVERY_TTL = 15.0
"""Seconds a delivery credit lasts: three tracked idle waits, each of which renews it."""
REGISTER_EVERY = 600.0
"""Seconds between two registrations of an idle server in its queues' waiters lists (each
list lasts :data:`~asyncq._broker.delivery.WAITERS_TTL` after the last one)."""

_MAX_WRITES = 64


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


DEFAULT_TIMEOUT = 1800.0
"""Seconds a task may run when its message has neither timeout nor deadline (asynq's 30 min)."""


# -- pure helpers (unit-tested on their own) ------------------------------------------------


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


def normalize_queues(queues: Mapping[str, int]) -> dict[str, int]:
    """Priorities divided by their greatest common divisor (asynq's normalizeQueues)."""
    if not queues:
        return {}
    divisor = reduce(math.gcd, queues.values())
    return {name: prio // divisor for name, prio in queues.items()}


class QueueOrder:
    """The order in which one fetch tries the queues (spec 5.5)."""

    __slots__ = ("_fixed", "_inverse", "_names", "_rng")

    def __init__(
        self,
        queues: Mapping[str, int],
        *,
        strict: bool = False,
        rng: random.Random | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        """*weights* (weighted order only) replace the priorities for the draw: the
        matches of a queue pattern share its weight (see :mod:`asyncq._worker.queueset`)."""
        if not queues:
            raise ValueError("at least one queue is needed")
        normalized = normalize_queues(queues)
        self._rng = rng or random.Random()
        self._fixed: list[str] | None = None
        self._names: list[str] = []
        self._inverse: list[float] = []
        if len(normalized) == 1:
            self._fixed = list(normalized)
        elif strict:
            # Sorted by priority, highest first; equal priorities by name so the
            # order is stable (asynq's sort is not, which only makes ties random).
            self._fixed = sorted(normalized, key=lambda q: (-normalized[q], q))
        else:
            self._names = list(normalized)
            draw: Mapping[str, float] = normalized if weights is None else weights
            self._inverse = [1.0 / draw[name] for name in self._names]

    def __call__(self) -> list[str]:
        if self._fixed is not None:
            return self._fixed
        # asynq expands each queue priority times, shuffles and keeps first
        # occurrences: weighted sampling without replacement. Efraimidis-Spirakis
        # keys (u ** (1 / weight), largest first) draw the same distribution in
        # O(n log n) for n queues instead of a shuffle of the sum of priorities.
        rand = self._rng.random
        keyed = sorted(
            zip([rand() ** inv for inv in self._inverse], self._names, strict=True),
            reverse=True,
        )
        return [name for _, name in keyed]


# -- the running task ----------------------------------------------------------------------

_EXPECTED: tuple[type[BaseException], ...] = (
    HandlerNotFoundError,
    TaskCanceledError,
    DeadlineExceededError,
    LeaseExpiredError,
    asyncio.CancelledError,
)
"""Failures that are outcomes, not bugs: logged as one line without a traceback."""


def _cancelled_from_outside() -> bool:
    """The current task was cancelled by someone else than the processor (loop shutdown)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


def _uncancel() -> None:
    """Forget the cancellations of the current task that were handled (a later
    ``asyncio.timeout`` in it would take them for its own)."""
    current = asyncio.current_task()
    if current is not None:
        while current.cancelling():
            current.uncancel()


_Steps = Generator[Any, None, Any]
"""An awaitable's ``__await__()`` iterator: what the event loop drives."""


@types.coroutine
def _until_swallowed(
    handler: Awaitable[None], stopped: Callable[[], bool], grace: Callable[[], float]
) -> Generator[Any, None, tuple[_Steps, Any] | None]:
    """``await handler``, except when the handler outlives the processor's stop request.

    Returns None once the handler returned, and raises what it raised. Until the
    processor asks the task to stop (*stopped()*), the handler's awaits are passed to
    the event loop as they are: this costs nothing per task. From then on, each await
    is also bounded by the rest of *grace()* seconds: a handler that is still running
    after it ignores its cancellation, and its steps and what it waits on are returned,
    for :func:`_resume` in a task of its own; the caller can then write the failure and
    free the slot while the handler runs on. Cleanup that awaits after a cancellation
    (``finally`` blocks, anyio's shielded scopes, an HTTP client closing its
    connection) therefore finishes in the task it began in, and only a handler that
    really ignores its cancellation costs a second task.
    """
    steps = handler.__await__()
    thrown: BaseException | None = None
    loop = asyncio.get_running_loop()
    until: float | None = None  # when the grace after the stop request runs out
    while True:
        try:
            pending = steps.send(None) if thrown is None else steps.throw(thrown)
        except StopIteration:
            return None
        thrown = None
        if until is None and stopped():
            until = loop.time() + grace()
        try:
            if until is None or not isinstance(pending, asyncio.Future):
                yield pending
            elif not (yield from _wait_until(loop, pending, until)):
                return steps, pending
        except GeneratorExit:  # closed, as `await` closes what it awaits (PEP 380)
            steps.close()
            raise
        except BaseException as exc:  # the task was cancelled, or the awaited future raised
            thrown = exc


@types.coroutine
def _wait_until(
    loop: asyncio.AbstractEventLoop, pending: asyncio.Future[Any], until: float
) -> Generator[Any, None, bool]:
    """Wait for the future a handler awaits, *pending*, until the loop time *until*;
    whether it is done. The handler is then stepped as its task would step it (the
    future's ``__await__`` reads its result); a cancellation of this task while it
    waits is passed on to *pending*, as a task passes it to the future it awaits."""
    pending._asyncio_future_blocking = False
    timed_out = False
    while not pending.done() and not timed_out:
        waiter = loop.create_future()

        def wake(_: object = None, *, waiter: asyncio.Future[None] = waiter) -> None:
            if not waiter.done():
                waiter.set_result(None)

        def time_out(waiter: asyncio.Future[None] = waiter) -> None:
            nonlocal timed_out
            timed_out = True
            wake(waiter=waiter)

        pending.add_done_callback(wake)
        timer = loop.call_at(until, time_out)
        waiter._asyncio_future_blocking = True  # what `await waiter` would set
        try:
            yield waiter
        except asyncio.CancelledError:
            pending.cancel()
        finally:
            timer.cancel()
            pending.remove_done_callback(wake)
    if pending.done():
        return True
    pending._asyncio_future_blocking = True  # as its __await__ left it, for _resume to yield
    return False


@types.coroutine
def _resume(steps: _Steps, pending: Any) -> Generator[Any, None, None]:
    """Continue a handler, suspended on *pending*, to its end; what it raises is dropped
    (its failure was written already; SystemExit raised out of a task would stop the loop)."""
    while True:
        try:
            yield pending
            step = partial(steps.send, None)
        except GeneratorExit:
            steps.close()
            return
        except BaseException as exc:
            step = partial(steps.throw, exc)
        try:
            pending = step()
        except BaseException:
            return


async def _run(rest: tuple[_Steps, Any]) -> None:
    await _resume(*rest)


_Spawn = Callable[[Coroutine[Any, Any, None]], None]
"""Starts a coroutine in the processor's TaskGroup."""


def _rate_limited(exc: BaseException | None) -> RateLimited | None:
    """The ``RateLimited`` a handler raised (not a failure), or None."""
    if exc is None or isinstance(exc, LeaseExpiredError):
        return None
    return find_error(exc, RateLimited)


# -- the role --------------------------------------------------------------------------------


class Processor(Role):
    """Fetches tasks and runs them; see the module docstring."""

    name: ClassVar[str] = "processor"

    def __init__(
        self,
        deps: RoleDeps,
        *,
        handler: Handler,
        active: ActiveTasks,
        wakeup: QueueWakeup,
        defer_write: DeferWrite,
        on_burst_done: Callable[[], object],
        notifier: Notifier,
        write_limit: int = _MAX_WRITES,
        hooks: WorkerHooks = NO_HOOKS,
        history: HistoryRecorder | None = None,
        progress: ProgressWriter | None = None,
        server_id: str = "",
    ) -> None:
        super().__init__(deps)
        self._server_id = server_id  # whose delivery channel the subscriber listens on
        self._registered = (-1, 0.0)  # QueueSet version and time of the last registration
        self._waiting_in: set[str] = set()  # the queues whose waiters lists name us
        self._armed_at = -math.inf  # when the credit was last renewed
        self._spent = False  # a task was delivered to us since: the credit is used up
        self._fetch_in_flight = False  # the fetch loop holds every free slot for its fetch
        # Delivered while a fetch held the slots: started when it gives back those it left.
        self._held: list[tuple[TaskMessage, DeliveryNote]] = []
        self._arm_errors = RateLimiter(3.0)
        self._hooks = hooks
        self._history = history
        self._progress = progress
        cfg = deps.config
        self.handler = handler
        self.clock: Callable[[], float] = deps.broker.clock
        self.active = active
        self.slots = Slots(cfg.concurrency)
        self._queue_order: QueueOrder | None = None
        self._order_version = -1  # of the QueueSet the order was built from
        self._limits = QueueLimits(
            cfg.queue_concurrency, cfg.local_queue_concurrency, cfg.rate_limits, deps.queues
        )
        self._type_rates: Mapping[str, Rate] = cfg.type_rate_limits
        self._tokens = _TypeTokens(deps.broker, self._spawn)
        self._max_bytes = cfg.max_inflight_bytes
        self._inflight_bytes = 0
        self._bytes_freed = asyncio.Event()
        self._poll = Backoff(cfg.task_check_interval / 8, cfg.task_check_interval)
        self._wakeup = wakeup
        self._defer_write = defer_write
        self._on_burst_done = on_burst_done
        self._fetching = True
        self._fetch_errors = RateLimiter(3.0)
        self._write_errors = RateLimiter(3.0)
        # Outcome writes share the client's connection pool with the fetches, the
        # heartbeat and the handlers; bounding them keeps a high concurrency from
        # exhausting the pool (redis-py raises instead of waiting).
        self._write_slots = asyncio.Semaphore(write_limit)
        self._acks = _AckBatcher(deps.broker, self._write_slots, self._spawn)
        self._notifier = notifier  # wakes result waiters
        self._backoff = Backoff(0.05, 1.0)
        self._limiter = anyio.CapacityLimiter(cfg.sync_concurrency)
        self._debug = is_debug_enabled(self.log)
        self._burst = cfg.burst
        self._group: asyncio.TaskGroup | None = None
        self._context = contextvars.copy_context()  # run() takes its own
        self._idle = asyncio.Event()  # no TaskGroup running: run() has returned
        self._idle.set()
        self._abandon_wait = 1.0  # what an abandoned task's handler gets to return
        self.orphans: set[asyncio.Task[None]] = set()
        """Handlers that ignored their cancellation past the grace: their failure is written
        and their slot freed; they run on, not awaited by anything (shutdown included)."""

    # -- control, called by the server and the other roles --------------------------------

    def stop_fetching(self) -> None:
        """Stop taking new tasks (SIGTSTP / ``Server.stop``); running ones continue."""
        first = self._fetching
        self._fetching = False
        self.request_stop()
        self._wakeup.set()
        self._bytes_freed.set()
        self.slots.close()
        if first and self._waiting_in:
            # The credit expires on its own (DELIVERY_TTL) if the group is gone already.
            self._spawn_late(self._disarm())

    async def drain(self, grace: float, *, force: asyncio.Event | None = None) -> None:
        """Shutdown: wait up to *grace* seconds for running handlers, then requeue and cancel them.

        Once *force* is set (a second signal) the wait ends and nothing more is
        requeued: handlers are cancelled at once and their tasks come back
        through lease recovery.
        """
        self.stop_fetching()
        force = force or asyncio.Event()
        if not force.is_set():
            if self.active:
                self.log.info("waiting for running tasks", count=len(self.active), timeout=grace)
            # A fetch in flight holds its slots until its tasks are started; every slot
            # free means no fetch in flight and no handler running.
            await _wait_either(self.slots.wait(), force, grace)
        forced = force.is_set()
        self._abandon_wait = 0.1 if forced else 1.0
        for active in [a for a in self.active.values() if a.state in ("starting", "running")]:
            if active.state not in ("starting", "running"):
                continue  # it returned while an earlier task was being requeued
            active.abandoned = True
            fields = task_fields(active.msg)
            if forced:
                self.log.warning("abandoning task; it is recovered after its lease", **fields)
            elif active.lease.valid():
                self.log.info("quitting worker; requeueing task", **fields)
                try:
                    await self.broker.requeue(active.msg)
                    self.stats.requeued += 1
                except Exception as exc:  # Redis errors, or a message the broker refuses
                    self.log.error(
                        "could not requeue task; it is recovered after its lease expires",
                        error=error_text(exc),
                        **fields,
                    )
            else:
                self.log.warning("task lease expired during shutdown; not requeued", **fields)
            active.stop_abandoned()
        # The group's exit waits for every task's coroutine: outcomes being written get
        # a moment to finish; handlers that ignore their cancellation are left as orphans.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._abandon_wait + 1.0):
                await self._idle.wait()
        if self.orphans:
            self.log.warning("handlers ignored cancellation; leaving them", count=len(self.orphans))

    # -- the fetch loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """The fetch loop, inside the TaskGroup that owns every task's coroutine and the
        ack and token senders. Leaving the group waits for them; a crash of the fetch loop
        (a bug) stops fetching, lets the running tasks finish, then reaches ``supervise``."""
        sync_limiter.set(self._limiter)
        # Every task's coroutine starts from this context (with the limiter of its sync
        # handlers), whoever starts it: the fetch loop, or the subscriber's delivery.
        self._context = contextvars.copy_context()
        crash: Exception | None = None
        self._idle.clear()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                try:
                    await self._fetch_loop()
                except Exception as exc:
                    crash = exc
        finally:
            self._group = None
            self._idle.set()
        if crash is not None:
            raise crash

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run *coro* (an ack or token call) in the processor's TaskGroup."""
        assert self._group is not None  # only the tasks' coroutines, inside the group, call
        self._group.create_task(coro)

    def _spawn_late(
        self, coro: Coroutine[Any, Any, None], note: DeliveryNote | None = None
    ) -> None:
        """Run *coro* in the group if it still takes tasks: called from outside it (the
        server's stop, the subscriber), possibly after the processor stopped."""
        try:
            if self._group is None:
                raise RuntimeError("the processor is not running")
            self._group.create_task(coro)
        except RuntimeError:  # the group finished, or never ran
            coro.close()
            if note is not None:
                self.log.warning(
                    "task delivered after the processor stopped; it is recovered after its lease",
                    task_id=note.task_id,
                    queue=note.queue,
                )

    async def _fetch_loop(self) -> None:
        stats = self.stats
        order = self._order
        burst = self.config.burst
        strict = self.config.strict_priority
        while self._fetching:
            n = await self.slots.take_all()
            if n == 0:
                continue  # stopped fetching
            if self._inflight_bytes >= self._max_bytes and self.active:
                # The in-flight byte bound is reached: wait for a handler to finish.
                self.slots.release(n)
                self._bytes_freed.clear()
                await self._bytes_freed.wait()
                continue
            self._wakeup.clear()
            self._fetch_in_flight = True
            got: Sequence[DequeuedTask] = ()
            failure: BaseException | None = None
            try:
                fetched = await self.broker.fetch(
                    order(),
                    n,
                    strict=strict,
                    max_bytes=self._max_bytes - self._inflight_bytes,
                    first_free=not self.active,
                    limits=self._limits.for_fetch(),
                )
                got = fetched.tasks
            except REDIS_ERRORS as exc:
                failure = exc
            except BaseException:
                self._fetch_done(n, start=False)  # a restarted loop needs the slots
                raise
            self._fetch_done(n - len(got))
            if failure is not None:
                self._fetch_failed(failure)
                await self._idle_wait(self._backoff.next_delay(), count=False)
                continue
            self._backoff.reset()
            if got:
                self._poll.reset()
                for dequeued in got:
                    self._start(dequeued.message, dequeued.lease_expiry)
                continue
            stats.empty_fetches += 1
            if burst and not self.active:
                # Retries and scheduled tasks due now are work too; the forwarder
                # may not run again before we would exit.
                try:
                    moved = await self.broker.forward_queues(self.queues.names())
                except REDIS_ERRORS as exc:
                    self._fetch_failed(exc)
                    await self._idle_wait(self._backoff.next_delay(), count=False)
                    continue
                if moved:
                    stats.forwarded += moved
                    continue
                self.log.info("burst mode: queues are empty, shutting down")
                self._fetching = False
                self._on_burst_done()
                return
            if self._wakeup.delivery:
                await self._arm()
            delay = self._wakeup.idle_delay(self._poll.next_delay(), held=bool(fetched.held))
            await self._idle_wait(delay, count=True)

    def _order(self) -> list[str]:
        """This fetch's queue order, rebuilt when the served queues changed (patterns)."""
        served = self.queues
        if served.version != self._order_version:
            self._order_version = served.version
            self._queue_order = (
                QueueOrder(
                    served.priorities, strict=self.config.strict_priority, weights=served.weights
                )
                if len(served)
                else None  # only patterns, matching nothing yet
            )
        return [] if self._queue_order is None else self._queue_order()

    def _fetch_failed(self, exc: BaseException) -> None:
        self.stats.fetch_errors += 1
        if self._fetch_errors.allow():
            self.log.error(
                "could not dequeue tasks",
                error=error_text(exc),
                suppressed_since_last=self._fetch_errors.take_suppressed(),
            )

    async def _idle_wait(self, seconds: float, *, count: bool) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._wakeup.wait()
        except TimeoutError:
            if count:
                self.stats.idle_timeouts += 1
            return
        if count and self._fetching:
            self.stats.wakeups += 1
            if self._debug:
                self.log.debug("woken up: a queue has work")

    # -- direct delivery (see asyncq._broker.delivery) -----------------------------------------

    def _delivery_queues(self) -> list[str]:
        """The served queues a task may be delivered from: those without a limit or a rate here
        (the dequeue script applies those; a stored limit stops the delivery in Redis)."""
        limited = self._limits.for_fetch() or {}
        return [q for q in self.queues.names() if q not in limited]

    async def _arm(self) -> None:
        """Ask Redis for the next task of our queues to be delivered to us: after each
        task delivered (the credit is used up), else after an empty fetch at most every third of
        :data:`DELIVERY_TTL` (which keeps the credit alive). Writes this server into the
        queues' waiters lists when the queues changed, every :data:`REGISTER_EVERY`
        seconds (a ``queue rm`` or FLUSHALL drops the lists), or once the credit expired.
        Nothing while every slot is taken: the next empty fetch asks."""
        now = self.clock()
        if not self._spent and now < self._armed_at + DELIVERY_TTL / 3:
            return
        queues = self._delivery_queues()
        if not queues or self._burst or self.slots.free <= 0:
            return
        self._armed_at, self._spent = now, False
        version, when = self._registered
        fresh = version == self.queues.version and now < when + REGISTER_EVERY
        try:
            if not fresh or not await self.broker.arm_delivery(self._server_id, DELIVERY_TTL):
                self._waiting_in.update(queues)
                await self.broker.arm_delivery(self._server_id, DELIVERY_TTL, queues)
                self._registered = (self.queues.version, now)
        except REDIS_ERRORS as exc:
            self._spent = True  # the credit is unknown: ask again after the next empty fetch
            if self._arm_errors.allow():
                self.log.warning(
                    "could not ask for direct delivery; tasks are fetched instead",
                    error=error_text(exc),
                    suppressed_since_last=self._arm_errors.take_suppressed(),
                )

    async def _disarm(self) -> None:
        try:
            await self.broker.disarm_delivery(self._server_id, sorted(self._waiting_in))
        except REDIS_ERRORS as exc:  # the credit expires on its own
            self.log.info("could not withdraw from direct delivery", error=error_text(exc))

    def receive_delivery(self, note: bytes) -> None:
        """A task delivered to this server by an enqueue (the subscriber calls this): it is
        active in Redis, leased to us, and starts here without a fetch."""
        try:
            parsed = parse_note(note)
        except ValueError as exc:
            self.log.error(
                "unreadable delivery; the task is recovered when its lease expires",
                error=error_text(exc),
            )
            return
        msg = delivered_message(parsed)
        if msg is None:
            self._spawn_late(self._reject_delivered(parsed), parsed)
            return
        self.stats.delivered += 1
        self._spent = True
        if self._fetch_in_flight and self._fetching and not self.slots.free:
            # An idle processor's fetch (a poll, a wake-up) holds the free slots for a round
            # trip: the task waits for it rather than going back to pending to be fetched.
            self._held.append((msg, parsed))
        else:
            self._start_delivered(msg, parsed)

    def _start_delivered(self, msg: TaskMessage, note: DeliveryNote) -> None:
        # Started in this turn of the loop: the handler runs next turn.
        if self._fetching and self.slots.try_take():
            self._start(msg, note.lease_expiry)
            self._spawn(self._arm())
        else:  # no slot (all taken, or we are stopping): back to pending
            self._spawn_late(self._requeue_delivered(msg), note)

    def _fetch_done(self, unused: int, *, start: bool = True) -> None:
        """The fetch gives back the *unused* slots it held; the tasks delivered meanwhile
        start in them, or go back to pending when none is left or *start* is False (the
        fetch loop is being torn down)."""
        self._fetch_in_flight = False
        self.slots.release(unused)
        held, self._held = self._held, []
        for msg, note in held:
            if start:
                self._start_delivered(msg, note)
            else:
                self._spawn_late(self._requeue_delivered(msg), note)

    async def _reject_delivered(self, note: DeliveryNote) -> None:
        try:
            await self.broker.reject_delivered(note)  # archived and logged by the broker
        except REDIS_ERRORS as exc:  # the task stays active; its lease expires
            self._fetch_failed(exc)

    async def _requeue_delivered(self, msg: TaskMessage) -> None:
        try:
            await self.broker.requeue(msg)
        except REDIS_ERRORS as exc:
            self.log.error(
                "could not requeue a delivered task; it is recovered after its lease expires",
                error=error_text(exc),
                **task_fields(msg),
            )
        self._wakeup.set()

    # -- the life of one task ----------------------------------------------------------------

    def _start(self, msg: TaskMessage, lease_expiry: float) -> None:
        now = self.clock()
        # Redis holds the lease in whole seconds (truncated): never trust it for longer.
        lease = Lease(math.floor(lease_expiry), clock=self.clock)
        active = ActiveTask(msg, lease, compute_deadline(msg, now), now)
        lease.on_expired = partial(self._lease_lost, active)
        self._inflight_bytes += len(msg.payload)
        if msg.id in self.active:
            # The same ID twice means a stale lease was recovered while we still ran it;
            # keep tracking the newest run (the older one can no longer write).
            self.log.warning("task is already running on this server", **task_fields(msg))
        self.active[msg.id] = active
        self._limits.started(msg.queue)
        assert self._group is not None  # the fetch loop runs inside run()'s group
        active.task = self._group.create_task(self._run_task(active), context=self._context.copy())
        if self._debug:
            self.log.debug("task started", **task_fields(msg))

    async def _run_task(self, active: ActiveTask) -> None:
        """One task's life: run the handler until the first of {it returns, its deadline, a
        cancel request, the loss of its lease} (the last three cancel this coroutine's task,
        through :meth:`ActiveTask.cancel`), write the outcome, free the slot its fetch took."""
        task = Task._from_message(active.msg)
        task._deadline_ts = active.deadline
        task.result_writer = TaskResultWriter(self.broker, active)
        exc: BaseException | None = None
        limited: timedelta | None = None  # its type's rate had no token: put back unrun
        began = 0.0  # when the handler was called (0: it was not)
        returned = False  # the handler returned (did not raise or swallow a stop)
        try:
            now = self.clock()
            if active.cancel_exc is None and now >= active.deadline:
                active.cancel_exc = DeadlineExceededError()
            if active.cancel_exc is None and not active.abandoned:  # else stopped unstarted
                active.state = "running"
                loop = asyncio.get_running_loop()
                when = loop.time() + active.deadline - now
                deadline = loop.call_at(when, active.deadline_exceeded)
                try:
                    rate = self._type_rates.get(active.msg.type) if self._type_rates else None
                    if rate is not None:
                        limited = await self._type_token(active, rate)
                    if limited is None:
                        began = now if rate is None else self.clock()
                        handler = self.handler(task)
                        if self._progress is not None:
                            self._progress.begin(task)
                        swallowed = await _until_swallowed(
                            handler, active.stop_requested, partial(self._grace, active)
                        )
                        returned = swallowed is None
                        if swallowed is not None:
                            await self._outlive(active, swallowed)
                except asyncio.CancelledError as err:
                    if active.cancel_exc is None:
                        if _cancelled_from_outside():
                            raise  # loop shutdown: write nothing
                        exc = err  # raised by the handler's own code: a failure
                except BaseException as err:  # SystemExit & co. from a handler: a failure too
                    exc = err
                finally:
                    deadline.cancel()
                    if began:
                        if self._history is not None:
                            active.ran = (began, self.clock())
                        if self._progress is not None:
                            self._progress.end(task, returned and active.cancel_exc is None)
            active.state = "writing"  # from here on a cancel request changes nothing
            if active.cancel_exc is not None:  # a done context wins over what the handler did
                _uncancel()
                exc, limited = active.cancel_exc, None
            if active.abandoned:
                return  # shutdown requeued it, or left it to recovery
            if limited is not None:
                await self._type_limited(active, limited)
            elif exc is None:
                self.stats.succeeded += 1
                await self._finish(active, None)
            else:
                await self._failed(active, task, exc)
        except Exception as bug:  # one task's bookkeeping must not stop the others'
            self.log.error("task bookkeeping failed", exc_info=bug, **task_fields(active.msg))
        finally:
            self._release(active)

    def _grace(self, active: ActiveTask) -> float:
        """How long a stopped handler may take to return before it is left behind."""
        return self._abandon_wait if active.abandoned else registry.CANCEL_GRACE

    async def _outlive(self, active: ActiveTask, rest: tuple[_Steps, Any]) -> None:
        """The handler ignored its cancellation past its grace: it goes on in a task of
        its own, as an orphan, and the caller writes its failure."""
        orphan = asyncio.get_running_loop().create_task(_run(rest))
        if not orphan.done():
            self._orphan(active, orphan, self._grace(active))

    def _orphan(self, active: ActiveTask, orphan: asyncio.Task[None], grace: float) -> None:
        self.orphans.add(orphan)
        orphan.add_done_callback(self.orphans.discard)
        self.log.error(
            "handler ignored its cancellation; freeing its slot (the handler goes on in the "
            "background, its return writes nothing)",
            grace=grace, error=error_text(active.cancel_exc or TaskCanceledError()),
            **task_fields(active.msg),
        )  # fmt: skip

    def _lease_lost(self, active: ActiveTask) -> None:
        """The heartbeater declared the task's lease expired: stop its handler."""
        if active.cancel(LeaseExpiredError()) and self._debug:
            self.log.debug("lease expired; cancelling handler", **task_fields(active.msg))

    def _release(self, active: ActiveTask) -> None:
        """Give the task's slot back and forget it."""
        active.state = "finished"
        # The active task, its lease's callback and its asyncio task refer to one another:
        # cut the cycles, so that reference counting frees them now instead of the cyclic
        # garbage collector later (which cost a quarter of the worker's CPU per task).
        active.lease.on_expired = None
        active.task = None
        self._inflight_bytes -= len(active.msg.payload)
        self._bytes_freed.set()
        self._limits.finished(active.msg.queue)
        if self._limits.is_local_limited(active.msg.queue):
            self._wakeup.set()  # room under this server's limit for the queue: fetch again
        if self.active.get(active.msg.id) is active:
            del self.active[active.msg.id]
            if not self.active and self._burst:
                self._wakeup.set()  # re-check the queues now: maybe time to exit
        self.slots.release()

    async def _failed(self, active: ActiveTask, task: Task, exc: BaseException) -> None:
        msg = active.msg
        fields = task_fields(msg)
        limited = _rate_limited(exc)
        if limited is not None:
            # Not a failure: no count, no error handler.
            self.log.info(
                "task rate limited; rescheduled", retry_in=str(limited.retry_in), **fields
            )
        else:
            self._report_failure(msg, exc, fields)
            if self.config.error_handler is not None:
                await self._call_error_handler(task, exc, fields)
        await self._finish(active, exc, task)

    def _report_failure(self, msg: TaskMessage, exc: BaseException, fields: dict[str, Any]) -> None:
        stats = self.stats
        if wraps_error(exc, RevokeTask):
            stats.succeeded += 1
            self.log.info("task revoked", **fields)
        elif isinstance(exc, LeaseExpiredError):
            stats.failed += 1
            self._hooks.lease_expired(msg.queue, msg.type)
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

    async def _finish(
        self, active: ActiveTask, exc: BaseException | None, task: Task | None = None
    ) -> None:
        """Decide the attempt's outcome (:func:`~asyncq._worker.outcome.decide`) and write it."""
        msg = active.msg
        lease: LeaseState = "held" if active.lease.valid() else "expired"
        outcome = decide(
            msg, exc, lease=lease, config=self.config, now=self.clock(), task=task, log=self.log
        )
        kind = outcome.kind
        retried = kind == "retry" and _rate_limited(exc) is None  # a rate limit is no retry
        history = self._history
        if history is not None and active.ran is not None:
            began, ended = active.ran
            failed = exc is not None
            history.record(msg.queue, msg.type, began, ended, failed, retried, kind == "archive")
        self._hooks.task_finished(msg.queue, msg.type, msg.id, kind, error=outcome.err_msg, exc=exc)
        if kind == "lost":
            self._lost(msg, exc)
            return
        if kind == "archive":
            self.log.warning("task archived", error=outcome.err_msg, **task_fields(msg))
            self._hooks.task_archived(msg.queue, msg.type)
        elif retried:
            self._hooks.task_retried(msg.queue, msg.type)
        await self._write_outcome(active, outcome)

    def _lost(self, msg: TaskMessage, exc: BaseException | None) -> None:
        """The local lease ran out: nothing is written, the recoverer owns the task."""
        fields = task_fields(msg)
        if exc is None:
            self._hooks.lease_expired(msg.queue, msg.type)
            self.log.warning(
                "task finished after its lease expired; not writing its outcome, the recoverer "
                "will retry it",
                **fields,
            )
        elif not isinstance(exc, LeaseExpiredError):  # that one was reported already
            if _rate_limited(exc) is None:
                self._hooks.lease_expired(msg.queue, msg.type)
            self.log.warning(
                "task lease expired; not writing its outcome, the recoverer will retry it",
                **fields,
            )

    async def _write_outcome(self, active: ActiveTask, outcome: Outcome) -> None:
        """Write *outcome*; a write Redis could not take goes to the syncer."""
        msg = active.msg
        broker = self.broker
        kind = outcome.kind
        write: Callable[[], Awaitable[None]]
        if kind in ("done", "complete"):
            complete = kind == "complete"
            # A workflow step's batched acknowledgement includes its workflow's hand-off.
            error = await self._acks.ack(msg, complete)
            if error is not None:
                # Handled as a failed single write: the syncer retries it with done(),
                # mark_as_complete() or the step's acknowledgement when Redis was unreachable.
                def ack() -> Awaitable[None]:
                    return broker.mark_as_complete(msg) if complete else broker.done(msg)

                write = self._workflow_ack(msg, outcome.ack_mode) if outcome.workflow else ack
                self._write_failed(active, write, "done", error)
                return
            if self._debug:
                self.log.debug("task done", **task_fields(msg))
        elif outcome.workflow:  # acknowledged together with the workflow's hand-off
            write = self._workflow_ack(msg, outcome.ack_mode, outcome.err_msg)
            await self._write(active, write, "archive" if kind == "archive" else "done")
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
        if kind in ("complete", "archive"):
            self._notifier.notify(msg.queue, msg.id)  # wakes result waiters

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
            if self._write_errors.allow():
                self.log.warning(
                    "could not take a token of the task type's rate limit; rescheduling the task",
                    error=error_text(exc),
                    suppressed_since_last=self._write_errors.take_suppressed(),
                    **task_fields(msg),
                )  # fmt: skip
            return timedelta(seconds=1)
        if not granted:
            return timedelta(microseconds=wait_us)
        if wait_us > 0:
            # The token is ours from now + wait on: the handler must not start earlier.
            await asyncio.sleep(wait_us / 1_000_000)
        return None

    async def _type_limited(self, active: ActiveTask, retry_in: timedelta) -> None:
        """No token for the task's type: back to the retry set, unrun, no retry used."""
        msg = active.msg
        self.stats.type_rate_limited += 1
        rate = self._type_rates.get(msg.type)
        if self._debug:
            self.log.debug(
                "task type over its rate limit; rescheduled",
                rate=str(rate), retry_in=str(retry_in), **task_fields(msg),
            )  # fmt: skip
        if not active.lease.valid():
            return  # the recoverer takes it over
        err_msg = f"asyncq: rate limit of task type {msg.type!r} ({rate}) reached; not run"
        await self._write_outcome(active, not_run(self.clock(), retry_in, err_msg))

    def _workflow_ack(
        self, msg: TaskMessage, mode: AckMode, err_msg: str = ""
    ) -> Callable[[], Awaitable[None]]:
        """The write acknowledging a workflow step together with its hand-off."""

        async def write() -> None:
            state = await self.broker.ack_workflow_step(msg, mode, err_msg)
            if self._debug:
                self.log.debug(
                    "workflow step acknowledged", workflow_state=state, **task_fields(msg)
                )

        return write

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
            async with self._write_slots:
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
            self._defer_write(write, deadline=active.lease.expires_at, what=what, msg=msg)
            if self._write_errors.allow():
                self.log.warning(
                    "could not write task outcome; the syncer will retry it",
                    outcome=what, error=error_text(exc),
                    suppressed_since_last=self._write_errors.take_suppressed(),
                    **task_fields(msg),
                )  # fmt: skip
        else:
            self.log.error(
                "task outcome rejected by Redis",
                outcome=what, error=error_text(exc), **task_fields(msg),
            )  # fmt: skip

    async def cleanup(self) -> None:
        self.slots.close()
        await self._notifier.aclose()


class _AckBatcher:
    """Coalesces the successes finished in one event-loop turn into one ``ack_many`` call.

    Workflow steps' successes included: the broker acknowledges each with its
    workflow's bookkeeping and hand-off in the same script call.

    Each worker still waits for its own acknowledgement (its slot and lease are
    held until the task is written), so the semantics are those of one
    Done/MarkAsComplete per task, at a fraction of the round trips under load.
    """

    __slots__ = ("_broker", "_pending", "_slots", "_spawn")

    def __init__(self, broker: WorkerBroker, slots: asyncio.Semaphore, spawn: _Spawn) -> None:
        self._broker = broker
        self._slots = slots
        self._spawn = spawn  # into the processor's TaskGroup, so shutdown waits for the calls
        self._pending: list[tuple[TaskMessage, bool, asyncio.Future[BaseException | None]]] = []

    def ack(self, msg: TaskMessage, complete: bool) -> asyncio.Future[BaseException | None]:
        """A future resolving to None when acknowledged, or to the task's error."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[BaseException | None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((msg, complete, fut))
        return fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            self._spawn(self._send(batch))

    async def _send(
        self, batch: list[tuple[TaskMessage, bool, asyncio.Future[BaseException | None]]]
    ) -> None:
        try:
            async with self._slots:
                results: Sequence[BaseException | None] = await self._broker.ack_many(
                    [(msg, complete) for msg, complete, _ in batch]
                )
        except Exception as exc:  # e.g. connection lost: every task of the batch gets it
            results = [exc] * len(batch)
        except BaseException:
            for _, _, fut in batch:
                fut.cancel()
            raise
        for (_, _, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)


class _TypeTokens:
    """Coalesces the token requests of one event-loop turn into one script call per type.

    The tasks of one fetch start in the same turn and each asks for a token
    before its handler, so a fetch of 50 tasks of a rate-limited type costs one
    call, not 50. The first requests get the tokens taken, in order; the rest
    get "no token" with the wait until the next one.
    """

    __slots__ = ("_broker", "_pending", "_spawn")

    def __init__(self, broker: WorkerBroker, spawn: _Spawn) -> None:
        self._broker = broker
        self._spawn = spawn
        self._pending: dict[str, tuple[Rate, list[asyncio.Future[tuple[bool, int]]]]] = {}

    def take(self, task_type: str, rate: Rate) -> asyncio.Future[tuple[bool, int]]:
        """A future resolving to ``(True, wait µs)`` for a token or ``(False, wait µs)``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[bool, int]] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        entry = self._pending.get(task_type)
        if entry is None:
            entry = self._pending[task_type] = (rate, [])
        entry[1].append(fut)
        return fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, {}
        for task_type, (rate, futs) in batch.items():
            self._spawn(self._send(task_type, rate, futs))

    async def _send(
        self, task_type: str, rate: Rate, futs: list[asyncio.Future[tuple[bool, int]]]
    ) -> None:
        try:
            waits, next_wait = await self._broker.take_type_tokens(
                task_type,
                len(futs),
                interval_us=rate.interval_us,
                burst=rate.burst,
                max_wait_us=TYPE_RATE_MAX_WAIT_US,
            )
        except Exception as exc:  # e.g. connection lost: every request of the batch gets it
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException:
            for fut in futs:
                fut.cancel()
            raise
        for i, fut in enumerate(futs):
            if not fut.done():  # a cancelled waiter's token is lost: the rate only errs low
                fut.set_result((True, waits[i]) if i < len(waits) else (False, next_wait))


def write_limit(redis: object) -> int:
    """Outcome writes in flight at once for the connection pool of *redis*."""
    pool = getattr(redis, "connection_pool", None)
    size = getattr(pool, "max_connections", None)
    if isinstance(size, int) and size > 0:
        return max(1, min(_MAX_WRITES, size // 2))
    return _MAX_WRITES


async def _wait_either(
    done: Coroutine[Any, Any, None], other: asyncio.Event, seconds: float
) -> None:
    """Wait until *done* returns or *other* is set, at most *seconds*."""
    if other.is_set():
        done.close()
        return
    waiters = {asyncio.ensure_future(done), asyncio.ensure_future(other.wait())}
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
