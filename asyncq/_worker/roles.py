"""Role supervision shared by the server's background roles.

Every role (processor, heartbeater, watchdog, forwarder, recoverer, janitor,
syncer, subscriber, history, healthchecker, queue watcher, aggregator: the last
four only when configured) is one asyncio task in the server's TaskGroup, running
:func:`supervise` around the role's ``run()``, started with a handshake (a role
that cannot start fails the server's ``start()`` with its own error). At shutdown the server calls
each role's :meth:`Role.drain`, waits for its task, then :meth:`Role.finish`,
role after role in the order declared in :mod:`asyncq._worker.server`.

Crash policy: **restart with exponential backoff**. A role whose ``run()``
raises anything but a Redis error is logged at ERROR level with its
traceback, counted in ``Server.stats.role_restarts[<role>]`` and restarted
after a delay that doubles from 0.1 s up to 30 s (reset once the role has run
for a minute without crashing). Failing the whole server instead would turn
a bug in, say, the janitor into lost throughput for every queue, while the
processor's running handlers do not depend on any other role; restarting keeps
the worker serving and the ERROR lines keep the problem loud. Redis errors are
not crashes: the periodic roles log them at a bounded rate (one line per 3 s)
and try again at their next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from anyio import TASK_STATUS_IGNORED
from anyio.abc import TaskStatus

from asyncq._logging import RateLimiter, error_text
from asyncq._redis.errors import REDIS_ERRORS

if TYPE_CHECKING:
    from asyncq._worker.broker import WorkerBroker
    from asyncq._worker.config import ServerConfig, ServerStats
    from asyncq._worker.queueset import QueueSet

__all__ = [
    "PeriodicRole",
    "Role",
    "RoleDeps",
    "supervise",
]


@dataclass(frozen=True, slots=True)
class RoleDeps:
    """What every role of a server shares: its broker, settings, logger and counters.

    A role gets this plus, as keyword arguments, exactly the few other things it
    uses (the active-task registry, the wake-up event, a callback); no role sees
    the ``Server``.
    """

    broker: WorkerBroker
    config: ServerConfig
    log: Any
    stats: ServerStats
    queues: QueueSet
    """The queues served now (names and the current matches of patterns)."""


_RESTART_MIN = 0.1
_RESTART_MAX = 30.0
_HEALTHY_RUN = 60.0


class Role:
    """A background role of a server: ``run()`` loops until :meth:`request_stop`."""

    name: ClassVar[str] = "role"
    reports_started: ClassVar[bool] = False
    """True for a role whose ``run()`` calls :meth:`started` itself, once the server may
    count it started (the subscriber: after its first attempt to subscribe); any other
    role is started as its ``run()`` begins."""

    def __init__(self, deps: RoleDeps) -> None:
        self.broker = deps.broker
        self.config = deps.config
        self.stats = deps.stats
        self.queues = deps.queues
        self.log: Any = deps.log.bind(role=self.name)
        self._stop = asyncio.Event()
        self._redis_errors = RateLimiter(3.0)
        self._task_status: TaskStatus[None] = TASK_STATUS_IGNORED
        self._started = False

    def started(self) -> None:
        """The role serves: its :func:`supervise` handshake completes (once)."""
        self._started = True
        self._task_status.started()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Ask the role to leave its loop at the next opportunity."""
        self._stop.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep up to *seconds*, returning early when the role is asked to stop."""
        if self._stop.is_set() or seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def run(self) -> None:
        raise NotImplementedError

    async def cleanup(self) -> None:
        """Runs once after the role stopped (flushes, clearing server state)."""

    async def drain(self, grace: float, *, force: asyncio.Event) -> None:
        """Shutdown, first step: leave the loop. The processor waits up to *grace* for
        its handlers first (until *force* is set)."""
        self.request_stop()

    async def finish(self, *, forced: bool) -> None:
        """Shutdown, last step, once ``run()`` returned: :meth:`cleanup`. A forced
        shutdown (a second signal) may skip what would wait on Redis."""
        await self.cleanup()

    def redis_error(self, event: str, exc: BaseException, **kw: Any) -> None:
        """Log a Redis failure, at most once per 3 s per role."""
        if self._redis_errors.allow():
            suppressed = self._redis_errors.take_suppressed()
            self.log.warning(
                event,
                error=error_text(exc),
                suppressed_since_last=suppressed,
                **kw,
            )


class PeriodicRole(Role):
    """A role that calls :meth:`tick` every :attr:`interval` seconds."""

    run_at_start: ClassVar[bool] = True

    def __init__(self, deps: RoleDeps, interval: float) -> None:
        super().__init__(deps)
        self.interval = interval

    async def tick(self) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        if not self.run_at_start:
            await self.sleep(self.interval)
        while not self.stopping:
            try:
                await self.tick()
            except REDIS_ERRORS as exc:
                self.redis_error(f"{self.name} failed", exc)
            await self.sleep(self.interval)


async def supervise(role: Role, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
    """Run *role* until it stops, restarting it with backoff when it crashes.

    *task_status* is anyio's start handshake (:mod:`asyncq._taskstart`): started once the
    role is (see :attr:`Role.reports_started`). A crash before that is a failed start, not
    a crash to restart from: it is raised, to whoever started the role.
    """
    role._task_status = task_status
    if not role.reports_started:
        role.started()
    attempts = 0
    while True:
        started = time.monotonic()
        try:
            await role.run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not role._started:
                raise
            if time.monotonic() - started >= _HEALTHY_RUN:
                attempts = 0
            attempts += 1
            role.stats.role_restarts[role.name] += 1
            if role.stopping:
                role.log.error("role crashed while stopping", exc_info=exc)
                return
            delay = min(_RESTART_MAX, _RESTART_MIN * 2 ** (attempts - 1))
            role.log.error(
                "role crashed; restarting", restart_in=round(delay, 3), crashes=attempts,
                exc_info=exc,
            )  # fmt: skip
            await role.sleep(delay)
            if role.stopping:
                return
