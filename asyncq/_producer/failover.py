"""Producers that ride through a failover: the Client's enqueue retry policy.

``Client(redis, retry=RetryPolicy(...))`` (the default is ``RetryPolicy()``;
``retry=None`` turns it off) retries an enqueue that failed for a
connection-level reason (refused, reset or timed out, Sentinel "master not
found", a write to a demoted master answering READONLY, a loading replica,
Redis Cluster CLUSTERDOWN / TRYAGAIN) with exponential backoff until the
policy's ``deadline``. Other errors (a bad option, DuplicateTaskError,
TaskIdConflictError, a script error) are raised at once.

A retry never duplicates a task. The task id is fixed before the first
attempt, so when an attempt failed after Redis may already have run it (the
reply was lost), the next attempt finds the task in place: a task hash whose
stored message is exactly this one, or, for a unique task, a uniqueness lock
holding this task's id. That counts as success. When the deadline passes,
:class:`EnqueueRetryError` says whether the task may have been written.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import _keys as keys
from asyncq._codec import encode_task_message
from asyncq._logging import LazyLogger
from asyncq._redis.errors import is_tls_verification_failure
from asyncq._redis.options import RedisClient
from asyncq.errors import AsyncqError, DuplicateTaskError, TaskIdConflictError
from asyncq.proto.asynq import TaskMessage

__all__ = ["DEFAULT_RETRY", "EnqueueRetryError", "RetryPolicy", "Written"]

_log: Any = LazyLogger()

# Refused before anything ran: the write surely did not happen.
_NOT_WRITTEN: tuple[type[BaseException], ...] = (
    MasterNotFoundError,
    ReadOnlyError,
    BusyLoadingError,
    ClusterDownError,
    TryAgainError,
    ConnectionRefusedError,
)
# Connection-level: worth another attempt; unless _NOT_WRITTEN, it may have run.
_RETRYABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    OSError,
)
_RETRYABLE_REPLIES = ("MASTERDOWN", "LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How long and how often a Client retries an enqueue after a connection-level failure."""

    deadline: timedelta = timedelta(seconds=5)
    """Give up (EnqueueRetryError) once this long has passed since the first attempt."""
    initial_backoff: timedelta = timedelta(milliseconds=20)
    """Pause after the first failure; it doubles after each further one."""
    max_backoff: timedelta = timedelta(milliseconds=500)
    """Longest pause between two attempts (jittered by up to half of it)."""

    def __post_init__(self) -> None:
        for name in ("deadline", "initial_backoff", "max_backoff"):
            value = getattr(self, name)
            if not isinstance(value, timedelta):
                raise TypeError(
                    f"RetryPolicy {name} must be a datetime.timedelta, "
                    f"got {value.__class__.__name__}"
                )
            if value <= timedelta(0):
                raise ValueError(f"RetryPolicy {name} must be positive, got {value}")
        if self.max_backoff < self.initial_backoff:
            raise ValueError(
                f"RetryPolicy max_backoff ({self.max_backoff}) is shorter than "
                f"initial_backoff ({self.initial_backoff})"
            )


DEFAULT_RETRY = RetryPolicy()
"""The Client's default: retry for up to 5 s, 20 ms doubling to 500 ms between attempts."""


class EnqueueRetryError(AsyncqError):
    """An enqueue still failed when its retry deadline passed.

    ``may_have_written`` is False only when every attempt was refused before
    Redis could run it; when True, look the task up by ``task_id`` (the
    Inspector's ``get_task_info``) before enqueueing it again. The last error
    is the ``__cause__``.
    """

    def __init__(
        self, task_id: str, queue: str, attempts: int, may_have_written: bool, last: BaseException
    ) -> None:
        self.task_id = task_id
        self.queue = queue
        self.attempts = attempts
        self.may_have_written = may_have_written
        written = (
            "the task MAY HAVE BEEN WRITTEN (a reply was lost); look it up by id before "
            "enqueueing it again"
            if may_have_written
            else "the task was not written"
        )
        super().__init__(
            f"could not enqueue task {task_id!r} into queue {queue!r}: {attempts} attempts "
            f"failed, the last with {type(last).__name__}: {last}; {written}"
        )


