"""The tasks a server is running, and the registry the roles read and cancel through.

:class:`ActiveTasks` is asyncq's reading of asynq's ``base.Cancelations``: the
processor adds and removes tasks; the heartbeater reads their leases, the
recoverer asks whether a task still runs here, and the subscriber cancels a
task by ID through it.

A cancel request (:meth:`ActiveTask.cancel`: a cancel message; shutdown's
:meth:`ActiveTask.stop_abandoned`) records its reason and resolves
:attr:`ActiveTask.cancelled`: one of the events the task's coroutine waits on
beside the handler, the lease's expiry and the deadline (see
:mod:`asyncq._worker.attempt`). The first request is the attempt's failure, and
once the handler has returned requests change nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Literal

from asyncq._worker.lease import Lease
from asyncq.errors import DeadlineExceededError, LeaseExpiredError
from asyncq.proto.asynq import TaskMessage

if TYPE_CHECKING:
    from asyncq._broker import DequeuedTask
    from asyncq._worker.select import FirstOf
    from asyncq.task import Task

__all__ = ["CANCEL_GRACE", "ActiveTask", "ActiveTasks", "AttemptPhase"]

CANCEL_GRACE = 5.0
"""Seconds a cancelled handler (deadline, cancel message, lease expiry) has to return before
its failure is written anyway and its slot freed; it is then an orphan that goes on in the
background, as a Go handler ignoring its context does in asynq."""

AttemptPhase = Literal["starting", "running", "writing", "finished"]
"""``starting``: its coroutine has not run yet. ``running``: the handler may still run.
``writing``: its outcome is being written. ``finished``: its slot is free."""


class ActiveTask:
    """A task this server is running: message, lease, deadline, why and when it was stopped."""

    __slots__ = (
        "abandoned",
        "began",
        "cancel_exc",
        "cancelled",
        "deadline",
        "given",
        "guest",
        "held",
        "host",
        "lease",
        "msg",
        "ran",
        "recorded",
        "select",
        "started",
        "state",
        "task",
        "then",
    )  # fmt: skip

    def __init__(
        self,
        msg: TaskMessage,
        lease: Lease,
        deadline: float,
        started: float,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Made in the running event loop, or for *loop*, as its lease (its event is a
        future of that loop)."""
        self.msg = msg
        self.lease = lease
        self.deadline = deadline
        self.started = started
        self.state: AttemptPhase = "starting"
        self.abandoned = False
        """Shutdown requeued the task (or left it to recovery): nothing more is written."""
        self.task: asyncio.Task[None] | None = None
        """The asyncio task of the processor's coroutine for this task (it runs the handler)."""
        self.given: Task | None = None
        """The :class:`~asyncq.Task` its handler was given, while the handler runs: its
        ``deadline`` is this one's, moved with it."""
        self.then: DequeuedTask | None = None
        """A task leased to us by this task's outcome (a durable run's first step, by the
        run's suspension; the run a step's success woke), to start in this task's slot when
        it is released."""
        self.cancel_exc: BaseException | None = None
        """Why the handler was stopped before it returned (the attempt's failure)."""
        self.cancelled: asyncio.Future[None] = asyncio.Future(
            loop=loop or asyncio.get_running_loop()
        )
        """Done once a cancel request came (its reason is :attr:`cancel_exc`)."""
        self.began = 0.0
        """When the handler was called (unix time); 0 while it has not been."""
        self.select: FirstOf | None = None
        """What the handler's run waits on beside it, while it runs (its deadline can move)."""
        self.host: ActiveTask | None = None
        """An inline step's: the durable run whose attempt awaits it, in whose slot it runs
        (see :meth:`asyncq._worker.attempt.Attempts.run_inline`)."""
        self.guest: ActiveTask | None = None
        """A durable run's attempt's: the inline step it awaits, running in its slot. A run
        whose attempt ends first leaves its slot to the step, which frees it."""
        self.held: bytes | None = None
        """An inline step's: the result its handler wrote, held until its acknowledgement
        writes it (with its record in its run, in the same script call)."""
        self.recorded: bytes | None = None
        """An inline step's: the result its acknowledgement recorded in its run."""
        self.ran: tuple[float, float] | None = None
        """When the handler started and ended (unix time), for the metrics history; None
        without one, while it runs, or if it never ran (stopped before its start, or put
        back for its type's rate limit)."""

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
        if self.state in ("writing", "finished") or self.abandoned:
            return "the task's handler has returned"
        if not self.lease.valid():
            return str(LeaseExpiredError())
        if time.time() >= self.deadline:
            return str(DeadlineExceededError())
        return None

    def move_deadline(self, by: float) -> None:
        """Move the deadline *by* seconds (earlier when negative), the running handler's
        with it: a durable run's attempt does not spend its own time on an inline step."""
        self.deadline += by
        if self.select is not None:
            self.select.move_deadline(by)
        if self.given is not None:
            self.given._deadline_moved(self.deadline)

    def cancel(self, exc: BaseException) -> bool:
        """Ask the handler to stop with *exc* as the failure; False once it returned or was
        stopped. Before the coroutine's first step only the reason is recorded: it starts
        nothing then."""
        if self.abandoned or self.cancel_exc is not None or self.state not in _STOPPABLE:
            return False
        self.cancel_exc = exc
        self._request()
        return True

    def _request(self) -> None:
        if not self.cancelled.done():
            self.cancelled.set_result(None)

    def stop_abandoned(self) -> None:
        """Shutdown, once the task is requeued: stop its handler (nothing is written)."""
        if self.cancel_exc is None:
            self.cancel_exc = asyncio.CancelledError()
        self._request()


_STOPPABLE = ("starting", "running")


class ActiveTasks(dict[str, ActiveTask]):
    """Task ID -> the running :class:`ActiveTask` (asynq's ``base.Cancelations``)."""

    def cancel(self, task_id: str, exc: BaseException) -> ActiveTask | None:
        """Cancel the running handler of *task_id* with *exc*; None if not running here."""
        active = self.get(task_id)
        if active is not None and active.cancel(exc):
            return active
        return None
