"""The forwarder role (asynq's forwarder).

Every ``delayed_task_check_interval`` (5 s) it moves the due tasks of the
``scheduled`` and ``retry`` sets to their queue's pending list (or back into
their group), all queues in one script call per Redis node. It runs once at
start too, so a restarted worker does not wait an interval for overdue tasks,
and it wakes this server's processor when it moved anything.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from asyncq._worker.roles import PeriodicRole, RoleDeps

__all__ = ["Forwarder"]


class Forwarder(PeriodicRole):
    """Moves due scheduled and retry tasks to pending."""

    name: ClassVar[str] = "forwarder"

    def __init__(self, deps: RoleDeps, interval: float, *, wakeup: asyncio.Event) -> None:
        super().__init__(deps, interval)
        self._wakeup = wakeup

    async def tick(self) -> None:
        moved = await self.broker.forward_queues(self.queues.names())
        if moved:
            self.stats.forwarded += moved
            self._wakeup.set()
