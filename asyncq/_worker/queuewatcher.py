"""The queue watcher role: keeps a server's :class:`~asyncq._worker.queueset.QueueSet` current.

Only started when ``queues`` holds a pattern. Every ``queue_refresh_interval``
(1 s) it reads ``asynq:queues`` (one SMEMBERS) and applies the new matches;
a queue newly matching an ordered pattern is marked ordered before anything
can fetch from it, and the processor is woken when queues were added (their
tasks may be pending already).
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Iterable
from typing import ClassVar

from asyncq._redis.errors import REDIS_ERRORS
from asyncq._worker.queueset import is_pattern
from asyncq._worker.roles import PeriodicRole, RoleDeps

__all__ = ["QueueWatcher", "refresh_once"]


class QueueWatcher(PeriodicRole):
    """Re-reads ``asynq:queues`` and updates the server's :class:`QueueSet` (patterns only)."""

    name: ClassVar[str] = "queuewatcher"

    def __init__(
        self,
        deps: RoleDeps,
        interval: float,
        *,
        wakeup: asyncio.Event,
        ordered: Iterable[str] = (),
    ) -> None:
        super().__init__(deps, interval)
        self._wakeup = wakeup
        self._ordered = [p for p in ordered if is_pattern(p)]

    async def tick(self) -> None:
        queue_set = self.queues
        known = await self.broker.all_queues()
        plan = queue_set.plan(known)
        if not plan.added and not plan.removed:
            return
        # An ordered pattern's new queue is marked before anything fetches from it.
        for qname in sorted(plan.added):
            if any(fnmatch.fnmatchcase(qname, p) for p in self._ordered):
                await self.broker.mark_ordered(qname)
        queue_set.apply(plan)
        self.log.info(
            "queues matching the patterns changed",
            added=sorted(plan.added)[:20],
            removed=sorted(plan.removed)[:20],
            served=len(queue_set),
        )
        if plan.added:
            self._wakeup.set()  # their tasks may be pending already


async def refresh_once(watcher: QueueWatcher) -> None:
    """The first refresh, before the server's roles start; a Redis error is left to the role."""
    try:
        await watcher.tick()
    except REDIS_ERRORS as exc:
        watcher.redis_error("could not read the queue set", exc)
