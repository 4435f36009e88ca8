"""The asyncq worker: :class:`Server` runs handlers for tasks taken from Redis.

It follows Go asynq's Server (spec sections 1.6, 5 and 6) and stays
wire-compatible with it: Go and Python workers can serve the same queues.

Lifecycle::

    server = Server("redis://localhost:6379/0", concurrency=20,
                    queues={"critical": 6, "default": 3, "low": 1})
    await server.run(mux)        # handles SIGTERM/SIGINT/SIGTSTP, returns after shutdown

    # or embedded (a web app's lifespan, a test):
    async with Server(redis, concurrency=4) as server:
        await server.start(mux)
        ...                      # shutdown() runs when the block exits

Shutdown, as asynq's: ``stop()`` (SIGTSTP) stops fetching new tasks while
running ones finish. ``shutdown()`` (SIGTERM/SIGINT) stops fetching, waits up
to ``shutdown_timeout`` (8 s) for running handlers, then puts the unfinished
tasks back at the front of their pending list (no retry counted), cancels
their handlers and removes the server's records from Redis. A second
SIGTERM/SIGINT during shutdown exits at once: handlers are cancelled without
requeueing and their tasks come back through lease recovery. (Python cannot
stop a thread: a plain ``def`` handler still blocking in its worker thread
keeps the interpreter alive until it returns; a third signal ends the process.)

A Server is validated settings (:func:`asyncq._worker.config.build_config`) plus
wiring: ``__init__`` builds every background role (processor, heartbeater, watchdog,
forwarder, recoverer, janitor, syncer, subscriber, and when configured the history
role, the health checker, the queue watcher and the aggregator), each from exactly
what it uses.
``start()`` runs them, each an asyncio task in one TaskGroup, the server's main task
(see :mod:`asyncq._service` for the lifecycle it shares with the Scheduler and the
PeriodicTaskManager), and returns once each has started (a start handshake: a role that
cannot start fails ``start()`` with its own error); shutdown stops them in
:data:`SHUTDOWN_ORDER`; a role that crashes once started is logged and restarted with
backoff (see :mod:`asyncq._worker.roles`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fnmatch
import functools
import gc
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from anyio.abc import TaskStatus
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from typing_extensions import Unpack

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._logging import get_logger
from asyncq._producer.client import Client
from asyncq._redis.connection import Connection, check_tls, independent_target
from asyncq._redis.options import RedisClient, RedisTarget, describe_target
from asyncq._service import Service
from asyncq._signals import log_signal_hints
from asyncq._taskstart import start_task
from asyncq._worker.active import ActiveTasks
from asyncq._worker.aggregator import GroupAggregatorRole
from asyncq._worker.completion import CompletionNotifier
from asyncq._worker.config import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_QUEUES,
    Aggregation,
    ErrorHandler,
    HealthCheck,
    Intervals,
    IsFailure,
    Limits,
    RetryDelay,
    ServerConfig,
    ServerOptions,
    ServerStats,
    build_config,
)
from asyncq._worker.forwarder import Forwarder
from asyncq._worker.healthchecker import HealthChecker
from asyncq._worker.heartbeater import Heartbeater, ServerIdentity
from asyncq._worker.history_flusher import HistoryFlusher
from asyncq._worker.janitor import Janitor
from asyncq._worker.processor import Processor, write_limit
from asyncq._worker.queueset import QueueSet, is_pattern
from asyncq._worker.queuewatcher import QueueWatcher, refresh_once
from asyncq._worker.recoverer import Recoverer
from asyncq._worker.roles import Role, RoleDeps, supervise
from asyncq._worker.subscriber import Subscriber
from asyncq._worker.syncer import Syncer
from asyncq._worker.wakeup import QueueWakeup
from asyncq._worker.watchdog import Watchdog
from asyncq.errors import ServerClosedError
from asyncq.events import EventHooks, EventLog, QueueFilter
from asyncq.history import HistoryRecorder
from asyncq.hooks import WorkerHooks, combine_hooks
from asyncq.lifespan import Lifespan, state_var
from asyncq.mux import ServeMux, as_async_handler
from asyncq.progress import ProgressWriter
from asyncq.task import Task, TaskInfo

__all__ = [
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_QUEUES",
    "Aggregation",
    "ErrorHandler",
    "HealthCheck",
    "Intervals",
    "IsFailure",
    "Limits",
    "RetryDelay",
    "Server",
    "ServerConfig",
    "ServerOptions",
    "ServerStats",
]

SHUTDOWN_ORDER: tuple[str, ...] = (
    "forwarder",
    "processor",
    "recoverer",
    "history",
    "syncer",
    "subscriber",
    "janitor",
    "aggregator",
    "queuewatcher",
    "healthchecker",
    "heartbeater",
    "watchdog",
)
"""The order in which shutdown stops the roles (by name), asynq's with asyncq's roles added.

