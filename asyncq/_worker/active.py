"""The tasks a server is running, and the registry the roles read and cancel through.

:class:`ActiveTasks` is asyncq's reading of asynq's ``base.Cancelations``: the
processor adds and removes tasks; the heartbeater reads their leases, the
recoverer asks whether a task still runs here, and the subscriber cancels a
task by ID through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from asyncq._worker.lease import Lease
from asyncq.errors import DeadlineExceededError, LeaseExpiredError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task

__all__ = ["CANCEL_GRACE", "FINISHED", "RUNNING", "WRITING", "ActiveTask", "ActiveTasks"]

CANCEL_GRACE = 5.0
"""Seconds a cancelled handler (deadline, cancel message, lease expiry) has to return before
its failure is written anyway and its slot freed; it may go on in the background, as a Go
handler ignoring its context does in asynq."""

RUNNING = 0
WRITING = 1
FINISHED = 2


class ActiveTask:
    """A task this server is running: message, lease, deadline and its asyncio task."""

    __slots__ = (
        "abandoned",
        "cancel_exc",
        "deadline",
        "detached",
        "entered",
        "grace",
        "job",
        "lease",
        "msg",
        "on_stuck",
        "phase",
        "released",
        "started",
        "task",
        "timer",
    )

    def __init__(self, msg: TaskMessage, lease: Lease, deadline: float, started: float) -> None:
        self.msg = msg
        self.lease = lease
        self.deadline = deadline
        self.started = started
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.phase = RUNNING
        self.cancel_exc: BaseException | None = None
        self.abandoned = False  # requeued or dropped at shutdown: write nothing more
        # The asyncio task has run its first step. Cancelling a task before that
        # throws into a coroutine that never ran: its finally (slot, bookkeeping)
        # would never run either, so such a task only gets cancel_exc.
        self.entered = False
        self.job: Task | None = None  # the handler's Task, for a detached failure write
        self.on_stuck: Callable[[ActiveTask], object] | None = None
        self.grace: asyncio.TimerHandle | None = None
        self.detached = False  # failed without the handler: its return writes nothing
        self.released = False  # slot and bookkeeping given back

    # TaskContext protocol (result writer)
    @property
    def task_id(self) -> str:
        return self.msg.id

    @property
    def queue(self) -> str:
        return self.msg.queue

    def done_reason(self) -> str | None:
        if self.cancel_exc is not None:
            return str(self.cancel_exc)
        if self.phase != RUNNING or self.abandoned:
            return "the task's handler has returned"
        if not self.lease.valid():
            return str(LeaseExpiredError())
        if time.time() >= self.deadline:
            return str(DeadlineExceededError())
        return None

    def deadline_exceeded(self) -> None:
        self.cancel(DeadlineExceededError())

    def cancel(self, exc: BaseException) -> bool:
        """Cancel the handler with *exc* as the failure; False if it is not running."""
        if self.phase != RUNNING or self.cancel_exc is not None or self.task is None:
            return False
        self.cancel_exc = exc
        if self.entered:
            self.task.cancel()
        if self.on_stuck is not None:
            self.grace = asyncio.get_running_loop().call_later(CANCEL_GRACE, self.on_stuck, self)
        return True

    def stop_abandoned(self) -> None:
        """Shutdown: cancel the handler of an abandoned task (it writes nothing more)."""
        if self.task is not None and not self.task.done():
            self.cancel_exc = asyncio.CancelledError()
            if self.entered:
                self.task.cancel()


class ActiveTasks(dict[str, ActiveTask]):
    """Task ID -> the running :class:`ActiveTask` (asynq's ``base.Cancelations``)."""

    def cancel(self, task_id: str, exc: BaseException) -> ActiveTask | None:
        """Cancel the running handler of *task_id* with *exc*; None if not running here."""
        active = self.get(task_id)
        if active is not None and active.cancel(exc):
            return active
        return None
