"""Retry and failure policy: what a failed attempt becomes (asynq's retry rules).

Used by the processor (a handler's failure) and the recoverer (an expired
lease) alike: the user's ``retry_delay`` and ``is_failure`` with asynq's
defaults when they misbehave, and the Go ``errors.Is`` reading of
``SkipRetry``/``RevokeTask`` through cause chains and exception groups.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from asyncq._worker.config import ServerConfig
from asyncq.errors import LeaseExpiredError
from asyncq.task import Task

__all__ = [
    "default_retry_delay",
    "is_failure_for",
    "retry_delay_for",
]


_MAX_DELAY = timedelta(microseconds=(2**63 - 1) // 1000)
"""The longest retry delay: Go's largest time.Duration (about 292 years)."""


def default_retry_delay(n: int, exc: BaseException, task: Task) -> timedelta:
    """asynq's DefaultRetryDelayFunc: n**4 + 15 + rand(30) * (n + 1) seconds (sidekiq's).

    One difference: a task whose lease expired (its worker was killed or lost
    Redis) is retried at once. It has already waited for its lease to run out,
    and the handler did not fail; a task that keeps killing its worker still
    uses a retry each time and ends archived.
    """
    if isinstance(exc, LeaseExpiredError):
        return timedelta(0)
    return timedelta(seconds=n**4 + 15 + random.randrange(30) * (n + 1))


def retry_delay_for(
    cfg: ServerConfig, log: Any, n: int, exc: BaseException, task: Task, **fields: Any
) -> timedelta:
    """The configured retry delay; asynq's default when the function raises or misbehaves."""
    try:
        if cfg.retry_delay is None:
            return default_retry_delay(n, exc, task)
        delay = cfg.retry_delay(n, exc, task)
        if not isinstance(delay, timedelta):
            raise TypeError(f"retry_delay must return a timedelta, got {delay.__class__.__name__}")
    except BaseException as err:  # user code: even SystemExit must not lose the task
        log.error("retry_delay raised; using the default delay", exc_info=err, **fields)
        return default_retry_delay(n, exc, task)
    return min(max(delay, timedelta(0)), _MAX_DELAY)


def is_failure_for(cfg: ServerConfig, log: Any, exc: BaseException, **fields: Any) -> bool:
    """The configured ``is_failure`` verdict; True (a failure) when the function raises."""
    try:
        return cfg.is_failure is None or bool(cfg.is_failure(exc))
    except BaseException as err:  # user code: even SystemExit must not lose the task
        log.error("is_failure raised; counting a failure", exc_info=err, **fields)
        return True