Senders before receivers: the forwarder stops feeding pending first; the processor
then drains while everything its handlers rely on still runs (the subscriber
delivers cancel messages, the syncer takes writes Redis refused, the heartbeater
and the watchdog keep the leases alive); the recoverer stops after it so it never
takes over a task this server is still finishing, the history role writes the
processor's last counts, and the syncer flushes what the processor left. The
heartbeater goes last but one, so the server's records and leases stay until
nothing runs, and the watchdog last, since a blocked loop can still happen in any
role's cleanup. A role missing from this list stops after these."""

_STATUS_ACTIVE = "active"
_STATUS_STOPPED = "stopped"


_heap_frozen = False


def _freeze_startup_heap() -> None:
    """Once per process, when the first server has started: ``gc.freeze()``.

    Why. Everything alive by then (the imported modules, their classes and functions,
    the roles, the connections) lives as long as the process, yet the cyclic garbage
    collector's full passes (generation 2) walked all of it again and again while
    tasks ran: 5-8 µs of worker CPU per task, measured (``python -m
    benchmarks.profile_worker --freeze``). Frozen, those objects leave every later
    pass (1.2-1.9 µs per task left); the per-task garbage is collected as before.
    This is Instagram's practice with its long-lived workers, and what the
    :func:`gc.freeze` documentation suggests before forking workers. No collection
    first: a full one costs tens of milliseconds of start-up here, more than it
    would save; the start-up's own garbage in reference cycles, if any, is kept
    (once, bounded). Once per process: a second server (a test suite's next one)
    would otherwise freeze the first one's leftovers.
    """
    global _heap_frozen
    if _heap_frozen:
        return
    _heap_frozen = True
    gc.freeze()


async def _no_handler(task: Task) -> None:
    raise RuntimeError("the server runs no handler before start(handler)")


