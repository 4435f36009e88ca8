"""The worker's local view of a task lease (asynq's ``base.Lease``).

Redis holds the authoritative lease (``asynq:{q}:lease`` scored by expiry);
this object mirrors it so that a worker never writes a task's outcome once its
lease may have passed to another server. The heartbeater extends live leases
and, when one has already run out, calls :meth:`Lease.notify_expired`, which
sets :attr:`Lease.expired` and runs the expiry callbacks (the processor's
cancels the handler).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["Lease"]


class Lease:
    """A lease expiring at a unix time, with an expiry event and callbacks."""

    __slots__ = ("_callbacks", "_clock", "_event", "_notified", "expires_at")

    def __init__(self, expires_at: float, *, clock: Callable[[], float] = time.time) -> None:
        self.expires_at = expires_at
        self._clock = clock
        self._event: asyncio.Event | None = None
        self._callbacks: list[Callable[[], object]] | None = None
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
    def expired(self) -> asyncio.Event:
        """An event set when the lease is declared expired (created on first use)."""
        if self._event is None:
            self._event = asyncio.Event()
            if self._notified:
                self._event.set()
        return self._event

    def on_expired(self, callback: Callable[[], object]) -> None:
        """Run *callback* when the lease is declared expired (at once if it already was)."""
        if self._notified:
            callback()
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def notify_expired(self) -> bool:
        """Declare the lease expired (idempotent); True the first time."""
        if self._notified:
            return False
        self._notified = True
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, None
        for cb in callbacks or ():
            cb()
        return True

    def __repr__(self) -> str:
        state = "expired" if self._notified else f"{self.remaining():.1f}s left"
        return f"<Lease {state}>"
