"""The processor role: fetches tasks and runs their handlers (asynq's processor).

* A semaphore of ``concurrency`` slots bounds the running handlers. Each fetch
  takes every free slot and asks the broker for that many tasks in one script
  call (``dequeue_many``), each with its own lease.
* Queue order per fetch: weighted and shuffled (priorities divided by their GCD,
  each queue repeated ``priority`` times, Fisher-Yates shuffled, de-duplicated),
  or fixed by priority with ``strict_priority``. Paused queues look empty.
* Idle wait: asynq sleeps 0.5-1.5 s when every queue is empty. Here the
  processor clears a wake-up event before each fetch and, after an empty one,
  waits on it for at most ``task_check_interval``. The subscriber sets the event
  when an asyncq client publishes on a queue's wake-up channel, so an idle
  worker starts a task within milliseconds; tasks enqueued by Go asynq (no
  wake-up) are still picked up within ``task_check_interval``.
* Each handler runs in one asyncio task and is cancelled at min(timeout,
  deadline) (spec 5.7), on a cancel message, or when its lease expires. Its
  outcome is written exactly as asynq's (spec 5.3/5.4) unless the local lease
  has expired, in which case nothing is written and the recoverer takes over.
  A handler that swallows its cancellation and has not returned 5 s later is
  left running in the background: its failure is written and its slot freed
  then (asynq does not wait for a handler that ignores its context either).
  Successes finished in the same event-loop turn are acknowledged together
  (one ``ack_many`` script call per queue); each worker still waits for its
  own acknowledgement. Writes that fail because Redis is unreachable are
  handed to the syncer.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import TYPE_CHECKING, Any, ClassVar

import anyio

from asyncq._logging import Backoff, RateLimiter, error_text, is_debug_enabled, task_fields
from asyncq._worker.lease import Lease
from asyncq._worker.roles import REDIS_ERRORS, Role, is_transient
from asyncq.errors import (
    DeadlineExceededError,
    LeaseExpiredError,
    RevokeTask,
    SkipRetry,
    TaskCanceledError,
)
from asyncq.mux import Handler, sync_limiter
from asyncq.proto.asynq import TaskMessage
from asyncq.result import TaskResultWriter
from asyncq.results import CompletionNotifier
from asyncq.task import Task

if TYPE_CHECKING:
    from asyncq._broker import Broker, DequeuedTask
    from asyncq.server import Server, ServerConfig

__all__ = [
    "DEFAULT_TIMEOUT",
    "Processor",
    "QueueOrder",
    "compute_deadline",
    "default_retry_delay",
    "is_failure_for",
    "normalize_queues",
    "retry_delay_for",
    "wraps_error",
]

_MAX_WRITES = 64

_CANCEL_GRACE = 5.0
"""Seconds a cancelled handler (deadline, cancel message, lease expiry) has to return before
its failure is written anyway and its slot freed; it may go on in the background, as a Go
handler ignoring its context does in asynq."""

_MAX_DELAY = timedelta(microseconds=(2**63 - 1) // 1000)
"""The longest retry delay: Go's largest time.Duration (about 292 years)."""


DEFAULT_TIMEOUT = 1800.0
"""Seconds a task may run when its message has neither timeout nor deadline (asynq's 30 min)."""


# -- pure helpers (unit-tested on their own) ------------------------------------------------


