"""One event-loop turn of small calls sent as one, the coalescer every batcher shares.

Acknowledgements, type-token requests, completion notices and task events are
made by many tasks at about the same moment. :class:`TurnBatcher` collects what
is added during one turn of the event loop and hands the whole batch to a *send*
coroutine (one script call or pipeline), so N calls cost one round trip instead
of N. It never blocks the caller and never raises to it: *send* owns its errors
(it resolves the callers' futures, or drops best-effort writes).

Two ways to send, by who owns the sends:

* Given *spawn* (the owner's TaskGroup): each turn's batch is sent at the end of
  that turn as a task of the owner's group, so leaving the group waits for it;
  sends may overlap (the processor's acknowledgements and type tokens, whose
  callers each wait for their own answer, and must not wait behind another batch).
* Without: one send in flight at a time, as a task of the batcher's own, which
  :meth:`TurnBatcher.aclose` awaits. What is added meanwhile goes out in the next
  batch once it returns, so batches land in the order they were added (two sends
  on two pooled connections could land in either order: a progress event before
  its task's ``started``) and grow, rather than multiply, under load. These are
  the writes that outlive the groups of the tasks that add them (completion
  notices and events are added by a task's last step), so their owner is the
  ``aclose`` that the shutdown awaits after those groups end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["Spawn", "TurnBatcher"]

T = TypeVar("T")

Spawn = Callable[[Coroutine[Any, Any, None]], object]
"""Starts a coroutine as a task of its owner's TaskGroup."""


class TurnBatcher(Generic[T]):
    """Collects the items added during one event-loop turn and sends them together."""

    __slots__ = ("_flushing", "_pending", "_send", "_sending", "_spawn")

    def __init__(
        self, send: Callable[[list[T]], Coroutine[Any, Any, None]], *, spawn: Spawn | None = None
    ) -> None:
        self._send = send
        self._spawn = spawn
        self._pending: list[T] = []
        self._flushing = False  # a flush is scheduled for the end of this turn
        self._sending: asyncio.Task[None] | None = None  # in order only

    def add(self, item: T) -> None:
        """Queue *item*: sent at the end of this turn, or (in order) after the send in flight."""
        self._pending.append(item)
        if not self._flushing and self._sending is None:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._sending is not None or not self._pending:
            return
        batch, self._pending = self._pending, []
        if self._spawn is not None:
            self._spawn(self._send(batch))
            return
        self._sending = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add_done_callback(self._sent)

    def _sent(self, sent: asyncio.Task[None]) -> None:
        if not sent.cancelled():
            sent.exception()  # retrieved: *send* owns its errors, none is left unseen
        if self._sending is sent:  # not already seen to by aclose
            self._sending = None
            self._flush()  # what was added while it was in flight

    async def aclose(self) -> None:
        """Send what is pending and wait until every send of its own has returned."""
        while True:
            self._flush()
            sending = self._sending
            if sending is None:
                return
            await asyncio.gather(sending, return_exceptions=True)
            # Its done callback may not have run yet: from Python 3.12 on, gather
            # returns without yielding when the task has already finished.
            self._sent(sending)
