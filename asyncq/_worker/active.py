"""The tasks a server is running, and the registry the roles read and cancel through.

:class:`ActiveTasks` is asyncq's reading of asynq's ``base.Cancelations``: the
processor adds and removes tasks; the heartbeater reads their leases, the
recoverer asks whether a task still runs here, and the subscriber cancels a
task by ID through it.

An :class:`ActiveTask`'s :attr:`~ActiveTask.stopped` future is what the
processor's per-task coroutine waits on: it resolves at the first of the
handler finishing, a cancel request (:meth:`ActiveTask.cancel`: a cancel
message, the loss of the lease) and shutdown abandoning the task. Whatever
resolves it first decides the attempt; later requests change nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from asyncq._worker.lease import Lease
from asyncq.errors import DeadlineExceededError, LeaseExpiredError
from asyncq.proto.asynq import TaskMessage

__all__ = ["CANCEL_GRACE", "ActiveTask", "ActiveTasks", "TaskState"]

CANCEL_GRACE = 5.0
"""Seconds a cancelled handler (deadline, cancel message, lease expiry) has to return before
its failure is written anyway and its slot freed; it is then an orphan that goes on in the
background, as a Go handler ignoring its context does in asynq."""

TaskState = Literal["running", "writing", "abandoned", "finished"]
"""``running``: the handler may still run. ``writing``: its outcome is being written.
``abandoned``: shutdown requeued it (or left it to recovery): nothing more is written.
``finished``: its slot is free."""


class ActiveTask:
    """A task this server is running: message, lease, deadline, its handler's asyncio task."""

    __slots__ = ("cancel_exc", "deadline", "lease", "msg", "started", "state", "stopped", "task")

    def __init__(self, msg: TaskMessage, lease: Lease, deadline: float, started: float) -> None:
        self.msg = msg
        self.lease = lease
        self.deadline = deadline
        self.started = started
        self.state: TaskState = "running"
        self.task: asyncio.Task[object] | None = None
        """The handler's asyncio task, once started."""
        self.cancel_exc: BaseException | None = None
        """Why the handler was stopped before it finished (the attempt's failure)."""
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolved once: the handler finished, or a request stopped it first."""

    @property
    def abandoned(self) -> bool:
        """Shutdown requeued the task (or left it to recovery): nothing more is written."""
        return self.state == "abandoned"

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
        if self.state != "running":
            return "the task's handler has returned"
        if not self.lease.valid():
            return str(LeaseExpiredError())
        if time.time() >= self.deadline:
            return str(DeadlineExceededError())
        return None

    def handler_done(self, _: object = None) -> None:
        """The handler's task finished (its done callback)."""
        if not self.stopped.done():
            self.stopped.set_result(None)

    def cancel(self, exc: BaseException) -> bool:
        """Stop the handler with *exc* as the failure; False once it finished or was stopped."""
        if self.state != "running" or self.stopped.done():
            return False
        self.cancel_exc = exc
        self.stopped.set_result(None)
        return True

    def abandon(self) -> None:
        """Shutdown takes the task back: from now on nothing is written for it."""
        self.state = "abandoned"

    def stop_abandoned(self) -> None:
        """Shutdown, once the task is requeued: stop its handler (nothing is written)."""
        if not self.stopped.done():
            self.cancel_exc = asyncio.CancelledError()
            self.stopped.set_result(None)


class ActiveTasks(dict[str, ActiveTask]):
    """Task ID -> the running :class:`ActiveTask` (asynq's ``base.Cancelations``)."""

    def cancel(self, task_id: str, exc: BaseException) -> ActiveTask | None:
        """Cancel the running handler of *task_id* with *exc*; None if not running here."""
        active = self.get(task_id)
        if active is not None and active.cancel(exc):
            return active
        return None
