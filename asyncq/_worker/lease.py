"""The worker's local view of a task lease (asynq's ``base.Lease``), and its extension.

Redis holds the authoritative lease (``asynq:{q}:lease`` scored by expiry);
a :class:`Lease` mirrors it so that a worker never writes a task's outcome
once its lease may have passed to another server (:meth:`Lease.valid`).

Expiry is an event of the lease itself, as asynq's ``Lease.Done()`` channel:
:attr:`Lease.expired`, an asyncio future done once the lease is lost. When the
heartbeater finds a running task's lease already run out it calls
:meth:`Lease.expire`, which resolves it (once). Each task's coroutine waits for
the first of its handler, this event, a cancel request and its deadline
(:mod:`asyncq._worker.select`), as asynq's ``exec`` selects on ``<-lease.Done()``.

Extension has one place, :func:`extend_leases`, used by the two callers that
keep leases alive: the heartbeater every ``heartbeat_interval`` and, while the
event loop is blocked, the watchdog's thread (see :mod:`asyncq._worker.watchdog`).
:meth:`Lease.extend` only ever moves the expiry later and refuses a lease that
is no longer valid; it is a plain attribute update, safe from that thread.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from asyncq._redis.errors import REDIS_ERRORS

if TYPE_CHECKING:
    from asyncq._worker.broker import WorkerBroker

__all__ = ["Lease", "extend_leases"]

_EXTEND_ERRORS: tuple[type[Exception], ...] = (
    *(e for e in REDIS_ERRORS if issubclass(e, Exception)),
    ValueError,
)


class Lease:
    """A lease expiring at a unix time, with its own expiry event; see the module docstring.

    Made in the running event loop, or for *loop* (its event is a future of that loop)."""

    __slots__ = ("_clock", "expired", "expires_at")

    def __init__(
        self,
        expires_at: float,
        *,
        clock: Callable[[], float] = time.time,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.expires_at = expires_at
        self._clock = clock
        self.expired: asyncio.Future[None] = asyncio.Future(loop=loop or asyncio.get_running_loop())
        """Done once the lease has been declared lost (:meth:`expire`): another server may
        own the task from then on. Await it, or wait for it beside other events."""

    def valid(self) -> bool:
        """True while the lease has not run out (asynq: expiry at or after now)."""
        return self.valid_at(self._clock())

    def valid_at(self, now: float) -> bool:
        """:meth:`valid` at *now*, a time of this lease's clock the caller has just read."""
        return not self.expired.done() and now <= self.expires_at

    def remaining(self) -> float:
        """Seconds left (negative once expired)."""
        return self.expires_at - self._clock()

    def extend(self, expires_at: float) -> bool:
        """Move the expiry to *expires_at*; refused (False) once the lease has expired."""
        if not self.valid():
            return False
        self.expires_at = max(self.expires_at, expires_at)
        return True

    def expire(self) -> bool:
        """Declare the lease lost: :attr:`expired` is done from now on.

        True the first time, False afterwards.
        """
        if self.expired.done():
            return False
        self.expired.set_result(None)
        return True

    def __repr__(self) -> str:
        state = "expired" if self.expired.done() else f"{self.remaining():.1f}s left"
        return f"<Lease {state}>"


async def extend_leases(
    broker: WorkerBroker, by_queue: Mapping[str, Sequence[tuple[str, Lease]]]
) -> list[tuple[str, list[str], Exception]]:
    """Extend in Redis, then locally, the leases of ``{queue: [(task id, lease), ...]}``.

    One ``extend_lease`` call per queue; the local expiry becomes what Redis
    now holds (whole seconds). A queue whose call fails keeps its old expiries
    and the others are still extended: returns ``(queue, task ids, error)`` per
    failed queue for the caller to log (Redis errors; ValueError for a queue
    name the broker refuses, e.g. a malformed message's).
    """
    failed: list[tuple[str, list[str], Exception]] = []
    for qname, leases in by_queue.items():
        ids = [task_id for task_id, _ in leases]
        try:
            expiry = await broker.extend_lease(qname, ids)
        except _EXTEND_ERRORS as exc:
            failed.append((qname, ids, exc))
            continue
        whole = math.floor(expiry)
        for _, lease in leases:
            lease.extend(whole)
    return failed
