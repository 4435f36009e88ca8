"""The processor role: fetches tasks and hands them to their coroutines (asynq's processor).

* A :class:`~asyncq._worker.slots.Slots` semaphore of ``concurrency`` slots
  bounds the running handlers. Each fetch takes every free slot up to half
  of them (``take_all``; the next fetch's round trip then overlaps the last
  batch's acknowledgements) and asks for that many tasks from all queues in one script
  call per Redis node (:class:`~asyncq._broker.multiqueue.MultiQueue`), each
  with its own lease; unfilled slots are released at once, each task releases
  its own when it is done. ``max_inflight_bytes`` bounds the payload
  bytes of the running tasks: a fetch stops before it, no fetch runs while it
  is reached, and a single task larger than the bound runs alone.
* Each task fetched, delivered or continued (leased to us by the outcome of the task
  before it and started in that task's slot: a durable run's first step, by the run's
  suspension; the run its step's success woke, by the step's acknowledgement; see
  :meth:`Processor._runs_here`) enters by one door, :meth:`Processor._start`,
  and lives in one coroutine, read top down in :mod:`asyncq._worker.attempt`:
  run the handler until the first of {it returns, its lease expires, a cancel
  request, its deadline}, decide, write, release. The processor tracks these
  coroutines itself (:mod:`asyncq._worker.owned`), as asynq's processor does (a set, not
  ``TaskGroup.create_task``, which is Python code on 3.11: several µs per task),
  and one task of its TaskGroup (``run()``) owns them: it waits for them on the
  way out and cancels them with the group. The ack and type-token calls
  (:mod:`asyncq._worker.batched`) are tasks of the same group, so leaving
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
  and publishes it on the server's delivery channel. The subscriber passes the
  note to :meth:`Processor.receive_delivery`, which reads it into the
  ``DequeuedTask`` a fetch returns and starts it in a free slot through the same
  door (or requeues it when there is none, or the processor is stopping) and
  arms again.
* Shutdown (:meth:`Processor.drain`): stop fetching, wait for the running
  tasks up to the grace, then requeue the rest and stop their handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any, ClassVar

from asyncq._broker.delivery import DeliveryNote, read_note
from asyncq._broker.durable import INLINE_STEPS
from asyncq._logging import Backoff, RateLimiter, error_text, is_debug_enabled, task_fields
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._worker.active import ActiveTask, ActiveTasks
from asyncq._worker.arming import Arming
from asyncq._worker.attempt import Attempts, DeferWrite, Notifier, OutcomeWriter
from asyncq._worker.limits import QueueLimits
from asyncq._worker.owned import OwnedAttempts
from asyncq._worker.roles import Role, RoleDeps
from asyncq._worker.slots import Slots
from asyncq._worker.wakeup import QueueWakeup
from asyncq.history import HistoryRecorder
from asyncq.hooks import NO_HOOKS, WorkerHooks
from asyncq.mux import Handler, SyncThreads, sync_threads
from asyncq.progress import ProgressWriter

if TYPE_CHECKING:
    from asyncq._broker import DequeuedTask

__all__ = ["Processor", "QueueOrder", "normalize_queues", "write_limit"]

_MAX_WRITES = 64


# -- the fetch order (unit-tested on its own) --------------------------------------------------


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


# -- the role --------------------------------------------------------------------------------


class Processor(Role):
    """Fetches tasks and starts them; see the module docstring."""

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
        self._fetch_in_flight = False  # the fetch loop holds every free slot for its fetch
        # Delivered while a fetch held the slots: started when it gives back those it left.
        self._held: list[DequeuedTask] = []
        cfg = deps.config
        self.clock: Callable[[], float] = deps.broker.clock
        self.active = active
        self.slots = Slots(cfg.concurrency)
        # Half the slots per fetch: the next fetch's round trip overlaps the last batch's
        # acknowledgements instead of waiting for them.
        self._fetch_most = max(1, (cfg.concurrency + 1) // 2)
        self._queue_order: QueueOrder | None = None
        self._order_version = -1  # of the QueueSet the order was built from
        self._limits = QueueLimits(
            cfg.queue_concurrency, cfg.local_queue_concurrency, cfg.rate_limits, deps.queues
        )
        self._arming = Arming(
            deps.broker, server_id=server_id, queues=deps.queues, limits=self._limits,
            slots=self.slots, log=self.log,
        )  # fmt: skip
        """Direct delivery: the credit this server asks for while idle."""
        self._max_bytes = cfg.max_inflight_bytes
        self._inflight_bytes = 0
        self._bytes_freed = asyncio.Event()
        self._poll = Backoff(cfg.task_check_interval / 8, cfg.task_check_interval)
        self._wakeup = wakeup
        self._on_burst_done = on_burst_done
        self._fetching = True
        self._fetch_errors = RateLimiter(3.0)
        self._notifier = notifier
        self._backoff = Backoff(0.05, 1.0)
        self._threads = SyncThreads(cfg.sync_concurrency)
        self._debug = is_debug_enabled(self.log)
        self._burst = cfg.burst
        self._group: asyncio.TaskGroup | None = None
        self._owned: OwnedAttempts | None = None  # the tasks' coroutines, while run() runs
        self._context = contextvars.copy_context()  # run() takes its own
        self._idle = asyncio.Event()  # no TaskGroup running: run() has returned
        self._idle.set()
        writer = OutcomeWriter(
            deps, spawn=self._spawn, write_slots=asyncio.Semaphore(write_limit),
            defer_write=defer_write, notifier=notifier, hooks=hooks, history=history,
            debug=self._debug, runs_here=self._runs_here,
        )  # fmt: skip
        self.attempts = Attempts(
            deps, handler=handler, active=active, spawn=self._spawn_attempt,
            released=self._released, writer=writer, progress=progress, debug=self._debug,
            runs_here=self._runs_here,
        )  # fmt: skip
        """Each task's life, from its start to its release (:mod:`asyncq._worker.attempt`)."""

    @property
    def handler(self) -> Handler:
        """What runs each task (the server instruments it once its hooks are known)."""
        return self.attempts.handler

    @handler.setter
    def handler(self, handler: Handler) -> None:
        self.attempts.handler = handler

    @property
    def orphans(self) -> set[asyncio.Task[None]]:
        """Handlers that ignored their cancellation past the grace; see ``Attempts.orphans``."""
        return self.attempts.orphans

    # -- control, called by the server and the other roles --------------------------------

    def stop_fetching(self) -> None:
        """Stop taking new tasks (SIGTSTP / ``Server.stop``); running ones continue."""
        first = self._fetching
        self._fetching = False
        self.request_stop()
        self._wakeup.set()
        self._bytes_freed.set()
        self.slots.close()
        if first and self._arming.waiting_in:
            # The credit expires on its own (DELIVERY_TTL) if the group is gone already.
            self._spawn_late(self._arming.disarm())

    async def drain(self, grace: float, *, force: asyncio.Event | None = None) -> None:
        """Shutdown: wait up to *grace* seconds for running handlers, then requeue and stop them.

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
        self.attempts.abandon_wait = 0.1 if forced else 1.0
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
            async with asyncio.timeout(self.attempts.abandon_wait + 1.0):
                await self._idle.wait()
        if self.orphans:
            self.log.warning("handlers ignored cancellation; leaving them", count=len(self.orphans))

    # -- the fetch loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """The fetch loop, inside the TaskGroup that owns every task's coroutine and the
        ack and token senders. Leaving the group waits for them; a crash of the fetch loop
        (a bug) stops fetching, lets the running tasks finish, then reaches ``supervise``."""
        sync_threads.set(self._threads)
        INLINE_STEPS.set(self.attempts)
        # Every task's coroutine starts from this context (with the limiter of its sync
        # handlers and where a durable run's attempt runs a step inline), whoever starts
        # it: the fetch loop, or the subscriber's delivery.
        self._context = contextvars.copy_context()
        crash: Exception | None = None
        self._idle.clear()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                self._owned = owned = OwnedAttempts(group)
                try:
                    await self._fetch_loop()
                except Exception as exc:
                    crash = exc
                finally:
                    owned.close()
        finally:
            self._group = self._owned = None
            self._idle.set()
        if crash is not None:
            raise crash

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run *coro* (an ack or token call) in the processor's TaskGroup."""
        assert self._group is not None  # only the tasks' coroutines, inside the group, call
        return self._group.create_task(coro)

    def _spawn_attempt(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a task's coroutine, from the context ``run()`` took, owned in the group
        (:mod:`asyncq._worker.owned`: why not ``TaskGroup.create_task``)."""
        assert self._owned is not None  # _start is only reached while the group runs
        return self._owned.spawn(coro, self._context.copy())

    def _spawn_late(
        self, coro: Coroutine[Any, Any, None], delivered: DeliveryNote | DequeuedTask | None = None
    ) -> None:
        """Run *coro* in the group if it still takes tasks: called from outside it (the
        server's stop, the subscriber), possibly after the processor stopped."""
        try:
            if self._group is None:
                raise RuntimeError("the processor is not running")
            self._group.create_task(coro)
        except RuntimeError:  # the group finished, or never ran
            coro.close()
            if delivered is not None:
                task_id, queue = (
                    (delivered.task_id, delivered.queue)
                    if isinstance(delivered, DeliveryNote)
                    else (delivered.message.id, delivered.message.queue)
                )
                self.log.warning(
                    "task delivered after the processor stopped; it is recovered after its lease",
                    task_id=task_id,
                    queue=queue,
                )

    async def _fetch_loop(self) -> None:
        stats = self.stats
        order = self._order
        burst = self.config.burst
        strict = self.config.strict_priority
        while self._fetching:
            n = await self.slots.take_all(self._fetch_most)
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
                    self._start(dequeued)
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
            if self._wakeup.delivery and not burst:
                await self._arming.arm()
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

    # -- the one door: a task fetched or delivered starts here ---------------------------------

    def _start(self, got: DequeuedTask) -> None:
        """Start *got* in the slot its fetch or delivery took; counted against the in-flight
        bytes and its queue's local limit until :meth:`_released`."""
        msg = got.message
        self._inflight_bytes += len(msg.payload)
        self._limits.started(msg.queue)
        self.attempts.start(got)

    def _released(self, active: ActiveTask) -> None:
        """A task's coroutine ended: its slot, bytes and local count are free again; or its
        slot goes to the task its outcome leased to us (:attr:`ActiveTask.then`)."""
        msg = active.msg
        self._inflight_bytes -= len(msg.payload)
        self._bytes_freed.set()
        if self._limits.finished(msg.queue):
            self._wakeup.set()  # room under this server's limit for the queue: fetch again
        then = active.then
        if then is not None:
            active.then = None
            self.stats.continued += 1
            if self._fetching:
                self._start(then)  # in the slot *active* leaves
                return
            self._spawn_late(self._requeue_delivered(then), then)
        if not self.active and self._burst:
            self._wakeup.set()  # re-check the queues now: maybe time to exit
        self.slots.release()

    def _runs_here(self, queue: str) -> bool:
        """Whether a task of *queue* that a finished task's outcome hands on (a durable
        run's first step, the run its step's success wakes) runs here, in that task's slot,
        instead of going to pending: while this server fetches from the queue, which has no
        limit or rate here (only a fetch applies them) and the in-flight bytes leave room."""
        return (
            self._fetching
            and queue in self.queues
            and not self._limits.is_limited(queue)
            and self._inflight_bytes < self._max_bytes
        )

    # -- direct delivery (see asyncq._broker.delivery) -----------------------------------------

    def receive_delivery(self, note: bytes) -> None:
        """A task delivered to this server by an enqueue (the subscriber calls this): it is
        active in Redis, leased to us, and starts here without a fetch."""
        try:
            got = read_note(note)
        except ValueError as exc:
            self.log.error(
                "unreadable delivery; the task is recovered when its lease expires",
                error=error_text(exc),
            )
            return
        if isinstance(got, DeliveryNote):  # its message is unusable here: archived
            self._spawn_late(self._reject_delivered(got), got)
            return
        self.stats.delivered += 1
        self._arming.spent()
        if self._fetch_in_flight and self._fetching and not self.slots.free:
            # An idle processor's fetch (a poll, a wake-up) holds the free slots for a round
            # trip: the task waits for it rather than going back to pending to be fetched.
            self._held.append(got)
        else:
            self._start_delivered(got)

    def _start_delivered(self, got: DequeuedTask) -> None:
        # Started in this turn of the loop: the handler runs next turn, before the ask for
        # the next delivery is made (scheduled after it, it does not delay the pickup).
        if self._fetching and self.slots.try_take():
            self._start(got)
            asyncio.get_running_loop().call_soon(self._ask_again)
        else:  # no slot (all taken, or we are stopping): back to pending
            self._spawn_late(self._requeue_delivered(got), got)

    def _ask_again(self) -> None:
        """Ask for the next delivery (the one that came used the credit up)."""
        self._spawn_late(self._arming.arm())

    def _fetch_done(self, unused: int, *, start: bool = True) -> None:
        """The fetch gives back the *unused* slots it held; the tasks delivered meanwhile
        start in them, or go back to pending when none is left or *start* is False (the
        fetch loop is being torn down)."""
        self._fetch_in_flight = False
        self.slots.release(unused)
        held, self._held = self._held, []
        for got in held:
            if start:
                self._start_delivered(got)
            else:
                self._spawn_late(self._requeue_delivered(got), got)

    async def _reject_delivered(self, note: DeliveryNote) -> None:
        try:
            await self.broker.reject_delivered(note)  # archived and logged by the broker
        except REDIS_ERRORS as exc:  # the task stays active; its lease expires
            self._fetch_failed(exc)

    async def _requeue_delivered(self, got: DequeuedTask) -> None:
        try:
            await self.broker.requeue(got.message)
        except REDIS_ERRORS as exc:
            self.log.error(
                "could not requeue a delivered task; it is recovered after its lease expires",
                error=error_text(exc),
                **task_fields(got.message),
            )
        self._wakeup.set()

    async def cleanup(self) -> None:
        self.slots.close()
        await self._notifier.aclose()


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