class Server(Service):
    """Runs task handlers from Redis queues; see the module docstring.

    *redis* is a URI, connection options or a ``redis.asyncio`` client (a
    client is shared: the server leaves it open). The settings are keywords,
    :class:`~asyncq.ServerOptions` (``concurrency``, ``queues``, ``intervals=``,
    ``limits=``, ...); beside them the server takes what it is wired with:

    - ``logger``: a structlog logger (default ``structlog.get_logger("asyncq")``).
    - ``metrics``: a :class:`~asyncq.hooks.WorkerHooks` such as
      ``asyncq.metrics.WorkerMetrics(port=9877)`` (worker-side Prometheus metrics).
    - ``lifespan``: a zero-argument callable returning an async context
      manager, entered at start and exited after shutdown; handlers read what
      it yields with :func:`asyncq.lifespan_state` (see :mod:`asyncq.lifespan`).
    """

    def __init__(
        self,
        redis: RedisTarget,
        *,
        logger: Any = None,
        metrics: WorkerHooks | None = None,
        lifespan: Lifespan | None = None,
        **options: Unpack[ServerOptions],
    ) -> None:
        super().__init__()
        self.config: ServerConfig = build_config(**options)
        if lifespan is not None and not callable(lifespan):
            raise TypeError(f"lifespan must be callable, got {lifespan.__class__.__name__}")
        cfg = self.config
        self.log: Any = logger if logger is not None else get_logger()
        self.metrics = metrics
        if cfg.janitor_batch_size > 100:
            self.log.warning(
                "janitor_batch_size above 100 makes each janitor script call block Redis longer",
                janitor_batch_size=cfg.janitor_batch_size,
            )
        self._independent_target = independent_target(redis)
        self._announce_signals = True
        self._where = describe_target(redis)
        self.connection = Connection(redis)
        self.redis: RedisClient = self.connection.redis
        self.broker = Broker(
            self.redis,
            lease_duration=cfg.lease_duration,
            fast=self.connection.fast,
            min_replicas=cfg.min_replicas,
            replica_timeout=cfg.replica_timeout,
        )
        self.history: HistoryRecorder | None = None
        if cfg.metrics_history is not None:
            self.history = HistoryRecorder(self.broker, retention=cfg.metrics_history, log=self.log)
        self._hooks: WorkerHooks = combine_hooks(metrics)
        self._events: EventLog | None = None
        event_queues = QueueFilter(cfg.events)
        if event_queues.enabled:
            self._events = EventLog(self.broker, event_queues)
            self._hooks = EventHooks(self._hooks, self._events)
        self._progress = ProgressWriter(self.broker, self._events)
        self.host = socket.gethostname() or "unknown-host"
        self.pid = os.getpid()
        self.server_id = str(uuid.uuid4())
        self.started_at: datetime | None = None
        self.stats = ServerStats()
        self.active = ActiveTasks()
        """The tasks this server runs (the registry the roles read and cancel through)."""
        self.queue_set = QueueSet(cfg.queues)
        """The queues served now: the names of ``queues`` and the current matches of its
        patterns (re-read from ``asynq:queues`` every ``queue_refresh_interval``)."""
        self._fetching = True
        self._enqueuer: Client | None = None
        self._force = asyncio.Event()
        self._lifespan = lifespan
        self._lifespan_stack = contextlib.AsyncExitStack()
        self._context = contextvars.copy_context()
        """The roles' context, copied here; start() sets the lifespan state in it."""
        self._role_tasks: dict[str, asyncio.Task[None]] = {}
        self._build_roles()

    def _build_roles(self) -> None:
        """Every role, each given exactly what it uses (see :class:`RoleDeps`)."""
        cfg = self.config
        deps = RoleDeps(
            broker=self.broker, config=cfg, log=self.log, stats=self.stats, queues=self.queue_set
        )
        wakeup = QueueWakeup()  # set when a fetch may find work: the processor waits on it
        self.syncer: Syncer = Syncer(deps, cfg.syncer_interval)
        self.processor: Processor = Processor(
            deps,
            handler=_no_handler,  # start(handler) sets the handler
            active=self.active,
            wakeup=wakeup,
            defer_write=self.syncer.add,
            on_burst_done=self._begin_shutdown,
            notifier=CompletionNotifier(self.broker),
            write_limit=write_limit(self.redis),
            hooks=self._hooks,
            history=self.history,
            progress=self._progress,
            server_id=self.server_id,
        )
        self._subscriber = Subscriber(
            deps,
            active=self.active,
            wakeup=wakeup,
            pubsub=self.connection.pubsub,
            # Not on a cluster: a queue's waiters list and the server's credit would span slots.
            delivery=None
            if isinstance(self.redis, RedisCluster)
            else (keys.delivery_channel(self.server_id), self.processor.receive_delivery),
        )
        independent = self._independent_target
        roles: list[Role] = [
            Heartbeater(
                deps,
                cfg.heartbeat_interval,
                active=self.active,
                identity=ServerIdentity(host=self.host, pid=self.pid, server_id=self.server_id),
                status=lambda: self.status,
                started_at=lambda: self.started_at,
            ),
            Watchdog(
                deps,
                active=self.active,
                threshold=max(0.5, min(1.0, cfg.heartbeat_interval)),
                keep_leases_with=None if independent is None else (lambda: independent),
                on_stall=self._hooks.loop_stalled,
            ),
        ]
        if cfg.health_check is not None:
            roles.append(HealthChecker(deps, cfg.health_check_interval, ping=self.redis.ping))
        forwarder = Forwarder(deps, cfg.delayed_task_check_interval, wakeup=wakeup)
        # The retries this server writes wake its forwarder when they are due.
        self.broker.on_retry = forwarder.due_at
        roles += [
            self._subscriber,
            self.syncer,
            Recoverer(
                deps,
                cfg.recoverer_interval,
                active=self.active,
                wakeup=wakeup,
                hooks=self._hooks,
                history=self.history,
            ),
            forwarder,
            self.processor,
            Janitor(deps, cfg.janitor_interval),
        ]
        if self.history is not None:
            roles.append(HistoryFlusher(deps, recorder=self.history))
        self._watcher: QueueWatcher | None = None
        if self.queue_set.dynamic:
            self._watcher = QueueWatcher(
                deps, cfg.queue_refresh_interval, wakeup=wakeup, ordered=cfg.ordered_queues
            )
            roles.append(self._watcher)
        if cfg.group_aggregator is not None:
            roles.append(
                GroupAggregatorRole(
                    deps, cfg.group_check_interval, enqueue=self._enqueue_aggregated
                )
            )
        self.roles: tuple[Role, ...] = tuple(roles)
        """Every role of this server, in the order they start."""

    # -- state ------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"new"``, ``"active"``, ``"stopped"`` (not fetching) or ``"closed"`` (shutting
        down or shut down)."""
        if self._state == "running":
            return "active" if self._fetching else "stopped"
        return "closed" if self._state == "stopping" else self._state

    @property
    def status(self) -> str:
        """The status written in the heartbeat: ``"active"`` or ``"stopped"``."""
        return _STATUS_ACTIVE if self.state == "active" else _STATUS_STOPPED

    @property
    def served_queues(self) -> list[str]:
        """The queues served now: the names of ``queues`` and the current matches of its
        patterns."""
        return self.queue_set.names()

    @property
    def running_tasks(self) -> int:
        """Handlers running now."""
        return len(self.active)

    # -- lifecycle (see asyncq._service) ---------------------------------------------------

    kind = "server"

    async def start(self, handler: ServeMux | Callable[[Task], Any]) -> None:
        """Start the roles and begin processing with *handler* (a ServeMux or a handler).

        Returns once every role has started (the subscriber once it tried to subscribe).
        Raises RuntimeError when already started or stopped, ServerClosedError after
        shutdown, and the error of a role that could not start (the server then shut down).
        """
        if self.state == "active":
            raise RuntimeError("the server is already running")
        if self.state == "stopped":
            raise RuntimeError("the server is in the stopped state; waiting for shutdown")
        if self.state == "closed":
            raise ServerClosedError()
        if handler is None:
            raise TypeError("server cannot start: the handler is None")
        fn = handler if isinstance(handler, ServeMux) else as_async_handler(handler)
        self.processor.handler = self._hooks.instrument(fn)
        await self._start_service(self._context)
        _freeze_startup_heap()

    async def _open(self) -> None:
        await check_tls(self.redis)  # an unverifiable certificate fails now, with its reason
        await self._say_if_unreachable()
        if self._lifespan is not None:
            state = await self._lifespan_stack.enter_async_context(self._lifespan())
            self._context.run(state_var.set, state)
        cfg = self.config
        if self._watcher is not None:
            await refresh_once(self._watcher)  # the patterns' current matches before any fetch
        served = self.queue_set.names()
        for qname in cfg.ordered_queues:  # a pattern: the served queues matching it now (the
            # watcher marks later ones)
            for name in fnmatch.filter(served, qname) if is_pattern(qname) else [qname]:
                await self.broker.mark_ordered(name)
        self._hooks.attach()  # last: a set-up that fails before leaves nothing to detach
        self.started_at = datetime.now(UTC)
        self.log.info(
            "starting processing",
            server_id=self.server_id,
            concurrency=cfg.concurrency,
            queues=dict(cfg.queues),
            served=len(served),
            strict_priority=cfg.strict_priority,
        )

    async def _open_failed(self) -> None:
        # Nothing was started: the server stays "new" (asynq's Server can be started
        # again), so only the lifespan entered is exited; shutdown() closes the rest.
        await self._lifespan_stack.aclose()

    async def _say_if_unreachable(self) -> None:
        """Log once, at ERROR, when Redis does not answer at start.

        start() does not fail for it: a worker outlives a Redis that comes up later
        (the roles retry with backoff, each logging its own failures at a bounded
        rate), but without this line nothing says plainly where it tried to connect.
        """
        try:
            async with asyncio.timeout(5.0):
                await self.redis.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            self.log.error(
                f"cannot reach Redis at {self._where}; retrying until it answers",
                error=f"{type(exc).__name__}: {exc}",
            )

    async def _main_loop(self, task_status: TaskStatus[None]) -> None:
        """The server's main task: every role, supervised, in one TaskGroup; it serves
        once each role has started, in order (see :class:`~asyncq._worker.roles.Role`)."""
        async with asyncio.TaskGroup() as tg:
            for role in self.roles:
                spawn = functools.partial(tg.create_task, name=f"asyncq-{role.name}")
                self._role_tasks[role.name] = await start_task(
                    spawn, functools.partial(supervise, role)
                )
            task_status.started()

    def stop(self) -> None:
        """Stop fetching new tasks; running handlers finish (asynq's Stop, SIGTSTP)."""
        if self.state != "active":
            return
        self._fetching = False
        self.log.info("stopping processor: no new tasks will be fetched")
        self.processor.stop_fetching()

    async def shutdown(self) -> None:
        """Stop, wait for running handlers up to ``shutdown_timeout``, requeue the rest, exit.

        Safe to call more than once and from several tasks.
        """
        await super().shutdown()

    def force_shutdown(self) -> None:
        """Make a running or upcoming shutdown skip waiting: handlers are cancelled without
        requeueing (their tasks come back through lease recovery)."""
        self._force.set()
        if self._state == "running":
            self._begin_shutdown()

    async def _enqueue_aggregated(self, task: Task, queue: str) -> TaskInfo:
        if self._enqueuer is None:
            # The server's Connection, fast transport included; shared, so it stays open.
            self._enqueuer = Client(self.connection)
        return await self._enqueuer.enqueue(task, queue=queue)

    async def _release(self) -> None:
        try:
            await self._lifespan_stack.aclose()
        finally:
            await self.connection.aclose()

    async def _close(self) -> None:
        self.log.info("starting graceful shutdown")
        rank = {name: i for i, name in enumerate(SHUTDOWN_ORDER)}
        try:
            for role in sorted(self.roles, key=lambda r: rank.get(r.name, len(rank))):
                await self._stop_role(role)
            if self._main is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._main
        finally:
            if self._enqueuer is not None:
                await self._enqueuer.aclose()  # shared connection: closed just below
            self._hooks.detach()
            await self._progress.aclose()  # the last reports, before the connection goes
            if self._events is not None:
                await self._events.aclose()
            try:
                await self._lifespan_stack.aclose()
            except Exception as exc:
                self.log.error("lifespan exit failed", exc_info=exc)
            await self.connection.aclose()
            self.log.info("exiting", processed=self.stats.succeeded + self.stats.failed)

    async def _stop_role(self, role: Role) -> None:
        force = self._force.is_set()
        grace = self.config.shutdown_timeout
        await role.drain(grace, force=self._force)
        task = self._role_tasks.get(role.name)
        if task is not None and not task.done():
            # Asked to stop, a role leaves within a Redis round trip; it gets as long as
            # the handlers got (shutdown_timeout) before it is cancelled.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5 if force else grace):
                    await asyncio.shield(task)
            if not task.done():
                self.log.warning("role did not stop in time; cancelling it", role=role.name)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            # Not shutdown_timeout: cleanup writes what would otherwise be lost (the
            # syncer's refused writes, the server's records), however short the handlers'
            # wait was; only a second signal cuts it short.
            async with asyncio.timeout(1.0 if self._force.is_set() else 10.0):
                await role.finish(forced=force)
        except Exception as exc:
            self.log.error("role cleanup failed", role=role.name, exc_info=exc)

    async def run(self, handler: ServeMux | Callable[[Task], Any]) -> None:
        """Start, then serve until SIGTERM/SIGINT (or the end of a burst run), then shut down.

        SIGTSTP stops fetching new tasks; a second SIGTERM/SIGINT makes the
        shutdown skip waiting for running handlers.
        """
        stop_requested = False

        def on_repeat(signame: str) -> None:
            self.log.warning("second signal: exiting without waiting", signal=signame)
            self.force_shutdown()

        def on_stop() -> None:
            nonlocal stop_requested
            if self.state == "active":
                self.stop()
            else:  # still starting: stop once started
                stop_requested = True

        def started() -> None:
            if stop_requested:
                self.stop()
            if threading.current_thread() is threading.main_thread():
                # Not in burst mode (it ends by itself) nor under `asyncq worker
                # --processes`, whose supervisor prints them once for all its workers.
                if self._announce_signals and not self.config.burst:
                    log_signal_hints(self.log)
            else:
                self.log.warning("not in the main thread: no signal handlers installed")

        await self._run_until_signal(
            lambda: self.start(handler), on_repeat=on_repeat, on_stop=on_stop, started=started
        )

    async def ping(self) -> None:
        """Check that Redis answers; raises a redis-py error when it does not."""
        await self.redis.ping()

    def __repr__(self) -> str:
        return (
            f"<Server id={self.server_id} state={self.state} "
            f"queues={dict(self.config.queues)} concurrency={self.config.concurrency}>"
        )
