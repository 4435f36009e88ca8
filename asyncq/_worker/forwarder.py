"""The forwarder role (asynq's forwarder, woken when tasks are due).

It moves the due tasks of the ``scheduled`` and ``retry`` sets to their queue's
pending list (or back into their group), all queues in one script call per
Redis node, and wakes this server's processor when it moved anything.

When it runs: at start (a restarted worker does not wait for overdue tasks),
then when the next task is due. The same script call that moves the due tasks
answers the earliest score left in those sets, and the forwarder sleeps until
then (at least :attr:`Forwarder.MIN_WAIT`, at most ``delayed_task_check_interval``,
5 s); a retry this server writes (:attr:`asyncq._broker.Broker.on_retry`) wakes
it earlier when it is due before the planned pass. So a task moves when it is due,
not up to 5 s later (asynq's fixed 5 s pass: a 1 s retry delay gave retries about
5 s apart), and each due time costs one pass per worker, as before. What it learns
only at its next pass: a task scheduled by another process (a client's
``process_in``, another worker's retry) due before the planned wake: that one
moves at most ``delayed_task_check_interval`` late, as under asynq, unless
another worker's forwarder moves it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import ClassVar

from asyncq._redis.errors import REDIS_ERRORS
from asyncq._worker.roles import PeriodicRole, RoleDeps

__all__ = ["Forwarder"]


class Forwarder(PeriodicRole):
    """Moves due scheduled and retry tasks to pending, when they are due."""

    name: ClassVar[str] = "forwarder"

    MIN_WAIT: ClassVar[float] = 0.05
    """Least seconds between two passes: scores are whole seconds, and a pass that left
    a due task (another worker's move racing ours) must not spin."""

    def __init__(self, deps: RoleDeps, interval: float, *, wakeup: asyncio.Event) -> None:
        super().__init__(deps, interval)
        self._wakeup = wakeup
        self.next_wait = interval
        """Seconds from the last pass to the next one."""
        self._wake_at = math.inf  # loop time of the next pass
        self._nudged = asyncio.Event()  # the next pass moved earlier, or stop requested

    def due_at(self, at: float) -> None:
        """A task is due at *at* (unix s, the broker's clock): pass then, if that is
        earlier than planned. Cheap; called for each retry this server writes."""
        when = asyncio.get_running_loop().time() + (at - self.broker.clock())
        if when < self._wake_at:
            self._wake_at = when
            self._nudged.set()

    def request_stop(self) -> None:
        super().request_stop()
        self._nudged.set()

    async def run(self) -> None:
        while not self.stopping:
            try:
                await self.tick()
            except REDIS_ERRORS as exc:
                self.redis_error(f"{self.name} failed", exc)
                self.next_wait = self.interval
            await self._sleep_until_due(self.next_wait)

    async def tick(self) -> None:
        clock = self.broker.clock
        moved, earliest = await self.broker.forward_due(self.queues.names())
        wait = self.interval
        if earliest is not None:
            wait = min(wait, earliest - clock())
        self.next_wait = max(self.MIN_WAIT, wait)
        if moved:
            self.stats.forwarded += moved
            self._wakeup.set()

    async def _sleep_until_due(self, seconds: float) -> None:
        # Loop time (monotonic): the broker's clock says when a task is due, the loop
        # how long is left to wait.
        loop = asyncio.get_running_loop()
        # A retry written during the pass is kept if it is due earlier.
        self._wake_at = min(self._wake_at, loop.time() + seconds)
        # Never two passes closer than the floor, however many retries come due now
        # (rate-limited tasks sent back for a few hundred ms, say).
        floor = loop.time() + self.MIN_WAIT
        try:
            while not self.stopping:
                left = max(self._wake_at, floor) - loop.time()
                if left <= 0:
                    return
                self._nudged.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._nudged.wait()
        finally:
            self._wake_at = math.inf
