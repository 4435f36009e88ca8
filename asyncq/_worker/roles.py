"""The server's roles: :class:`Role` (a :class:`~asyncq._supervision.ServiceRole` given
the server's broker, settings and counters) and :class:`PeriodicRole`.

Every role (processor, heartbeater, watchdog, forwarder, recoverer, janitor,
syncer, subscriber, history, healthchecker, queue watcher, aggregator: the last
four only when configured) is one asyncio task in the server's TaskGroup, running
:func:`~asyncq._supervision.supervise` around the role's ``run()``, started with a
handshake (a role that cannot start fails the server's ``start()`` with its own
error). At shutdown the server calls each role's :meth:`Role.drain`, waits for its
task, then :meth:`Role.finish`, role after role in the order declared in
:mod:`asyncq._worker.server`.

Crash policy (:mod:`asyncq._supervision`): **restart with exponential backoff**, each
crash counted in ``Server.stats.role_restarts[<role>]``. Failing the whole server
instead would turn a bug in, say, the janitor into lost throughput for every queue,
while the processor's running handlers do not depend on any other role. Redis errors
are not crashes: the periodic roles log them at a bounded rate (one line per 3 s) and
try again at their next interval.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from asyncq._redis.errors import REDIS_ERRORS
from asyncq._supervision import ServiceRole, supervise

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


class Role(ServiceRole):
    """A background role of a server: ``run()`` loops until :meth:`request_stop`."""

    def __init__(self, deps: RoleDeps) -> None:
        super().__init__(deps.log)
        self.broker = deps.broker
        self.config = deps.config
        self.stats = deps.stats
        self.queues = deps.queues

    def crashed(self) -> None:
        self.stats.role_restarts[self.name] += 1

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