def is_retryable(exc: BaseException) -> bool:
    """A connection-level failure that another attempt may get past.

    A TLS certificate that cannot be verified is not one: it fails the same way
    every time, so the caller gets its reason at once.
    """
    if is_tls_verification_failure(exc):
        return False
    if isinstance(exc, _RETRYABLE):
        return True
    return isinstance(exc, ResponseError) and str(exc).upper().startswith(_RETRYABLE_REPLIES)


def surely_not_written(exc: BaseException) -> bool:
    """Redis refused the command before running it."""
    if isinstance(exc, _NOT_WRITTEN):
        return True
    if isinstance(exc, ResponseError):
        return True  # an error reply: the script did not run (MASTERDOWN, LOADING, ...)
    # redis-py words a failed connect as "Error <n> connecting to <host>:<port>".
    return isinstance(exc, RedisConnectionError) and " connecting to " in str(exc)


@dataclass(frozen=True, slots=True)
class Written:
    """What one enqueue writes, as a retry checks it: the task and its encoded message."""

    task_id: str
    queue: str
    task_type: str
    data: bytes  # the TaskMessage bytes the write stores in the task hash
    unique_key: str  # "" when the task takes no uniqueness lock

    @classmethod
    def of(cls, msg: TaskMessage) -> Written:
        return cls(msg.id, msg.queue, msg.type, encode_task_message(msg), msg.unique_key)


async def _already_written(redis: RedisClient, task: Written) -> bool:
    """True when Redis holds exactly this task (an earlier attempt wrote it)."""
    stored = await redis.hget(keys.task_key(task.queue, task.task_id), "msg")
    if isinstance(stored, str):
        stored = stored.encode()
    return stored == task.data


async def _holds_lock(redis: RedisClient, task: Written) -> bool:
    """True when the task's uniqueness lock holds this task's id (asynq's lock value)."""
    owner = await redis.get(task.unique_key)
    if isinstance(owner, bytes):
        owner = owner.decode(errors="replace")
    return owner == task.task_id


async def write_with_retry(
    policy: RetryPolicy | None,
    redis: RedisClient,
    task: Written,
    write: Callable[[], Awaitable[Any]],
    *,
    first_error: BaseException | None = None,
) -> None:
    """Run *write* (one enqueue of *task*), retrying connection-level failures per *policy*.

    *first_error*: the first attempt was already made by the caller (the
    hot path tries once without this frame) and failed with it.
    """
    if policy is None:
        if first_error is not None:
            raise first_error
        await write()
        return
    start = time.monotonic()
    limit = policy.deadline.total_seconds()
    pause = policy.initial_backoff.total_seconds()
    cap = policy.max_backoff.total_seconds()
    attempts = 0
    maybe_written = False
    while True:
        attempts += 1
        try:
            if first_error is not None:
                exc, first_error = first_error, None
                raise exc
            await write()
            return
        except (TaskIdConflictError, DuplicateTaskError) as exc:
            if attempts == 1:
                raise
            # Ours, from an attempt whose reply was lost? Then the enqueue succeeded.
            try:
                if isinstance(exc, DuplicateTaskError):
                    ours = await _holds_lock(redis, task)
                else:
                    ours = await _already_written(redis, task)
            except RedisError as check_exc:
                if not is_retryable(check_exc):
                    raise
                last: BaseException = check_exc  # the check failed: try the write again
            else:
                if not ours:
                    raise
                _log.info(
                    "enqueue retry found the task already written",
                    task_id=task.task_id,
                    task_type=task.task_type,
                    queue=task.queue,
                    attempts=attempts,
                )
                return
        except BaseException as exc:
            if not is_retryable(exc):
                raise
            last = exc
            if not surely_not_written(exc):
                maybe_written = True
        elapsed = time.monotonic() - start
        if elapsed >= limit:
            raise EnqueueRetryError(
                task.task_id, task.queue, attempts, maybe_written, last
            ) from last
        delay = min(pause, limit - elapsed) * (0.5 + random.random() / 2)
        pause = min(cap, pause * 2)
        _log.debug(
            "enqueue failed; retrying",
            task_id=task.task_id,
            queue=task.queue,
            attempt=attempts,
            retry_in=round(delay, 3),
            error=f"{type(last).__name__}: {last}",
        )
        await asyncio.sleep(delay)
