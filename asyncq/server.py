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

Every background role (processor, heartbeater, watchdog, forwarder,
recoverer, janitor, syncer, subscriber, and when configured the health
checker, the queue watcher and the aggregator) is an asyncio task in one
TaskGroup; shutdown stops them in :data:`SHUTDOWN_ORDER`; a role that
crashes is logged and restarted with backoff (see :mod:`asyncq._worker.roles`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fnmatch
import os
import socket
import threading
import types
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.exceptions import RedisError

from asyncq import _keys as keys
from asyncq._broker import LEASE_DURATION, Broker
from asyncq._broker.replication import replica_wait_seconds
from asyncq._logging import get_logger
from asyncq._redis.connection import Connection, check_tls, independent_target
from asyncq._redis.options import RedisClient, RedisTarget, describe_target
from asyncq._signals import log_signal_hints, signal_handlers
from asyncq._worker.active import ActiveTasks
from asyncq._worker.aggregator import GroupAggregatorRole
from asyncq._worker.config import (
    ErrorHandler,
    GroupAggregator,
    HealthCheck,
    IsFailure,
    RetryDelay,
    ServerConfig,
    ServerStats,
)
from asyncq._worker.flow import (
    validate_limits,
    validate_ordered,
    validate_rates,
    validate_type_rates,
)
from asyncq._worker.forwarder import Forwarder
from asyncq._worker.healthchecker import HealthChecker
from asyncq._worker.heartbeater import Heartbeater, ServerIdentity
from asyncq._worker.janitor import Janitor
from asyncq._worker.policy import default_retry_delay
from asyncq._worker.processor import Processor, write_limit
from asyncq._worker.queueset import QueueSet, is_pattern, validate_pattern
from asyncq._worker.queuewatcher import QueueWatcher, refresh_once
from asyncq._worker.recoverer import Recoverer
from asyncq._worker.roles import Role, RoleDeps, supervise
from asyncq._worker.subscriber import Subscriber
from asyncq._worker.syncer import Syncer
from asyncq._worker.watchdog import Watchdog
from asyncq.client import Client
from asyncq.errors import ServerClosedError
from asyncq.events import EventHooks, EventLog, QueueFilter
from asyncq.hooks import NO_HOOKS, WorkerHooks
from asyncq.lifespan import Lifespan, state_var
from asyncq.mux import ServeMux, as_async_handler
from asyncq.progress import ProgressWriter
from asyncq.results import CompletionNotifier
from asyncq.task import Task, TaskInfo

__all__ = [
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_QUEUES",
    "ErrorHandler",
    "HealthCheck",
    "IsFailure",
    "RetryDelay",
    "Server",
    "ServerConfig",
    "ServerStats",
]

DEFAULT_QUEUES: Mapping[str, int] = types.MappingProxyType({"default": 1})
"""Queues served when none are given (asynq's default)."""
DEFAULT_MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
"""Default bound on the task bytes a server holds in running handlers (64 MiB)."""

SHUTDOWN_ORDER: tuple[str, ...] = (
    "forwarder",
    "processor",
    "recoverer",
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
takes over a task this server is still finishing, and the syncer flushes what the
processor left. The heartbeater goes last but one, so the server's records and
leases stay until nothing runs, and the watchdog last, since a blocked loop can
still happen in any role's cleanup. A role missing from this list stops after these."""

_STATUS_ACTIVE = "active"
_STATUS_STOPPED = "stopped"


def _default_is_failure(exc: BaseException) -> bool:
    return True


def _duration(name: str, value: object, *, minimum: timedelta = timedelta(0)) -> float:
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {value.__class__.__name__}")
    if value <= minimum and minimum == timedelta(0):
        raise ValueError(f"{name} must be positive, got {value}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value.total_seconds()


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value.__class__.__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, got {value.__class__.__name__}")


class Server:
    """Runs task handlers from Redis queues; see the module docstring.

    *redis* is a URI, connection options or a ``redis.asyncio`` client (a
    client is shared: the server leaves it open). All durations are
    ``timedelta``s; defaults are asynq's.

    - ``concurrency``: handlers running at once (default: the number of CPUs).
    - ``queues``: queue name -> priority (default ``{"default": 1}``).
    - ``strict_priority``: always empty higher-priority queues first.
    - ``retry_delay(n, exc, task)``: delay before retry *n* (default: asynq's
      n**4 + 15 + rand(30)*(n+1) s).
    - ``is_failure(exc)``: False = retry without counting the attempt.
    - ``error_handler(task, exc)``: called on every failure (sync or async).
    - ``shutdown_timeout``: wait for running handlers at shutdown (8 s).
    - ``health_check(exc | None)`` every ``health_check_interval`` (15 s).
    - ``task_check_interval``: longest idle wait between fetches (80 ms; asynq:
      1 s); asyncq clients wake idle workers at once, this bounds the pickup
      of tasks enqueued by Go asynq or redis-cli. A fetch is one script call
      whatever the number of queues, so idle polling stays cheap.
    - ``delayed_task_check_interval``: forwarder period (5 s).
    - ``janitor_interval`` (8 s), ``janitor_batch_size`` (100).
    - ``heartbeat_interval`` (5 s), ``lease_duration`` (30 s),
      ``recoverer_interval`` (1 min: the longest time between two recoverer
      checks; it also checks at the earliest lease expiry it saw and at least
      once per lease duration), ``recoverer_cutoff`` (2 s: how long after
      expiry a lease is recovered, the allowance for clock skew between
      hosts; asynq's is 30 s), ``syncer_interval`` (5 s): asynq hard-codes
      these. A killed worker's tasks run again on another worker about
      ``lease_duration`` + ``recoverer_cutoff`` after the kill.
    - ``group_aggregator(group, tasks) -> Task`` enables aggregation (*tasks*
      in joining order to the second; within one second in task-id order), with
      ``group_grace_period`` (1 min, at least 1 s), ``group_max_delay`` and
      ``group_max_size`` (None/0 = no limit) and ``group_check_interval``
      (default min(7 s, grace period)).
    - ``burst``: shut down once the queues are empty and nothing runs.
    - ``sync_concurrency``: worker threads for plain ``def`` handlers
      (default: ``concurrency``).
    - ``max_inflight_bytes``: bound on the payload bytes of the running
      handlers (64 MiB); a fetch takes no task that would pass it, except
      that a single larger task runs alone.
    - ``queues`` may hold fnmatch-style patterns (``{"tenant:*": 1}``): the
      server serves every queue of ``asynq:queues`` that matches, re-read every
      ``queue_refresh_interval`` (1 s), so queues created later are served and
      removed ones are dropped. An explicit name wins over a pattern. With
      ``strict_priority`` each match has the pattern's priority; in weighted
      order the pattern's weight is split among its matches. The flow-control
      options below accept patterns too (each match gets its own limit).
    - ``queue_concurrency``: ``{queue: N}``, at most N tasks of the queue run
      at once across every asyncq server (counted in Redis from the live
      leases; a limit stored with ``Inspector.set_limit`` overrides it);
      ``local_queue_concurrency``: ``{queue: N}`` for this server alone;
      ``rate_limits``: ``{queue: "100/s"}``, a token bucket in Redis shared by
      every asyncq server (periods s, min, h; holds N tokens, or B with "N/s burst B");
      ``type_rate_limits``: ``{task type: "600/min"}``, the same per task type,
      fleet-wide, taken by the worker after the dequeue (a task without a token
      goes back to the retry set unrun, without using a retry);
      ``ordered_queues``: queues this server marks ordered in Redis when it
      starts (one task at a time fleet-wide, in enqueue order, a failed task
      first; the same flag as ``asyncq queue ordered Q on``). See
      docs/flow-control.md.
    - ``logger``: a structlog logger (default ``structlog.get_logger("asyncq")``).
    - ``metrics``: a :class:`~asyncq.hooks.WorkerHooks` such as
      ``asyncq.metrics.WorkerMetrics(port=9877)`` (worker-side Prometheus metrics).
    - ``events``: write task events (started, progress, succeeded, failed, ...)
      to the event stream (:mod:`asyncq.events`) for every queue (True) or
      the listed queue names and patterns; off by default (docs/events.md).
    - ``min_replicas`` (0 = off) and ``replica_timeout`` (1 s): a finished
      attempt's outcome (done, completed, retry, archive) counts only once that
      many replicas acknowledged it (Redis ``WAIT``); otherwise the outcome is
      logged as unconfirmed and the task may run again after a failover.
    - ``lifespan``: a zero-argument callable returning an async context
      manager, entered at start and exited after shutdown; handlers read what
      it yields with :func:`asyncq.lifespan_state` (see :mod:`asyncq.lifespan`).
    """

    def __init__(
        self,
        redis: RedisTarget,
        *,
        concurrency: int | None = None,
        queues: Mapping[str, int] | None = None,
        strict_priority: bool = False,
        retry_delay: RetryDelay | None = None,
        is_failure: IsFailure | None = None,
        error_handler: ErrorHandler | None = None,
        shutdown_timeout: timedelta = timedelta(seconds=8),
        health_check: HealthCheck | None = None,
        health_check_interval: timedelta = timedelta(seconds=15),
        task_check_interval: timedelta = timedelta(milliseconds=80),
        delayed_task_check_interval: timedelta = timedelta(seconds=5),
        janitor_interval: timedelta = timedelta(seconds=8),
        janitor_batch_size: int = 100,
        heartbeat_interval: timedelta = timedelta(seconds=5),
        lease_duration: timedelta = timedelta(seconds=LEASE_DURATION),
        recoverer_interval: timedelta = timedelta(minutes=1),
        recoverer_cutoff: timedelta = timedelta(seconds=2),
        syncer_interval: timedelta = timedelta(seconds=5),
        group_aggregator: GroupAggregator | None = None,
        group_grace_period: timedelta = timedelta(minutes=1),
        group_max_delay: timedelta | None = None,
        group_max_size: int | None = None,
        group_check_interval: timedelta | None = None,
        burst: bool = False,
        sync_concurrency: int | None = None,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
        queue_concurrency: Mapping[str, int] | None = None,
        local_queue_concurrency: Mapping[str, int] | None = None,
        rate_limits: Mapping[str, str] | None = None,
        type_rate_limits: Mapping[str, str] | None = None,
        ordered_queues: Sequence[str] = (),
        queue_refresh_interval: timedelta = timedelta(seconds=1),
        logger: Any = None,
        metrics: WorkerHooks | None = None,
        events: bool | Sequence[str] = False,
        min_replicas: int = 0,
        replica_timeout: timedelta = timedelta(seconds=1),
        lifespan: Lifespan | None = None,
    ) -> None:
        replica_wait = replica_wait_seconds(min_replicas, replica_timeout)
        concurrency = (os.cpu_count() or 1) if concurrency is None else concurrency
        concurrency = _positive_int("concurrency", concurrency)
        queues = DEFAULT_QUEUES if queues is None else queues
        if not isinstance(queues, Mapping):
            raise TypeError(f"queues must be a mapping of name to priority, got {queues!r}")
        if not queues:
            raise ValueError("queues cannot be empty (omit it to serve {'default': 1})")
        for qname, prio in queues.items():
            if not isinstance(qname, str) or not qname.strip():
                raise ValueError(f"queue names must be non-blank strings, got {qname!r}")
            keys.refuse_braces("queue name", qname)
            if is_pattern(qname):
                validate_pattern("queues", qname)
            if isinstance(prio, bool) or not isinstance(prio, int) or prio < 1:
                raise ValueError(f"queue {qname!r} needs an integer priority >= 1, got {prio!r}")
        for name, fn in (
            ("retry_delay", retry_delay),
            ("is_failure", is_failure),
            ("error_handler", error_handler),
            ("health_check", health_check),
            ("group_aggregator", group_aggregator),
        ):
            _callable(name, fn)
        grace = _duration("group_grace_period", group_grace_period, minimum=timedelta(seconds=1))
        max_delay = 0.0
        if group_max_delay is not None and group_max_delay != timedelta(0):
            max_delay = _duration("group_max_delay", group_max_delay, minimum=timedelta(seconds=1))
        max_size = 0
        if group_max_size is not None and group_max_size != 0:
            max_size = _positive_int("group_max_size", group_max_size)
        check_interval = min(7.0, grace)
        if group_check_interval is not None:
            check_interval = _duration("group_check_interval", group_check_interval)
        heartbeat = _duration("heartbeat_interval", heartbeat_interval)
        lease = _duration("lease_duration", lease_duration, minimum=timedelta(seconds=2))
        if lease <= heartbeat:
            raise ValueError(
                f"lease_duration ({lease_duration}) must be longer than heartbeat_interval "
                f"({heartbeat_interval}): the heartbeat extends the leases"
            )
        cutoff = recoverer_cutoff
        if not isinstance(cutoff, timedelta):
            raise TypeError(
                f"recoverer_cutoff must be a datetime.timedelta, got {cutoff.__class__.__name__}"
            )
        if cutoff < timedelta(0):
            raise ValueError(f"recoverer_cutoff cannot be negative, got {cutoff}")
        self.config = ServerConfig(
            concurrency=concurrency,
            queues=types.MappingProxyType(dict(queues)),
            strict_priority=bool(strict_priority),
            retry_delay=retry_delay or default_retry_delay,
            is_failure=is_failure or _default_is_failure,
            error_handler=error_handler,
            shutdown_timeout=_duration("shutdown_timeout", shutdown_timeout),
            health_check=health_check,
            health_check_interval=_duration("health_check_interval", health_check_interval),
            task_check_interval=_duration("task_check_interval", task_check_interval),
            delayed_task_check_interval=_duration(
                "delayed_task_check_interval", delayed_task_check_interval
            ),
            janitor_interval=_duration("janitor_interval", janitor_interval),
            janitor_batch_size=_positive_int("janitor_batch_size", janitor_batch_size),
            heartbeat_interval=heartbeat,
            lease_duration=lease,
            recoverer_interval=_duration("recoverer_interval", recoverer_interval),
            recoverer_cutoff=cutoff.total_seconds(),
            syncer_interval=_duration("syncer_interval", syncer_interval),
            group_aggregator=group_aggregator,
            group_grace_period=grace,
            group_max_delay=max_delay,
            group_max_size=max_size,
            group_check_interval=check_interval,
            burst=bool(burst),
            sync_concurrency=_positive_int(
                "sync_concurrency", concurrency if sync_concurrency is None else sync_concurrency
            ),
            max_inflight_bytes=_positive_int("max_inflight_bytes", max_inflight_bytes),
            queue_concurrency=validate_limits("queue_concurrency", queue_concurrency),
            local_queue_concurrency=validate_limits(
                "local_queue_concurrency", local_queue_concurrency
            ),
            rate_limits=validate_rates("rate_limits", rate_limits),
            ordered_queues=validate_ordered(ordered_queues),
            type_rate_limits=validate_type_rates("type_rate_limits", type_rate_limits),
            queue_refresh_interval=_duration("queue_refresh_interval", queue_refresh_interval),
        )
        self.log: Any = logger if logger is not None else get_logger()
        self.metrics = metrics
        self._hooks: WorkerHooks = NO_HOOKS if metrics is None else metrics
        if janitor_batch_size > 100:
            self.log.warning(
                "janitor_batch_size above 100 makes each janitor script call block Redis longer",
                janitor_batch_size=janitor_batch_size,
            )
        event_queues = QueueFilter(events)
        self._independent_target = independent_target(redis)
        self._announce_signals = True
        self._where = describe_target(redis)
        self.connection = Connection(redis)
        self.redis: RedisClient = self.connection.redis
        self._events: EventLog | None = None
        if event_queues.enabled:
            self._events = EventLog(self.redis, event_queues)
            self._hooks = EventHooks(self._hooks, self._events)
        self._progress = ProgressWriter(self.redis, self._events)
        self.broker = Broker(
            self.redis,
            lease_duration=lease,
            fast=self.connection.fast,
            min_replicas=min_replicas,
            replica_timeout=replica_wait,
        )
        self.host = socket.gethostname() or "unknown-host"
        self.pid = os.getpid()
        self.server_id = str(uuid.uuid4())
        self.started_at: datetime | None = None
        self.stats = ServerStats()
        self.active = ActiveTasks()
        """The tasks this server runs (the registry the roles read and cancel through)."""
        self.queue_set = QueueSet(self.config.queues)
        """The queues served now: the names of ``queues`` and the current matches of its
        patterns (re-read from ``asynq:queues`` every ``queue_refresh_interval``)."""
        self._deps = RoleDeps(
            broker=self.broker,
            config=self.config,
            log=self.log,
            stats=self.stats,
            queues=self.queue_set,
        )
        self._wakeup = asyncio.Event()
        self._enqueuer: Client | None = None
        self.processor: Processor | None = None
        self.syncer: Syncer = Syncer(self._deps, self.config.syncer_interval)
        self._state = "new"
        self._roles: list[Role] = []
        self._role_tasks: dict[str, asyncio.Task[None]] = {}
        self._main: asyncio.Task[None] | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._force = asyncio.Event()
        _callable("lifespan", lifespan)
        self._lifespan = lifespan
        self._lifespan_stack = contextlib.AsyncExitStack()

    # -- state ------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"new"``, ``"active"``, ``"stopped"`` (not fetching) or ``"closed"``."""
        return self._state

    @property
    def status(self) -> str:
        """The status written in the heartbeat: ``"active"`` or ``"stopped"``."""
        return _STATUS_ACTIVE if self._state == "active" else _STATUS_STOPPED

    @property
    def served_queues(self) -> list[str]:
        """The queues served now: the names of ``queues`` and the current matches of its
        patterns."""
        return self.queue_set.names()

    @property
    def running_tasks(self) -> int:
        """Handlers running now."""
        return len(self.active)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, handler: ServeMux | Callable[[Task], Any]) -> None:
        """Start the roles and begin processing with *handler* (a ServeMux or a handler).

        Returns once the roles run. Raises RuntimeError when already started
        or stopped, ServerClosedError after shutdown.
        """
        if self._state == "active":
            raise RuntimeError("the server is already running")
        if self._state == "stopped":
            raise RuntimeError("the server is in the stopped state; waiting for shutdown")
        if self._state == "closed":
            raise ServerClosedError()
        if handler is None:
            raise TypeError("server cannot start: the handler is None")
        fn = handler if isinstance(handler, ServeMux) else as_async_handler(handler)
        await check_tls(self.redis)  # an unverifiable certificate fails now, with its reason
        await self._say_if_unreachable()
        context = contextvars.copy_context()  # the roles' context: the lifespan state goes here
        if self._lifespan is not None:
            state = await self._lifespan_stack.enter_async_context(self._lifespan())
            context.run(state_var.set, state)
        fn = self._progress.wrap(self._hooks.instrument(fn))
        self._hooks.attach()
        cfg = self.config
        watcher: QueueWatcher | None = None
        if self.queue_set.dynamic:
            watcher = QueueWatcher(
                self._deps,
                cfg.queue_refresh_interval,
                wakeup=self._wakeup,
                ordered=cfg.ordered_queues,
            )
            await refresh_once(watcher)  # the patterns' current matches before any fetch
        served = self.queue_set.names()
        for qname in cfg.ordered_queues:  # asyncq flow control, read by the scripts
            if not is_pattern(qname):
                await self.redis.set(keys.ordered_key(qname), "1")
            else:  # the served queues matching it now; the watcher marks later ones
                for match in fnmatch.filter(served, qname):
                    await self.redis.set(keys.ordered_key(match), "1")
        self._state = "active"
        self.started_at = datetime.now(UTC)
        self.log.info(
            "starting processing",
            server_id=self.server_id,
            concurrency=cfg.concurrency,
            queues=dict(cfg.queues),
            served=len(served),
            strict_priority=cfg.strict_priority,
        )
        deps = self._deps
        self.processor = Processor(
            deps,
            handler=fn,
            active=self.active,
            wakeup=self._wakeup,
            defer_write=self.syncer.add,
            on_burst_done=self._begin_shutdown,
            notifier=CompletionNotifier(self.redis),
            write_limit=write_limit(self.redis),
            hooks=self._hooks,
        )
        subscriber = Subscriber(
            deps, active=self.active, wakeup=self._wakeup, pubsub=self.connection.pubsub
        )
        identity = ServerIdentity(host=self.host, pid=self.pid, server_id=self.server_id)
        roles: list[Role] = [
            Heartbeater(
                deps,
                cfg.heartbeat_interval,
                active=self.active,
                identity=identity,
                status=lambda: self.status,
                started_at=lambda: self.started_at,
            )
        ]
        independent = self._independent_target
        roles.append(
            Watchdog(
                deps,
                active=self.active,
                threshold=max(0.5, min(1.0, cfg.heartbeat_interval)),
                keep_leases_with=None if independent is None else (lambda: independent),
                on_stall=self._hooks.loop_stalled,
            )
        )
        if cfg.health_check is not None:
            roles.append(HealthChecker(deps, cfg.health_check_interval, ping=self.redis.ping))
        roles += [
            subscriber,
            self.syncer,
            Recoverer(deps, cfg.recoverer_interval, active=self.active, wakeup=self._wakeup),
            Forwarder(deps, cfg.delayed_task_check_interval, wakeup=self._wakeup),
            self.processor,
            Janitor(deps, cfg.janitor_interval),
        ]
        if watcher is not None:
            roles.append(watcher)
        if cfg.group_aggregator is not None:
            roles.append(
                GroupAggregatorRole(
                    deps, cfg.group_check_interval, enqueue=self._enqueue_aggregated
                )
            )
        self._roles = roles
        started = asyncio.Event()
        self._main = asyncio.create_task(
            self._run_roles(started), name="asyncq-server", context=context
        )
        await started.wait()
        # Subscribed before returning, so a task enqueued right after start() wakes us;
        # if Redis is down this returns after the first failed attempt and the
        # subscriber keeps retrying in the background.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await subscriber.attempted.wait()

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

    async def _run_roles(self, started: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            for role in self._roles:
                self._role_tasks[role.name] = tg.create_task(
                    supervise(role), name=f"asyncq-{role.name}"
                )
            started.set()

    def stop(self) -> None:
        """Stop fetching new tasks; running handlers finish (asynq's Stop, SIGTSTP)."""
        if self._state != "active":
            return
        self._state = "stopped"
        self.log.info("stopping processor: no new tasks will be fetched")
        if self.processor is not None:
            self.processor.stop_fetching()

    async def shutdown(self) -> None:
        """Stop, wait for running handlers up to ``shutdown_timeout``, requeue the rest, exit.

        Safe to call more than once and from several tasks.
        """
        if self._state == "new":
            self._state = "closed"
            await self.connection.aclose()
            self._closed.set()
            return
        if self._shutdown_task is None and self._state == "closed":
            return  # closed without ever starting
        await asyncio.shield(self._begin_shutdown())

    def force_shutdown(self) -> None:
        """Make a running or upcoming shutdown skip waiting: handlers are cancelled without
        requeueing (their tasks come back through lease recovery)."""
        self._force.set()
        if self._state in ("active", "stopped"):
            self._begin_shutdown()

    async def wait_closed(self) -> None:
        """Wait until the server has shut down (e.g. a burst run finished)."""
        await self._closed.wait()

    async def _enqueue_aggregated(self, task: Task, queue: str) -> TaskInfo:
        if self._enqueuer is None:
            # The server's Connection, fast transport included; shared, so it stays open.
            self._enqueuer = Client(self.connection)
        return await self._enqueuer.enqueue(task, queue=queue)

    def _begin_shutdown(self) -> asyncio.Task[None]:
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.get_running_loop().create_task(
                self._shutdown(), name="asyncq-shutdown"
            )
        return self._shutdown_task

    async def _shutdown(self) -> None:
        self._state = "closed"
        self.log.info("starting graceful shutdown")
        rank = {name: i for i, name in enumerate(SHUTDOWN_ORDER)}
        try:
            for role in sorted(self._roles, key=lambda r: rank.get(r.name, len(rank))):
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
            self._closed.set()
            self.log.info("exiting", processed=self.stats.succeeded + self.stats.failed)

    async def _stop_role(self, role: Role) -> None:
        force = self._force.is_set()
        await role.drain(self.config.shutdown_timeout, force=self._force)
        task = self._role_tasks.get(role.name)
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5 if force else 5.0):
                    await asyncio.shield(task)
            if not task.done():
                self.log.warning("role did not stop in time; cancelling it", role=role.name)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
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

        # The handlers go in before start(): a signal that arrives while the server
        # starts (a supervisor, systemd or Kubernetes stopping it at once) must not
        # meet the default action, which kills (SIGTERM) or suspends (SIGTSTP) the process.
        async with signal_handlers(self.log, on_repeat=on_repeat, on_stop=on_stop) as signals:
            await self.start(handler)
            if stop_requested:
                self.stop()
            if threading.current_thread() is threading.main_thread():
                # Not in burst mode (it ends by itself) nor under `asyncq worker
                # --processes`, whose supervisor prints them once for all its workers.
                if self._announce_signals and not self.config.burst:
                    log_signal_hints(self.log)
            else:
                self.log.warning("not in the main thread: no signal handlers installed")
            await signals.wait_or(self._closed.wait())
            await self.shutdown()

    async def ping(self) -> None:
        """Check that Redis answers; raises a redis-py error when it does not."""
        await self.redis.ping()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.shutdown()

    def __repr__(self) -> str:
        return (
            f"<Server id={self.server_id} state={self._state} "
            f"queues={dict(self.config.queues)} concurrency={self.config.concurrency}>"
        )
