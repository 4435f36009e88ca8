"""asynq's ``select`` around a handler awaited inline: the first of its events stops it.

asynq's ``exec`` runs the handler in a goroutine and selects on {the handler
done, ``<-lease.Done()``, ``<-ctx.Done()``} (a cancel request or the deadline),
acting on whichever came first. A task's coroutine here awaits its handler
inline, in its own asyncio task, rather than in a second one (which costs about
a third more worker CPU per task, measured in issue 38): a :class:`FirstOf`
around that await waits for its events beside it, the way ``asyncio.timeout``
waits for a deadline beside what it wraps. The events are asyncio futures (the
lease's :attr:`~asyncq._worker.lease.Lease.expired`, the task's
:attr:`~asyncq._worker.active.ActiveTask.cancelled`) and a loop timer for the
deadline. The first to come records which it was (:attr:`FirstOf.first`) and
wakes the coroutine from its await by cancelling it (from the loop, as a done
callback runs); the scope takes that cancellation back on its way out, and the
coroutine acts on :attr:`FirstOf.first`. An event that happened before the
handler's end counts as first even when the loop had yet to run its callback (a
cancel landing in the turn the handler would return wins); when the handler
returns first, the events are dropped unheard.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

__all__ = ["DEADLINE", "FirstOf"]

DEADLINE = "deadline"
""":attr:`FirstOf.first` when the deadline came first."""


class FirstOf:
    """``with FirstOf(events, deadline): await handler``; see the module docstring.

    A plain (not async) context manager: entering and leaving it await nothing, and
    two coroutines fewer per task is worker CPU saved."""

    __slots__ = ("_deadline", "_events", "_task", "_timer", "_woke", "first")

    def __init__(
        self,
        events: tuple[asyncio.Future[None], ...],
        deadline: float,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        self._events = events
        self._deadline = deadline  # loop time
        self._task = task
        """The task awaiting in the scope (given, or the current one on entering: on 3.11
        ``asyncio.current_task`` is Python code, a call per task saved when given)."""
        self._timer: asyncio.TimerHandle | None = None
        self._woke = False  # the coroutine was cancelled to wake it
        self.first: object = None
        """The event that came before the handler's end (one of the futures, or
        :data:`DEADLINE`); None if none."""

    def came(self) -> bool:
        """Whether an event came before the handler's end (it is being stopped)."""
        return self.first is not None

    def _came(self, event: object) -> None:
        # A done callback or the deadline's timer: run by the loop, between two steps of
        # the coroutine, never from inside one (the handler resolving its own event).
        if self.first is None and self._task is not None:
            self.first = event
            self._woke = True
            self._task.cancel()

    def __enter__(self) -> FirstOf:
        task = self._task
        if task is None:
            task = self._task = asyncio.current_task()
            assert task is not None
        for event in self._events:
            event.add_done_callback(self._came)  # at once if already done: the next turn
        self._timer = task.get_loop().call_at(self._deadline, self._came, DEADLINE)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._timer is not None
        self._timer.cancel()
        for event in self._events:
            event.remove_done_callback(self._came)
        current = self._task
        self._task = None  # no cycle left between the task, its coroutine and this scope
        if not self._woke:
            # No cancellation of ours to take back. An event that came before the
            # handler's end, the loop having yet to run its callback, is still first.
            for event in self._events:
                if event.done():
                    self.first = event
                    break
            return False
        # Take back the cancellation that woke the coroutine: a later ``asyncio.timeout``
        # in the same task (the outcome's write) would take it for its own.
        assert current is not None
        current.uncancel()
        # Swallowed here when it is ours alone; the handler's own failure (it may have
        # turned the cancellation into another error) and a cancellation from outside
        # (loop shutdown) go on.
        return exc_type is asyncio.CancelledError and current.cancelling() == 0
