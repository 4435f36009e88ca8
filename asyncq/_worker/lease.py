"""The worker's local view of a task lease (asynq's ``base.Lease``).

Redis holds the authoritative lease (``asynq:{q}:lease`` scored by expiry);
this object mirrors it so that a worker never writes a task's outcome once its
lease may have passed to another server. The heartbeater extends live leases
and, when one has already run out, calls :meth:`Lease.notify_expired`. That
marks the lease expired (:attr:`Lease.declared_expired`) and sets the
:class:`asyncio.Event` the lease was given (``signal``): the processor's lease
supervision awaits that event and cancels every handler whose lease is
declared expired, with :class:`~asyncq.errors.LeaseExpiredError` as the cause.
The lease itself runs no code on expiry, and one event serves all the leases
of a processor, so a running handler costs no extra task or future.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["Lease"]


class Lease:
    """A lease expiring at a unix time; declaring it expired sets its supervision's event."""

    __slots__ = ("_clock", "_notified", "_signal", "expires_at")

    def __init__(
        self,
        expires_at: float,
        *,
        clock: Callable[[], float] = time.time,
        signal: asyncio.Event | None = None,
    ) -> None:
        self.expires_at = expires_at
        self._clock = clock
        self._signal = signal
        self._notified = False

    def valid(self) -> bool:
        """True while the lease has not run out (asynq: expiry at or after now)."""
        return not self._notified and self._clock() <= self.expires_at

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
    def declared_expired(self) -> bool:
        """True once :meth:`notify_expired` has been called."""
        return self._notified

    def notify_expired(self) -> bool:
        """Declare the lease expired and set its ``signal`` (idempotent); True the first time."""
        if self._notified:
            return False
        self._notified = True
        if self._signal is not None:
            self._signal.set()
        return True

    def __repr__(self) -> str:
        state = "expired" if self._notified else f"{self.remaining():.1f}s left"
        return f"<Lease {state}>"
