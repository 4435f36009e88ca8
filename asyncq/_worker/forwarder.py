"""The forwarder role (asynq's forwarder).

Every ``delayed_task_check_interval`` (5 s) it moves the due tasks of the
``scheduled`` and ``retry`` sets to their queue's pending list (or back into
their group). It runs once at start too, so a restarted worker does not wait
an interval for overdue tasks, and it wakes this server's processor when it
moved anything.
"""

from __future__ import annotations

from typing import ClassVar

from asyncq._worker.roles import PeriodicRole

__all__ = ["Forwarder"]


class Forwarder(PeriodicRole):
    """Moves due scheduled and retry tasks to pending."""

    name: ClassVar[str] = "forwarder"

    async def tick(self) -> None:
        server = self.server
        moved = await server.broker.forward_if_ready(list(server.config.queues))
        if moved:
            self.server.stats.forwarded += moved
            if server.processor is not None:
                server.processor.wakeup()
