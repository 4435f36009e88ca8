"""What a finished attempt becomes: one decision for the processor and the recoverer.

:func:`decide` maps (message, exception or None, lease state, settings, now)
to an :class:`Outcome`; the caller only logs it and writes it. asynq's rules
(spec 5.3/5.4), in order:

1. The local lease has expired: nothing is written (another server's recoverer
   owns the task now).
2. Success: MarkAsComplete when the task has a retention, else Done.
3. ``RateLimited`` (asyncq): back to the retry set after its ``retry_in``,
   no retry used, not a failure.
4. ``RevokeTask`` anywhere in the cause chain: deleted as Done (processed,
   not failed).
5. Retries used up, or ``SkipRetry``: Archive.
6. Otherwise Retry after ``retry_delay(n, exc, task)`` with
   ``is_failure(exc)`` deciding whether the attempt counts.

A workflow step's Done/MarkAsComplete/Archive/revoke goes through the
workflow acknowledgement (``Outcome.workflow``) so the workflow advances in
the same script call; a durable run's step's, through the step acknowledgement
(``Outcome.durable``) that records it in its run. A durable run whose replay
raised :class:`~asyncq._broker.durable.RunSuspended` is suspended (``suspend``):
it waits parked, no retry used, not a failure. The function only calls the user's
``retry_delay`` and ``is_failure`` (through :mod:`asyncq._worker.policy`, which falls back to
asynq's defaults when they raise); it writes and logs nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from asyncq._broker.durable import RunSuspended, SuspendPlan, is_durable_step
from asyncq._broker.workflow import AckMode, is_workflow_step
from asyncq._logging import error_text
from asyncq._worker.config import ServerConfig
from asyncq._worker.policy import is_failure_for, retry_delay_for
from asyncq.errors import (
    LeaseExpiredError,
    RateLimited,
    RevokeTask,
    SkipRetry,
    find_error,
    wraps_error,
)
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task

__all__ = ["LeaseState", "Outcome", "OutcomeKind", "decide", "not_run"]

OutcomeKind = Literal["done", "complete", "revoke", "archive", "retry", "lost", "suspend"]
LeaseState = Literal["held", "expired", "recovering"]
"""``held``: the worker's own lease is valid. ``expired``: it ran out, so the worker
may write nothing. ``recovering``: the recoverer acts for an expired lease."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The write a finished attempt needs (``lost``: none)."""

    kind: OutcomeKind
    err_msg: str = ""
    retry_at: datetime | None = None
    is_failure: bool = True
    workflow: bool = False
    """Acknowledged as a workflow step (Done/MarkAsComplete/Archive/revoke with its hand-off)."""
    durable: bool = False
    """Acknowledged as a durable run's step (recorded in its run in the same write)."""
    plan: SuspendPlan | None = None
    """What a suspended durable run writes (``suspend``)."""

    @property
    def ack_mode(self) -> AckMode:
        """The workflow acknowledgement of this outcome."""
        if self.kind in ("done", "complete", "archive", "revoke"):
            return self.kind
        raise ValueError(f"a {self.kind!r} outcome is not a workflow acknowledgement")


_LOST = Outcome("lost")
_DONE = Outcome("done")
_COMPLETE = Outcome("complete")


def decide(
    msg: TaskMessage,
    exc: BaseException | None,
    *,
    lease: LeaseState,
    config: ServerConfig,
    now: float,
    log: Any,
    task: Task | None = None,
) -> Outcome:
    """The outcome of an attempt of *msg* that returned (*exc* None) or raised *exc*.

    *task* is what the user's ``retry_delay`` receives (built from *msg* when
    not given); *log* reports a ``retry_delay``/``is_failure`` that raised.
    """
    if lease == "expired":
        return _LOST
    if msg.headers:  # only a message with headers can be a step
        workflow = is_workflow_step(msg)
        durable = not workflow and is_durable_step(msg)
    else:
        workflow = durable = False
    if exc is None:
        kind: OutcomeKind = "complete" if msg.retention > 0 else "done"
        if not workflow and not durable:  # nearly every task: one of two outcomes, made once
            return _COMPLETE if kind == "complete" else _DONE
        return Outcome(kind, workflow=workflow, durable=durable)
    # Steps awaited in a TaskGroup raise their suspensions in a group: one is written, and
    # the replay it resumes asks for the others again.
    suspended = find_error(exc, RunSuspended)
    if suspended is not None:
        return Outcome("suspend", plan=suspended.plan)
    err_msg = error_text(exc)
    limited = find_error(exc, RateLimited)
    if limited is not None and not isinstance(exc, LeaseExpiredError):
        retry_at = datetime.fromtimestamp(now, UTC) + limited.retry_in
        return Outcome("retry", err_msg, retry_at, is_failure=False)
    if wraps_error(exc, RevokeTask):
        return Outcome("revoke", err_msg, workflow=workflow, durable=durable)
    if msg.retried >= msg.retry or wraps_error(exc, SkipRetry):
        return Outcome("archive", err_msg, workflow=workflow, durable=durable)
    fields: dict[str, Any] = {"task_id": msg.id, "task_type": msg.type, "queue": msg.queue}
    if task is None:
        task = Task._from_message(msg)
    delay = retry_delay_for(config, log, msg.retried, exc, task, **fields)
    is_failure = is_failure_for(config, log, exc, **fields)
    return Outcome("retry", err_msg, datetime.fromtimestamp(now, UTC) + delay, is_failure)


def not_run(now: float, retry_in: timedelta, err_msg: str) -> Outcome:
    """A task put back unrun (its type's rate had no token): a retry that uses nothing."""
    return Outcome("retry", err_msg, datetime.fromtimestamp(now, UTC) + retry_in, False)
