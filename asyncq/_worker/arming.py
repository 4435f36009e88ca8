"""Direct delivery, the idle worker's side: asking Redis for the next task of its queues.

An idle processor *arms* itself after an empty fetch (see
:mod:`asyncq._broker.delivery`): a credit of one task in Redis, renewed while it
stays idle, and this server's name in the waiters list of each queue it may be
delivered from. :class:`Arming` keeps what that needs between two asks: when the
credit was renewed, whether a delivery used it up, which lists name the server
and when they were written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asyncq._logging import RateLimiter, error_text
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._worker.limits import QueueLimits
from asyncq._worker.queueset import QueueSet
from asyncq._worker.slots import Slots

if TYPE_CHECKING:
    from asyncq._worker.broker import WorkerBroker

__all__ = ["DELIVERY_TTL", "REGISTER_EVERY", "Arming"]

DELIVERY_TTL = 15.0
"""Seconds a delivery credit lasts: three tracked idle waits, each of which renews it."""
REGISTER_EVERY = 600.0
"""Seconds between two registrations of an idle server in its queues' waiters lists (each
list lasts :data:`~asyncq._broker.delivery.WAITERS_TTL` after the last one)."""


class Arming:
    """One server's credit and registrations for direct delivery; see the module docstring."""

    def __init__(
        self,
        broker: WorkerBroker,
        *,
        server_id: str,
        queues: QueueSet,
        limits: QueueLimits,
        slots: Slots,
        log: Any,
    ) -> None:
        self._broker = broker
        self._server_id = server_id  # whose delivery channel the subscriber listens on
        self._queues = queues
        self._limits = limits
        self._slots = slots
        self._log = log
        self._clock: Callable[[], float] = broker.clock
        self._registered = (-1, 0.0)  # QueueSet version and time of the last registration
        self.waiting_in: set[str] = set()
        """The queues whose waiters lists name this server (left at shutdown)."""
        self._armed_at = -math.inf  # when the credit was last renewed
        self._spent = False  # a task was delivered to us since: the credit is used up
        self._errors = RateLimiter(3.0)

    def spent(self) -> None:
        """A task was delivered: the credit is used up, the next :meth:`arm` asks again."""
        self._spent = True

    async def arm(self) -> None:
        """Ask Redis for the next task of our queues to be delivered to us: after each
        task delivered (the credit is used up), else after an empty fetch at most every third of
        :data:`DELIVERY_TTL` (which keeps the credit alive). Writes this server into the
        queues' waiters lists when the queues changed, every :data:`REGISTER_EVERY`
        seconds (a ``queue rm`` or FLUSHALL drops the lists), or once the credit expired.
        Nothing while every slot is taken (the next empty fetch asks) or once the processor
        stopped fetching; an ask that lands after the stop is withdrawn at once."""
        now = self._clock()
        if not self._spent and now < self._armed_at + DELIVERY_TTL / 3:
            return
        queues = self._limits.unlimited(self._queues.names())
        if not queues or self._slots.free <= 0 or self._slots.closed:
            return
        self._armed_at, self._spent = now, False
        version, when = self._registered
        fresh = version == self._queues.version and now < when + REGISTER_EVERY
        try:
            if not fresh or not await self._broker.arm_delivery(self._server_id, DELIVERY_TTL):
                self.waiting_in.update(queues)
                await self._broker.arm_delivery(self._server_id, DELIVERY_TTL, queues)
                self._registered = (self._queues.version, now)
        except REDIS_ERRORS as exc:
            self._spent = True  # the credit is unknown: ask again after the next empty fetch
            if self._errors.allow():
                self._log.warning(
                    "could not ask for direct delivery; tasks are fetched instead",
                    error=error_text(exc),
                    suppressed_since_last=self._errors.take_suppressed(),
                )
            return
        if self._slots.closed:
            # The processor stopped while this ask was on its way: its withdrawal may have
            # landed first, so withdraw again (a task delivered now would wait for its lease).
            await self.disarm()

    async def disarm(self) -> None:
        """Stop being delivered tasks and leave the waiters lists (the credit would expire
        on its own, :data:`DELIVERY_TTL`)."""
        try:
            await self._broker.disarm_delivery(self._server_id, sorted(self.waiting_in))
        except REDIS_ERRORS as exc:  # the credit expires on its own
            self._log.info("could not withdraw from direct delivery", error=error_text(exc))
