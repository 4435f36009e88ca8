"""asynq's ``select`` around a handler awaited inline: the first of its events stops it.

asynq's ``exec`` runs the handler in a goroutine and selects on {the handler
done, ``<-lease.Done()``, ``<-ctx.Done()``} (a cancel request or the deadline),
acting on whichever came first. A task's coroutine here awaits its handler
inline, in its own asyncio task, rather than in a second one (which costs about
a third more worker CPU per task, measured in issue 38): a :class:`FirstOf`
around that await waits for its events beside it, the way ``asyncio.timeout``
waits for a deadline beside what it wraps. The events are asyncio futures (the
lease's :attr:`~asyncq._worker.lease.Lease.expired`, the task's
:attr:`~asyncq._worker.active.ActiveTask.cancelled`) and the deadline, kept by
:class:`Deadlines`. The first to come records which it was (:attr:`FirstOf.first`) and
wakes the coroutine from its await by cancelling it (from the loop, as a done
callback runs); the scope takes that cancellation back on its way out, and the
coroutine acts on :attr:`FirstOf.first`. An event that happened before the
handler's end counts as first even when the loop had yet to run its callback (a
cancel landing in the turn the handler would return wins); when the handler
returns first, the events are dropped unheard.

Why :class:`Deadlines` rather than a loop timer per task: ``loop.call_at`` and the
timer's ``cancel`` are Python code on both ends, about 1 µs a task, which with the
two futures made the select cost 9 % more worker CPU per task than the waiter slots
it replaced (the A/B guard, issue 38). One timer for the earliest deadline of all,
and a heap of its own, cost a tuple and a ``heappush`` a task.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from heapq import heapify, heappop, heappush
from types import TracebackType
from typing import Any

__all__ = ["DEADLINE", "Deadlines", "FirstOf"]

DEADLINE = "deadline"
""":attr:`FirstOf.first` when the deadline came first."""


_EARLY = 0.001
"""Seconds before its time a deadline counts as come when the timer runs (the loop runs a
timer up to its clock resolution early)."""
_SLACK = 64
"""Ended selects the deadline heap may hold beyond twice the waiting ones."""


class Deadlines:
    """The deadlines of every :class:`FirstOf` of one event loop, on one loop timer.

    Entries are ``(loop time, order, select)`` in a heap; the timer is set for the
    earliest. A select that has ended stays in the heap until its time comes (it is then
    passed over) or until the heap holds more than twice the selects still waiting plus
    :data:`_SLACK`, when it is rebuilt without the ended ones: a task's deadline is often
    half an hour away, and a worker runs thousands of tasks a second.
    """

    __slots__ = ("_at", "_heap", "_order", "_timer", "loop", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, FirstOf]] = []
        self._order = itertools.count()  # ties of equal times never compare selects
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer is set for
        self.waiting = 0
        """Selects entered and not yet left."""

    def add(self, when: float, select: FirstOf) -> None:
        heappush(self._heap, (when, next(self._order), select))  # push(), inlined: every task
        self.waiting += 1
        if when < self._at:
            self._arm(when)

    def push(self, when: float, select: FirstOf) -> None:
        """Another deadline for a waiting *select* (its entry for the old one is passed
        over when it comes: :meth:`FirstOf.deadline_came`)."""
        heappush(self._heap, (when, next(self._order), select))
        if when < self._at:
            self._arm(when)

    def left(self) -> None:
        """A select has ended: its entry is dead weight from now on."""
        self.waiting -= 1
        if len(self._heap) > _SLACK + 2 * self.waiting:
            # a select waits from its entry to its exit (a plain read: no call per entry),
            # and an entry for a deadline it had before it moved is dead weight too
            self._heap = [
                entry for entry in self._heap
                if entry[2]._task is not None and entry[0] == entry[2]._deadline
            ]  # fmt: skip
            heapify(self._heap)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = when
        self._timer = self.loop.call_at(when, self._come)

    def _come(self) -> None:
        self._timer = None
        self._at = math.inf
        heap = self._heap
        now = self.loop.time() + _EARLY
        while heap and heap[0][0] <= now:
            heappop(heap)[2].deadline_came()
        if heap:
            self._arm(heap[0][0])


class FirstOf:
    """``with FirstOf(events, deadline): await handler``; see the module docstring.

    A plain (not async) context manager: entering and leaving it await nothing, and
    two coroutines fewer per task is worker CPU saved."""

    __slots__ = ("_deadline", "_deadlines", "_events", "_task", "_woke", "first")

    def __init__(
        self,
        events: tuple[asyncio.Future[None], ...],
        deadline: float,
        deadlines: Deadlines,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        self._events = events
        self._deadline = deadline  # loop time
        self._deadlines = deadlines
        self._task = task
        """The task awaiting in the scope (given, or the current one on entering: on 3.11
        ``asyncio.current_task`` is Python code, a call per task saved when given)."""
        self._woke = False  # the coroutine was cancelled to wake it
        self.first: object = None
        """The event that came before the handler's end (one of the futures, or
        :data:`DEADLINE`); None if none."""

    def came(self) -> bool:
        """Whether an event came before the handler's end (it is being stopped)."""
        return self.first is not None

    def _came(self, event: object) -> None:
        # A done callback or the deadline: run by the loop, between two steps of the
        # coroutine, never from inside one (the handler resolving its own event).
        if self.first is None and self._task is not None:
            self.first = event
            self._woke = True
            self._task.cancel()

    def deadline_came(self) -> None:
        """Called by :class:`Deadlines` when the deadline has come (or one it had before
        it moved, which is passed over)."""
        if self._deadlines.loop.time() + _EARLY >= self._deadline:
            self._came(DEADLINE)

    def move_deadline(self, by: float) -> None:
        """Move the deadline *by* seconds (earlier when negative) while the handler runs:
        a durable run's attempt does not spend its own time on an inline step it awaits."""
        self._deadline += by
        if self._task is not None:
            self._deadlines.push(self._deadline, self)

    def __enter__(self) -> FirstOf:
        task = self._task
        if task is None:
            task = self._task = asyncio.current_task()
            assert task is not None
        for event in self._events:
            event.add_done_callback(self._came)  # at once if already done: the next turn
        self._deadlines.add(self._deadline, self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        for event in self._events:
            event.remove_done_callback(self._came)
        current = self._task
        self._task = None  # no cycle left between the task, its coroutine and this scope
        self._deadlines.left()
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
