"""The worker's local view of a task lease (asynq's ``base.Lease``), and its extension.

Redis holds the authoritative lease (``asynq:{q}:lease`` scored by expiry);
a :class:`Lease` mirrors it so that a worker never writes a task's outcome
once its lease may have passed to another server (:meth:`Lease.valid`).

Expiry is an event of the lease itself, as asynq's ``Lease.Done()`` channel:
when the heartbeater finds a running task's lease already run out it calls
:meth:`Lease.expire`, which sets the lease's :attr:`Lease.expired` event (once)
and calls its ``on_expired`` callback, with which the processor cancels that
task's handler (``LeaseExpiredError``). Nothing waits on the event per task:
the callback costs no task or future, and the event exists (created on first
use) for whoever wants to await the loss.

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
    """A lease expiring at a unix time, with its own expiry event; see the module docstring."""

    __slots__ = ("_clock", "_event", "_expired", "expires_at", "on_expired")

    def __init__(
        self,
        expires_at: float,
        *,
        clock: Callable[[], float] = time.time,
        on_expired: Callable[[], object] | None = None,
    ) -> None:
        self.expires_at = expires_at
        self._clock = clock
        self._expired = False
        self._event: asyncio.Event | None = None
        self.on_expired = on_expired
        """Called once by :meth:`expire` (the processor cancels the task's handler)."""

    def valid(self) -> bool:
        """True while the lease has not run out (asynq: expiry at or after now)."""
        return not self._expired and self._clock() <= self.expires_at

    def remaining(self) -> float:
        """Seconds left (negative once expired)."""
        return self.expires_at - self._clock()

    def extend(self, expires_at: float) -> bool:
        """Move the expiry to *expires_at*; refused (False) once the lease has expired."""
        if not self.valid():
            return False
        self.expires_at = max(self.expires_at, expires_at)
        return True

    @property
    def expired(self) -> asyncio.Event:
        """Set once the lease has been declared lost (:meth:`expire`)."""
        if self._event is None:
            self._event = asyncio.Event()
            if self._expired:
                self._event.set()
        return self._event

    @property
    def is_expired(self) -> bool:
        """True once :meth:`expire` has been called."""
        return self._expired

    def expire(self) -> bool:
        """Declare the lease lost: set :attr:`expired` and call ``on_expired``, once.

        True the first time, False afterwards.
        """
        if self._expired:
            return False
        self._expired = True
        if self._event is not None:
            self._event.set()
        if self.on_expired is not None:
            self.on_expired()
        return True

    def __repr__(self) -> str:
        state = "expired" if self._expired else f"{self.remaining():.1f}s left"
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
