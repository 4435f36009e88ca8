"""The semaphore bounding a server's concurrent handlers.

A counting semaphore of ``concurrency`` slots with the one extra the batched
fetch needs: :meth:`Slots.take_all` waits for at least one free slot and takes
every free slot at once, up to a bound, so a single ``dequeue_many`` call can fill
them.
Each started handler gives its slot back with :meth:`Slots.release`; slots a
fetch did not fill are released right after it. :meth:`Slots.wait` returns
once every slot is free again: no fetch in flight and no handler running,
which is what a graceful shutdown waits for.
"""

from __future__ import annotations

import asyncio

__all__ = ["Slots"]


class Slots:
    """*capacity* handler slots; see the module docstring."""

    __slots__ = ("_all_free", "_changed", "_closed", "_free", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._changed = asyncio.Event()
        self._all_free = asyncio.Event()
        self._all_free.set()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the processor fetches no more)."""
        return self._closed

    @property
    def free(self) -> int:
        """Slots neither held by a handler nor by a fetch in flight."""
        return self._free

    async def take_all(self, most: int) -> int:
        """Wait for a free slot, then take every free slot, up to *most*; 0 once
        :meth:`close` was called."""
        while self._free <= 0 and not self._closed:
            self._changed.clear()
            await self._changed.wait()
        if self._closed:
            return 0
        taken = min(self._free, most)
        self._free -= taken
        self._all_free.clear()
        return taken

    def try_take(self) -> bool:
        """Take one free slot if there is one (a task delivered without a fetch)."""
        if self._free <= 0 or self._closed:
            return False
        self._free -= 1
        self._all_free.clear()
        return True

    def release(self, n: int = 1) -> None:
        """Give *n* slots back."""
        if n <= 0:
            return
        if self._free + n > self.capacity:
            raise RuntimeError(
                f"released more slots than taken ({self._free + n} > {self.capacity})"
            )
        self._free += n
        self._changed.set()
        if self._free == self.capacity:
            self._all_free.set()

    async def wait(self) -> None:
        """Return once every slot is free (no handler running, no fetch in flight)."""
        await self._all_free.wait()

    def close(self) -> None:
        """No more fetches: a waiting or later :meth:`take_all` returns 0 at once."""
        self._closed = True
        self._changed.set()

    def __repr__(self) -> str:
        return f"<Slots {self._free}/{self.capacity} free{' closed' if self._closed else ''}>"
