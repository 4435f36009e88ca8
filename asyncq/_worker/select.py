"""asynq's ``select`` around a handler awaited inline: the first of its events stops it.

asynq's ``exec`` runs the handler in a goroutine and selects on {the handler
done, ``<-lease.Done()``, ``<-ctx.Done()``} (a cancel request or the deadline),
acting on whichever came first. A task's coroutine here awaits its handler
inline, in its own asyncio task, rather than in a second one (which costs about
a third more worker CPU per task, measured in issue 38): a :class:`FirstOf`
around that await waits for its events beside it, the way ``asyncio.timeout``
waits for a deadline beside what it wraps. The first event to come records
which it was (:attr:`FirstOf.first`) and wakes the coroutine from its await by
cancelling it; the scope takes that cancellation back on its way out, and the
coroutine acts on :attr:`FirstOf.first`. An event that happened before the
handler's end counts as first even when the loop had yet to run its callback (a
cancel landing in the turn the handler would return wins); when the handler
returns first, the events are dropped unheard.

How it hears them, cheaply (issue 40): each event's source (the task's
:class:`~asyncq._worker.lease.Lease`, its
:class:`~asyncq._worker.active.ActiveTask` for a cancel request) points to the
scope while it waits (its ``waiter``), and tells it when it fires
(:meth:`FirstOf.fire`): two attribute writes on the way in and two on the way
out, instead of two futures and their callbacks per task. The scope wakes the
coroutine from the loop, as a future's done callback would (never from inside
the coroutine's own step, which the handler firing its own event would be).
The sources' futures (``Lease.expired``, ``ActiveTask.cancelled``) remain for
other waiters, created only when one asks.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Protocol

__all__ = ["DEADLINE", "FirstOf", "Source"]

DEADLINE = "deadline"
""":attr:`FirstOf.first` when the deadline came first."""


class Source(Protocol):
    """An event source a :class:`FirstOf` waits on: it calls ``waiter.fire(self)`` when
    its event happens while a waiter is set."""

    waiter: Any


class FirstOf:
    """``with FirstOf(sources, deadline): await handler``; see the module docstring.

    A plain (not async) context manager: entering and leaving it await nothing, and
    two coroutines fewer per task is worker CPU saved."""

    __slots__ = ("_deadline", "_sources", "_task", "_timer", "_woke", "first")

    def __init__(
        self, sources: tuple[Source, ...], deadline: float, task: asyncio.Task[Any] | None = None
    ) -> None:
        self._sources = sources
        self._deadline = deadline  # loop time
        self._task = task
        """The task awaiting in the scope (given, or the current one on entering: on 3.11
        ``asyncio.current_task`` is Python code, a call per task saved when given)."""
        self._timer: asyncio.TimerHandle | None = None
        self._woke = False  # the coroutine was cancelled to wake it
        self.first: object = None
        """The source whose event came before the handler's end (or :data:`DEADLINE`);
        None if none."""

    def came(self) -> bool:
        """Whether an event came before the handler's end (it is being stopped)."""
        return self.first is not None

    def fire(self, source: object) -> None:
        """*source*'s event happened: it is first if nothing came before and the handler
        has yet to end; the coroutine is woken from the loop's next turn."""
        if self.first is None and self._task is not None:
            self.first = source
            self._task.get_loop().call_soon(self._wake)

    def _wake(self) -> None:
        if self._task is not None:  # the handler's end did not come in between
            self._woke = True
            self._task.cancel()

    def _deadline_came(self) -> None:
        if self.first is None and self._task is not None:
            self.first = DEADLINE
            self._wake()

    def __enter__(self) -> FirstOf:
        task = self._task
        if task is None:
            task = self._task = asyncio.current_task()
            assert task is not None
        for source in self._sources:
            source.waiter = self
        self._timer = task.get_loop().call_at(self._deadline, self._deadline_came)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._timer is not None
        self._timer.cancel()
        for source in self._sources:
            source.waiter = None
        current = self._task
        self._task = None  # no cycle left between the task, its coroutine and this scope
        if not self._woke:
            # No cancellation of ours to take back. An event that came before the
            # handler's end, the loop having yet to wake the coroutine, is still first.
            return False
        # Take back the cancellation that woke the coroutine: a later ``asyncio.timeout``
        # in the same task (the outcome's write) would take it for its own.
        assert current is not None
        current.uncancel()
        # Swallowed here when it is ours alone; the handler's own failure (it may have
        # turned the cancellation into another error) and a cancellation from outside
        # (loop shutdown) go on.
        return exc_type is asyncio.CancelledError and current.cancelling() == 0
