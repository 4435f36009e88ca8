"""Exceptions raised by asyncq, mirroring asynq's sentinel errors."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar

__all__ = [
    "AmbiguousIdError",
    "AsyncqError",
    "BrokerError",
    "DeadlineExceededError",
    "DuplicateTaskError",
    "DurableRunNotFoundError",
    "FailedPreconditionError",
    "HandlerNotFoundError",
    "LeaseExpiredError",
    "NonDeterminismError",
    "QueueNotEmptyError",
    "QueueNotFoundError",
    "RedisOutOfMemoryError",
    "ReplicationTimeoutError",
    "RevokeTask",
    "ServerClosedError",
    "SkipRetry",
    "TaskCanceledError",
    "TaskIdConflictError",
    "TaskNotFoundError",
    "TaskStoppedError",
    "UnsupportedServerError",
]


class AsyncqError(Exception):
    """Base class of every asyncq error."""


class DuplicateTaskError(AsyncqError):
    """A task with the same uniqueness key is already held (asynq: "task already exists")."""

    def __init__(self, message: str = "task already exists") -> None:
        super().__init__(message)


class TaskIdConflictError(AsyncqError):
    """A task with the same ID already exists (asynq: "task ID conflicts with another task")."""

    def __init__(self, message: str = "task ID conflicts with another task") -> None:
        super().__init__(message)


class QueueNotFoundError(AsyncqError):
    """The queue is not registered in ``asynq:queues``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"queue not found: {queue!r}")


class DurableRunNotFoundError(AsyncqError):
    """No durable run with that id has a record in the queue (never attempted yet, not a
    durable run, or its record expired after its end)."""

    def __init__(self, queue: str, run_id: str) -> None:
        self.queue = queue
        self.run_id = run_id
        super().__init__(f"durable run not found: id={run_id!r} queue={queue!r}")


class QueueNotEmptyError(AsyncqError):
    """The queue still holds tasks (delete it with ``force=True``)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"queue is not empty: {queue!r}")


class TaskNotFoundError(AsyncqError):
    """No task with that ID exists in the queue (*queue* None: in any queue)."""

    def __init__(self, queue: str | None, task_id: str) -> None:
        self.queue = queue
        self.task_id = task_id
        where = "in any queue" if queue is None else f"queue={queue!r}"
        super().__init__(f"task not found: id={task_id!r} {where}")


class AmbiguousIdError(AsyncqError):
    """An ID or ID prefix given by a person names more than one task or workflow.

    *kind* is ``"task"`` or ``"workflow"``; *candidates* are ``<queue>/<id>`` of
    the matches found (at most a handful: *more* tells that there are others).
    """

    def __init__(self, kind: str, given: str, candidates: Sequence[str], *, more: bool) -> None:
        self.kind = kind
        self.given = given
        self.candidates = list(candidates)
        listed = ", ".join(self.candidates) + (", ..." if more else "")
        super().__init__(
            f"{kind} ID {given!r} is ambiguous: it matches {listed}; "
            "give more of the ID, or the queue"
        )


class FailedPreconditionError(AsyncqError):
    """The operation is not allowed in the task's or queue's current state."""


class BrokerError(AsyncqError):
    """Redis answered a broker script with an unexpected error."""


class RedisOutOfMemoryError(BrokerError):
    """Redis refused a write because it reached ``maxmemory`` (policy ``noeviction``).

    Every enqueue path raises it, and nothing of the task was written. Workers keep
    draining such a Redis where the server allows it (see the guarantees page).
    """

    def __init__(self, what: str = "the write") -> None:
        super().__init__(
            f"Redis is out of memory (used memory > 'maxmemory' with a noeviction policy): "
            f"{what} was refused and nothing of it was written; free memory, raise maxmemory "
            "or let workers drain the queues, then retry"
        )


class LeaseExpiredError(AsyncqError):
    """The worker's lease on the task expired before it finished (asynq: "task lease expired")."""

    def __init__(self, message: str = "asynq: task lease expired") -> None:
        super().__init__(message)


class ServerClosedError(AsyncqError):
    """The server was already shut down."""

    def __init__(self, message: str = "asynq: Server closed") -> None:
        super().__init__(message)


class HandlerNotFoundError(AsyncqError):
    """No handler is registered for the task's type."""

    def __init__(self, task_type: str) -> None:
        self.task_type = task_type
        super().__init__(f"handler not found for task {task_type!r}")


class SkipRetry(AsyncqError):
    """Raise from a handler to archive the task at once, without further retries."""

    def __init__(self, message: str = "skip retry for the task") -> None:
        super().__init__(message)