def default_retry_delay(n: int, exc: BaseException, task: Task) -> timedelta:
    """asynq's DefaultRetryDelayFunc: n**4 + 15 + rand(30) * (n + 1) seconds (sidekiq's)."""
    return timedelta(seconds=n**4 + 15 + random.randrange(30) * (n + 1))


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

    __slots__ = ("_expanded", "_fixed", "_rng")

    def __init__(
        self,
        queues: Mapping[str, int],
        *,
        strict: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        if not queues:
            raise ValueError("at least one queue is needed")
        normalized = normalize_queues(queues)
        self._rng = rng or random.Random()
        self._fixed: list[str] | None = None
        self._expanded: list[str] = []
        if len(normalized) == 1:
            self._fixed = list(normalized)
        elif strict:
            # Sorted by priority, highest first; equal priorities by name so the
            # order is stable (asynq's sort is not, which only makes ties random).
            self._fixed = sorted(normalized, key=lambda q: (-normalized[q], q))
        else:
            for name, prio in normalized.items():
                self._expanded.extend([name] * prio)

    def __call__(self) -> list[str]:
        if self._fixed is not None:
            return self._fixed
        names = self._expanded[:]
        self._rng.shuffle(names)  # Fisher-Yates
        return list(dict.fromkeys(names))


def retry_delay_for(
    cfg: ServerConfig, log: Any, n: int, exc: BaseException, task: Task, **fields: Any
) -> timedelta:
    """The configured retry delay; asynq's default when the function raises or misbehaves."""
    try:
        delay = cfg.retry_delay(n, exc, task)
        if not isinstance(delay, timedelta):
            raise TypeError(f"retry_delay must return a timedelta, got {delay.__class__.__name__}")
    except Exception as err:
        log.error("retry_delay raised; using the default delay", exc_info=err, **fields)
        return default_retry_delay(n, exc, task)
    return min(max(delay, timedelta(0)), _MAX_DELAY)


def is_failure_for(cfg: ServerConfig, log: Any, exc: BaseException, **fields: Any) -> bool:
    """The configured ``is_failure`` verdict; True (a failure) when the function raises."""
    try:
        return bool(cfg.is_failure(exc))
    except Exception as err:
        log.error("is_failure raised; counting a failure", exc_info=err, **fields)
        return True


def wraps_error(exc: BaseException, kind: type[BaseException]) -> bool:
    """True when *exc* is, or wraps (cause chain, exception groups), a *kind* error.

    The Python reading of Go's ``errors.Is``: ``raise X from SkipRetry()`` and an
    ExceptionGroup containing RevokeTask both count.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        err = stack.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, kind):
            return True
        if isinstance(err, BaseExceptionGroup):
            stack.extend(err.exceptions)
        if err.__cause__ is not None:
            stack.append(err.__cause__)
    return False


# -- the running task ----------------------------------------------------------------------

_RUNNING = 0
_WRITING = 1
_FINISHED = 2


class ActiveTask:
    """A task this server is running: message, lease, deadline and its asyncio task."""

    __slots__ = (
        "abandoned",
        "cancel_exc",
        "deadline",
        "detached",
        "entered",
        "grace",
        "job",
        "lease",
        "msg",
        "on_stuck",
        "phase",
        "released",
        "started",
        "task",
        "timer",
    )

    def __init__(self, msg: TaskMessage, lease: Lease, deadline: float, started: float) -> None:
        self.msg = msg
        self.lease = lease
        self.deadline = deadline
        self.started = started
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.phase = _RUNNING
        self.cancel_exc: BaseException | None = None
        self.abandoned = False  # requeued or dropped at shutdown: write nothing more
        # The asyncio task has run its first step. Cancelling a task before that
        # throws into a coroutine that never ran: its finally (slot, bookkeeping)
        # would never run either, so such a task only gets cancel_exc.
        self.entered = False
        self.job: Task | None = None  # the handler's Task, for a detached failure write
        self.on_stuck: Callable[[ActiveTask], object] | None = None
        self.grace: asyncio.TimerHandle | None = None
        self.detached = False  # failed without the handler: its return writes nothing
        self.released = False  # slot and bookkeeping given back

    # TaskContext protocol (result writer)
    @property
    def task_id(self) -> str:
        return self.msg.id

    @property
    def queue(self) -> str:
        return self.msg.queue

    def done_reason(self) -> str | None:
        if self.cancel_exc is not None:
            return str(self.cancel_exc)
        if self.phase != _RUNNING or self.abandoned:
            return "the task's handler has returned"
        if not self.lease.valid():
            return str(LeaseExpiredError())
        if time.time() >= self.deadline:
            return str(DeadlineExceededError())
        return None

    def deadline_exceeded(self) -> None:
        self.cancel(DeadlineExceededError())

    def cancel(self, exc: BaseException) -> bool:
        """Cancel the handler with *exc* as the failure; False if it is not running."""
        if self.phase != _RUNNING or self.cancel_exc is not None or self.task is None:
            return False
        self.cancel_exc = exc
        if self.entered:
            self.task.cancel()
        if self.on_stuck is not None:
            self.grace = asyncio.get_running_loop().call_later(_CANCEL_GRACE, self.on_stuck, self)
        return True

    def stop_abandoned(self) -> None:
        """Shutdown: cancel the handler of an abandoned task (it writes nothing more)."""
        if self.task is not None and not self.task.done():
            self.cancel_exc = asyncio.CancelledError()
            if self.entered:
                self.task.cancel()


# -- the role --------------------------------------------------------------------------------


class Processor(Role):
    """Fetches tasks and runs them; see the module docstring."""

    name: ClassVar[str] = "processor"

    def __init__(self, server: Server, handler: Handler) -> None:
        super().__init__(server)
        cfg = server.config
        self.handler = handler
        self.broker = server.broker
        self.clock: Callable[[], float] = server.broker.clock
        self.active: dict[str, ActiveTask] = {}
        self._queue_order = QueueOrder(cfg.queues, strict=cfg.strict_priority)
        self._free = cfg.concurrency
        self._slot_freed = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._fetching = True
        self._fetch_errors = RateLimiter(3.0)
        self._write_errors = RateLimiter(3.0)
        # Outcome writes share the client's connection pool with the fetches, the
        # heartbeat and the handlers; bounding them keeps a high concurrency from
        # exhausting the pool (redis-py raises instead of waiting).
        self._write_slots = asyncio.Semaphore(_write_limit(server.redis))
        self._acks = _AckBatcher(server.broker, self._write_slots)
        self._notifier = CompletionNotifier(server.redis)  # wakes result waiters
        self._backoff = Backoff(0.05, 1.0)
        self._limiter = anyio.CapacityLimiter(cfg.sync_concurrency)
        self._debug = is_debug_enabled(self.log)
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_done = asyncio.Event()
        self._loop_done.set()
        self._burst = cfg.burst
        self._detached: set[asyncio.Task[None]] = set()

    # -- control, called by the server and the other roles --------------------------------

    def wakeup(self) -> None:
        """A queue may have work (wake-up message, forwarder): end the idle wait now."""
        self._wakeup.set()

    def stop_fetching(self) -> None:
        """Stop taking new tasks (SIGTSTP / ``Server.stop``); running ones continue."""
        self._fetching = False
        self.request_stop()
        self._wakeup.set()
        self._slot_freed.set()

    def cancel_task(self, task_id: str) -> bool:
        """Cancel the running handler of *task_id* (cancel channel); False if not running here."""
        active = self.active.get(task_id)
        if active is None:
            return False
        if active.cancel(TaskCanceledError()):
            self.log.info("task canceled", **task_fields(active.msg))
            return True
        return False

    async def drain(self, grace: float, *, force: asyncio.Event | None = None) -> None:
        """Shutdown: wait up to *grace* seconds for running handlers, then requeue and cancel them.

        Once *force* is set (a second signal) the wait ends and nothing more is
        requeued: handlers are cancelled at once and their tasks come back
        through lease recovery.
        """
        self.stop_fetching()
        force = force or asyncio.Event()
        deadline = time.monotonic() + grace
        if not force.is_set():
            # A fetch in flight may still hand over tasks: they are started, then waited for.
            await _wait_either(self._loop_done, force, grace)
        if self.active and not force.is_set():
            self.log.info("waiting for running tasks", count=len(self.active), timeout=grace)
            await _wait_either(self._idle, force, max(0.0, deadline - time.monotonic()))
        forced = force.is_set()
        for active in [a for a in self.active.values() if a.phase == _RUNNING]:
            if active.abandoned or active.phase != _RUNNING:
                continue  # it returned while an earlier task was being requeued
            active.abandoned = True
            fields = task_fields(active.msg)
            if forced:
                self.log.warning("abandoning task; it is recovered after its lease", **fields)
            elif active.lease.valid():
                self.log.info("quitting worker; requeueing task", **fields)
                try:
                    await self.broker.requeue(active.msg)
                    self.server.stats.requeued += 1
                except Exception as exc:  # Redis errors, or a message the broker refuses
                    self.log.error(
                        "could not requeue task; it is recovered after its lease expires",
                        error=error_text(exc),
                        **fields,
                    )
            else:
                self.log.warning("task lease expired during shutdown; not requeued", **fields)
            active.stop_abandoned()
        tasks = [a.task for a in self.active.values() if a.task is not None]
        tasks += self._detached
        if tasks:
            # Workers writing an outcome get a moment to finish it; handlers that
            # ignore cancellation are left behind (nothing more is written for them).
            _, still = await asyncio.wait(tasks, timeout=0.1 if forced else 1.0)
            if still:
                self.log.warning("handlers ignored cancellation; leaving them", count=len(still))

    # -- the fetch loop ----------------------------------------------------------------------

    async def run(self) -> None:
        self._loop_done.clear()
        try:
            await self._fetch_loop()
        finally:
            self._loop_done.set()

    async def _fetch_loop(self) -> None:
        sync_limiter.set(self._limiter)  # inherited by every handler task created below
        server = self.server
        stats = server.stats
        broker = self.broker
        order = self._queue_order
        interval = server.config.task_check_interval
        burst = server.config.burst
        while self._fetching:
            if self._free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            n = self._free
            self._free = 0
            self._wakeup.clear()
            try:
                got: Sequence[DequeuedTask] = await broker.dequeue_many(order(), n)
            except REDIS_ERRORS as exc:
                self._free += n
                self._fetch_failed(exc)
                await self._idle_wait(self._backoff.next_delay(), count=False)
                continue
            except BaseException:
                self._free += n  # the slots were never used; a restarted loop needs them
                raise
            self._backoff.reset()
            self._free += n - len(got)
            if got:
                for dequeued in got:
                    self._start(dequeued)
                continue
            stats.empty_fetches += 1
            if burst and not self.active:
                # Retries and scheduled tasks due now are work too; the forwarder
                # may not run again before we would exit.
                try:
                    moved = await broker.forward_if_ready(list(server.config.queues))
                except REDIS_ERRORS as exc:
                    self._fetch_failed(exc)
                    await self._idle_wait(self._backoff.next_delay(), count=False)
                    continue
                if moved:
                    stats.forwarded += moved
                    continue
                self.log.info("burst mode: queues are empty, shutting down")
                self._fetching = False
                server._burst_done()
                return
            await self._idle_wait(interval, count=True)

    def _fetch_failed(self, exc: BaseException) -> None:
        self.server.stats.fetch_errors += 1
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
                self.server.stats.idle_timeouts += 1
            return
        if count and self._fetching:
            self.server.stats.wakeups += 1
            if self._debug:
                self.log.debug("woken up: a queue has work")

    # -- running one task ------------------------------------------------------------------

    def _start(self, dequeued: DequeuedTask) -> None:
        msg = dequeued.message
        now = self.clock()
        deadline = compute_deadline(msg, now)
        # Redis holds the lease in whole seconds (truncated): never trust it for longer.
        lease = Lease(math.floor(dequeued.lease_expiry), clock=self.clock)
        active = ActiveTask(msg, lease, deadline, now)
        active.on_stuck = self._on_stuck
        loop = asyncio.get_running_loop()
        active.task = loop.create_task(self._work(active))
        active.timer = loop.call_at(loop.time() + (deadline - now), active.deadline_exceeded)
        if msg.id in self.active:
            # The same ID twice means a stale lease was recovered while we still ran it;
            # keep tracking the newest run (the older one can no longer write).
            self.log.warning("task is already running on this server", **task_fields(msg))
        self.active[msg.id] = active
        self._idle.clear()
        if self._debug:
            self.log.debug("task started", **task_fields(msg))

    async def _work(self, active: ActiveTask) -> None:
        active.entered = True
        exc: BaseException | None = None
        try:
            task = active.job = Task._from_message(active.msg)
            task._deadline_ts = active.deadline
            task.result_writer = TaskResultWriter(self.broker, active)
            if active.cancel_exc is None and self.clock() >= active.deadline:
                active.cancel_exc = DeadlineExceededError()
            if active.cancel_exc is None:  # else cancelled before its first step
                try:
                    await self.handler(task)
                except asyncio.CancelledError as err:
                    if active.cancel_exc is None:
                        current = asyncio.current_task()
                        if current is not None and current.cancelling():
                            raise  # cancelled from outside (loop shutdown): write nothing
                        exc = err  # raised by the handler's own code: a failure
                except Exception as err:
                    exc = err
            if active.detached:
                return  # its failure was written when it ignored the cancellation
            active.phase = _WRITING
            if active.timer is not None:
                active.timer.cancel()
            current = asyncio.current_task()
            if current is not None:
                while current.cancelling():
                    current.uncancel()
            if active.cancel_exc is not None and not isinstance(
                active.cancel_exc, asyncio.CancelledError
            ):
                exc = active.cancel_exc  # a done context wins over what the handler returned
            if active.abandoned:
                return
            if exc is None:
                await self._succeeded(active)
            else:
                await self._failed(active, task, exc)
        finally:
            if not active.detached:
                active.phase = _FINISHED
                self._release(active)

    def _release(self, active: ActiveTask) -> None:
        """Give the task's slot back and forget it (once, whoever finishes it)."""
        if active.released:
            return
        active.released = True
        if active.timer is not None:
            active.timer.cancel()
        if active.grace is not None:
            active.grace.cancel()
        if self.active.get(active.msg.id) is active:
            del self.active[active.msg.id]
            if not self.active:
                self._idle.set()
                if self._burst:
                    self._wakeup.set()  # re-check the queues now: maybe time to exit
        self._free += 1
        self._slot_freed.set()

    def _on_stuck(self, active: ActiveTask) -> None:
        """The grace after a cancellation ran out and the handler has not returned."""
        if active.phase != _RUNNING or active.abandoned or active.released:
            return
        active.detached = True
        active.phase = _WRITING
        self.log.error(
            "handler ignored its cancellation; writing its failure now and freeing its slot "
            "(the handler goes on in the background)",
            grace=_CANCEL_GRACE, error=error_text(active.cancel_exc or TaskCanceledError()),
            **task_fields(active.msg),
        )  # fmt: skip
        writer = asyncio.get_running_loop().create_task(self._finish_detached(active))
        self._detached.add(writer)
        writer.add_done_callback(self._detached.discard)

    async def _finish_detached(self, active: ActiveTask) -> None:
        try:
            exc = active.cancel_exc
            if active.job is not None and exc is not None:
                await self._failed(active, active.job, exc)
        finally:
            active.phase = _FINISHED
            self._release(active)

    async def _succeeded(self, active: ActiveTask) -> None:
        msg = active.msg
        self.server.stats.succeeded += 1
        if not active.lease.valid():
            self.log.warning(
                "task finished after its lease expired; not writing its outcome, the recoverer "
                "will retry it",
                **task_fields(msg),
            )
            return
        complete = msg.retention > 0
        result = await self._acks.ack(msg, complete)
        if result is not None:
            # Handled as a failed single write: the syncer retries it with done() or
            # mark_as_complete() when Redis was unreachable.
            def write() -> Awaitable[None]:
                return self.broker.mark_as_complete(msg) if complete else self.broker.done(msg)

            self._write_failed(active, write, "done", result)
            return
        if complete:
            self._notifier.notify(msg.queue, msg.id)
        if self._debug:
            self.log.debug("task done", **task_fields(msg))

    async def _failed(self, active: ActiveTask, task: Task, exc: BaseException) -> None:
        msg = active.msg
        cfg = self.server.config
        stats = self.server.stats
        fields = task_fields(msg)
        err_msg = error_text(exc)
        revoke = wraps_error(exc, RevokeTask)
        if revoke:
            stats.succeeded += 1
            self.log.info("task revoked", **fields)
        elif isinstance(exc, LeaseExpiredError):
            stats.failed += 1
            self.log.warning("task lease expired; handler cancelled", **fields)
        else:
            stats.failed += 1
            self.log.warning(
                "task failed", error=err_msg, retried=msg.retried, max_retry=msg.retry, **fields,
                exc_info=exc,
            )  # fmt: skip
        if cfg.error_handler is not None:
            await self._call_error_handler(task, exc, fields)
        if not active.lease.valid():
            if not isinstance(exc, LeaseExpiredError):
                self.log.warning(
                    "task lease expired; not writing its outcome, the recoverer will retry it",
                    **fields,
                )
            return
        if revoke:

            def write() -> Awaitable[None]:
                return self.broker.done(msg)

            await self._write(active, write, "done")
            return
        if msg.retried >= msg.retry or wraps_error(exc, SkipRetry):
            self.log.warning("task archived", error=err_msg, **fields)

            def archive() -> Awaitable[None]:
                return self.broker.archive(msg, err_msg)

            await self._write(active, archive, "archive")
            self._notifier.notify(msg.queue, msg.id)
            return
        delay = retry_delay_for(cfg, self.log, msg.retried, exc, task, **fields)
        is_failure = is_failure_for(cfg, self.log, exc, **fields)
        retry_at = datetime.fromtimestamp(self.clock(), UTC) + delay

        def retry() -> Awaitable[None]:
            return self.broker.retry(msg, retry_at, err_msg, is_failure=is_failure)

        await self._write(active, retry, "retry")

    async def _call_error_handler(
        self, task: Task, exc: BaseException, fields: dict[str, Any]
    ) -> None:
        handler = self.server.config.error_handler
        assert handler is not None
        try:
            result = handler(task, exc)
            if inspect.isawaitable(result):
                await result
        except Exception as err:
            self.log.error("error_handler raised", exc_info=err, **fields)
        except asyncio.CancelledError as err:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # cancelled from outside (loop shutdown)
            # Raised by the error handler's own code: the outcome must still be written.
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
            self.server.syncer.add(write, deadline=active.lease.expires_at, what=what, msg=msg)
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
        self._slot_freed.set()
        await self._notifier.aclose()


class _AckBatcher:
    """Coalesces the successes finished in one event-loop turn into one ``ack_many`` call.

    Each worker still waits for its own acknowledgement (its slot and lease are
    held until the task is written), so the semantics are those of one
    Done/MarkAsComplete per task, at a fraction of the round trips under load.
    """

    __slots__ = ("_broker", "_pending", "_slots")

    def __init__(self, broker: Broker, slots: asyncio.Semaphore) -> None:
        self._broker = broker
        self._slots = slots
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
            asyncio.get_running_loop().create_task(self._send(batch))

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


def _write_limit(redis: object) -> int:
    pool = getattr(redis, "connection_pool", None)
    size = getattr(pool, "max_connections", None)
    if isinstance(size, int) and size > 0:
        return max(1, min(_MAX_WRITES, size // 2))
    return _MAX_WRITES


async def _wait_either(event: asyncio.Event, other: asyncio.Event, seconds: float) -> None:
    """Wait until *event* or *other* is set, at most *seconds*."""
    if event.is_set() or other.is_set():
        return
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(other.wait())}
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
