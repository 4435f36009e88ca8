"""The Scheduler's roles, supervised like the Server's (:mod:`asyncq._supervision`).

:class:`SchedulerHeartbeat` rewrites the scheduler's entries record every heartbeat
interval and at once when asked; one :class:`EntryTicker` per registered entry sleeps
until the entry's next tick and fires it. Each runs in the scheduler's TaskGroup under
:func:`~asyncq._supervision.supervise` (a crash is logged and the role restarted with
backoff); the ticks they fire are tasks of that group too, owned by the scheduler. A
role sees no Scheduler: it gets the callables it uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from asyncq._redis.errors import REDIS_ERRORS
from asyncq._scheduling.cron import Schedule
from asyncq._supervision import ServiceRole

__all__ = ["EntryTicker", "SchedulerHeartbeat", "next_tick"]


def next_tick(schedule: Schedule, after: datetime) -> datetime:
    """The schedule's first tick after *after*, in UTC."""
    # Ticks are kept in UTC: same-zone datetime arithmetic runs on the wall clock,
    # and an ambiguous local time never compares equal across zones.
    return schedule.next_after(after).astimezone(UTC)


class SchedulerHeartbeat(ServiceRole):
    """Rewrites the scheduler's entries record (*beat*) every *interval* seconds, and at
    once after :meth:`beat_now` (a register, an unregister, a tick). The first record is
    written when the scheduler starts, before this role runs."""

    name: ClassVar[str] = "heartbeat"

    def __init__(self, log: Any, interval: float, beat: Callable[[], Awaitable[None]]) -> None:
        super().__init__(log)
        self.interval = interval
        self._beat = beat
        self._now = asyncio.Event()

    def beat_now(self) -> None:
        """Write the record at once rather than at the next interval."""
        self._now.set()

    def request_stop(self) -> None:
        super().request_stop()
        self._now.set()  # ends the wait below

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._now.wait()
            if self.stopping:
                return
            self._now.clear()
            try:
                await self._beat()
            except REDIS_ERRORS as exc:
                self.redis_error("could not write scheduler heartbeat", exc)


class EntryTicker(ServiceRole):
    """One entry's ticks: sleeps until the next tick of *schedule*, hands it to *fire*
    (which claims and enqueues it in a task of its own) and moves on, telling *moved*
    each (previous, next) tick. Ticks older than *grace* after a stall (a blocked loop,
    a suspended process) are skipped, with a warning, rather than fired in a burst."""

    name: ClassVar[str] = "ticker"

    def __init__(
        self,
        log: Any,
        schedule: Schedule,
        grace: timedelta,
        *,
        fire: Callable[[datetime], None],
        moved: Callable[[datetime | None, datetime], None],
    ) -> None:
        super().__init__(log)
        self.schedule = schedule
        self.grace = grace
        self._fire = fire
        self._moved = moved

    async def run(self) -> None:
        tick = next_tick(self.schedule, datetime.now(UTC))
        self._moved(None, tick)
        while await self._sleep_until(tick):
            self._fire(tick)
            following = next_tick(self.schedule, tick)
            now = datetime.now(UTC)
            if following + self.grace < now:
                resumed = next_tick(self.schedule, now - self.grace)
                self.log.warning(
                    "scheduler fell behind; skipping ticks older than the misfire grace",
                    first_skipped=following.isoformat(),
                    resumed_at=resumed.isoformat(),
                )
                following = resumed
            self._moved(tick, following)
            tick = following

    async def _sleep_until(self, when: datetime) -> bool:
        """Sleep until *when*; False when asked to stop first."""
        target = when.timestamp()
        # The event loop sleeps on the monotonic clock while ticks are wall-clock
        # instants, so check the wall clock again after waking.
        while (delay := target - time.time()) > 0:
            await self.sleep(delay)
            if self.stopping:
                return False
        return not self.stopping
