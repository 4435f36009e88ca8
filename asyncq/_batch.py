"""One event-loop turn of small writes sent as one pipeline.

Completion notices and task events are written by many tasks at about the same
moment. :class:`TurnBatcher` collects what is added during one turn of the event loop
and hands the whole batch to a *send* coroutine (one pipeline), so N writes cost one
round trip instead of N. It never blocks the caller and never raises to it: *send*
owns its errors (these writes are best effort).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["TurnBatcher"]

T = TypeVar("T")


class TurnBatcher(Generic[T]):
    """Collects the items added during one event-loop turn and sends them together."""

    __slots__ = ("_pending", "_send", "_sending")

    def __init__(self, send: Callable[[list[T]], Coroutine[Any, Any, None]]) -> None:
        self._send = send
        self._pending: list[T] = []
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, item: T) -> None:
        """Queue *item*; the first one of a turn schedules the send at the turn's end."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(item)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def aclose(self) -> None:
        """Send what is pending and wait for the sends in flight."""
        self._flush()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
