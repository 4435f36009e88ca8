"""The janitor role (asynq's janitor).

Every ``janitor_interval`` (8 s, first run after one interval) it deletes, per
queue and ``janitor_batch_size`` (100) at a time, the completed tasks whose
retention has expired; all queues go in one script call per Redis node.
"""

from __future__ import annotations

from typing import ClassVar

from asyncq._worker.roles import PeriodicRole

__all__ = ["Janitor"]


class Janitor(PeriodicRole):
    """Deletes completed tasks past their retention."""

    name: ClassVar[str] = "janitor"
    run_at_start: ClassVar[bool] = False

    async def tick(self) -> None:
        batch = self.config.janitor_batch_size
        # One script call per Redis node for all queues, repeated while a batch was full.
        deleted = await self.broker.delete_expired_completed_queues(self.queues.names(), batch)
        self.stats.janitor_deleted += deleted