class NonDeterminismError(SkipRetry):
    """A durable function's replay asked for another entry than its run's record holds
    at that place (another step, other arguments, another order).

    The run is archived at once (a retry would replay the same code the same way); once
    the code is fixed, running the archived run again replays it from its record.
    *index* is the entry's place in the run, *recorded* and *requested* what the record
    holds there and what the replay asked for.
    """

    def __init__(self, run_id: str, index: int, recorded: str, requested: str) -> None:
        self.run_id = run_id
        self.index = index
        self.recorded = recorded
        self.requested = requested
        super().__init__(
            f"durable run {run_id}: entry {index} of its record is {recorded!r} but this "
            f"replay asked for {requested!r}; the function must ask for the same steps in "
            "the same order on every replay (docs/durable.md)"
        )


class RateLimited(AsyncqError):
    """Raise from a handler when a rate limit (yours or a partner's) says "not now".

    The task is re-scheduled *retry_in* from now (a timedelta, 0 or more)
    without counting a failure or using one of its retries, and the server's
    ``error_handler`` is not called (asynq's ``IsFailure`` + ``RetryDelayFunc``
    pattern, made first-class). Also honoured when wrapped (``raise X from
    RateLimited(...)``, exception groups).
    """

    def __init__(self, retry_in: timedelta, message: str = "rate limited") -> None:
        if not isinstance(retry_in, timedelta):
            raise TypeError(
                f"retry_in must be a datetime.timedelta, got {retry_in.__class__.__name__}"
            )
        if retry_in < timedelta(0):
            raise ValueError(f"retry_in cannot be negative, got {retry_in}")
        super().__init__(f"{message} (retry in {retry_in})")
        self.retry_in = retry_in


class RevokeTask(AsyncqError):
    """Raise from a handler to drop the task: no retry, no archive; it counts as processed."""

    def __init__(self, message: str = "revoke task") -> None:
        super().__init__(message)


class TaskCanceledError(AsyncqError):
    """The task was cancelled through the cancel channel (asynq: ``context canceled``).

    Like in asynq it counts as a failure, so the task is retried.
    """

    def __init__(self, message: str = "context canceled") -> None:
        super().__init__(message)


class TaskStoppedError(TaskCanceledError, SkipRetry):
    """The task was cancelled for good (``Inspector.cancel(id, retry=False)``): archived,
    not retried. A :class:`TaskCanceledError` (what a handler catching cancellations sees)
    and a :class:`SkipRetry` (which archives)."""

    def __init__(self, message: str = "context canceled: stopped, not retried") -> None:
        AsyncqError.__init__(self, message)


class DeadlineExceededError(AsyncqError, TimeoutError):
    """The task ran past min(timeout, deadline) (asynq: ``context deadline exceeded``)."""

    def __init__(self, message: str = "context deadline exceeded") -> None:
        super().__init__(message)


class ReplicationTimeoutError(AsyncqError):
    """Fewer replicas than ``min_replicas`` acknowledged a write within ``replica_timeout``.

    The write *was* applied on the master (``written`` is always True: a write
    Redis refused raises its own error instead); it is only not yet known to be
    on enough replicas, so a failover right now could lose it. Retrying an
    enqueue with the same ``task_id`` is safe: it either raises
    TaskIdConflictError (the first write survived) or writes the task again.
    """

    def __init__(
        self,
        *,
        acknowledged: int,
        required: int,
        timeout: float,
        queue: str = "",
        task_id: str = "",
    ) -> None:
        self.written = True
        self.acknowledged = acknowledged
        self.required = required
        self.timeout = timeout
        self.queue = queue
        self.task_id = task_id
        what = f"task {task_id!r} in queue {queue!r}" if task_id else "the write"
        super().__init__(
            f"{what} was written on the master, but only {acknowledged} of the "
            f"{required} required replicas acknowledged it within {timeout:g}s; "
            "a failover now could lose it"
        )


class UnsupportedServerError(AsyncqError):
    """The server is a version asyncq's scripts cannot run on (it needs Redis >= 6.2 or Valkey)."""

    def __init__(
        self, server: str, needed: str = "Redis 6.2 or later, or Valkey 7.2 or later"
    ) -> None:
        self.server = server
        self.needed = needed
        super().__init__(f"{server} is not supported: asyncq needs {needed}")


_E = TypeVar("_E", bound=BaseException)


def find_error(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first *kind* error in *exc*, its cause chain or its exception groups, or None."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        err = stack.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, kind):
            return err
        if isinstance(err, BaseExceptionGroup):
            stack.extend(err.exceptions)
        if err.__cause__ is not None:
            stack.append(err.__cause__)
    return None


def wraps_error(exc: BaseException, kind: type[BaseException]) -> bool:
    """True when *exc* is, or wraps (cause chain, exception groups), a *kind* error.

    The Python reading of Go's ``errors.Is``: ``raise X from SkipRetry()`` and an
    ExceptionGroup containing RevokeTask both count.
    """
    return find_error(exc, kind) is not None
