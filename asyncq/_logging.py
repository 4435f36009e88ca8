"""Logging helpers shared by the worker roles: the ``asyncq`` structlog logger,
a rate limiter for repeated errors and an exponential backoff.

asynq logs a failing dequeue at most once every 3 s; asyncq does the same for
every Redis error a role meets, so a Redis outage costs a handful of lines,
not thousands, and the roles back off instead of spinning.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

from asyncq.errors import AsyncqError
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "Backoff",
    "DebugCheck",
    "LazyLogger",
    "RateLimiter",
    "error_text",
    "get_logger",
    "is_debug_enabled",
    "safe_default_processors",
    "task_fields",
]

LOGGER_NAME = "asyncq"
_DEBUG_BY_ENV = os.environ.get("ASYNCQ_LOG_LEVEL", "").strip().lower() == "debug"


def get_logger(**initial: Any) -> Any:
    """The ``asyncq`` structlog logger, optionally with bound values.

    When the application has configured structlog, its configuration applies.
    When it has not, structlog's defaults would render tracebacks with every
    local variable of every frame (payloads, API keys, tokens); asyncq then uses
    the same console output with plain tracebacks instead (see
    :func:`safe_default_processors`).
    """
    if structlog.is_configured():
        log = structlog.get_logger(LOGGER_NAME)
    else:
        # An application that configured nothing gets info and above on stderr (its
        # stdout stays its own), as the CLI logs: UTC stamps, colours only on a terminal.
        log = structlog.wrap_logger(
            structlog.PrintLogger(file=sys.stderr),
            processors=safe_default_processors(),
            wrapper_class=structlog.make_filtering_bound_logger(
                logging.DEBUG if _DEBUG_BY_ENV else logging.INFO
            ),
            context_class=dict,
            cache_logger_on_first_use=True,
        )
    return log.bind(**initial) if initial else log


class LazyLogger:
    """A module-level ``asyncq`` logger that resolves :func:`get_logger` at each use.

    An application usually configures structlog after importing asyncq; resolving
    at import time would miss that configuration (or, unconfigured, fall back to
    structlog's defaults: every level, on stdout).
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(get_logger(), name)


def safe_default_processors() -> list[Any]:
    """structlog's default processors, with tracebacks rendered plainly (no locals)."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.StackInfoRenderer(),
        structlog.dev.set_exc_info,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        ),
    ]


_DEBUG_CHECK_TTL = 1.0
_DEBUG_CHECKS: dict[int, tuple[float, object, bool]] = {}


def is_debug_enabled(log: Any) -> bool:
    """Whether *log* emits DEBUG events (guards the per-task debug events on the hot path).

    Unconfigured structlog prints every level, DEBUG included, so asyncq only
    emits its per-task debug events when the application configured structlog
    with DEBUG enabled, or set ``ASYNCQ_LOG_LEVEL=debug``.
    """
    if not structlog.is_configured():
        return _DEBUG_BY_ENV
    # Asking a lazy structlog proxy binds a new logger each time (microseconds per
    # enqueue): the answer is kept while structlog's wrapper class is the same, for a
    # second at most (a stdlib logger's level can change without a reconfiguration).
    now = time.monotonic()
    key = id(log)
    wrapper = structlog.get_config()["wrapper_class"]
    known = _DEBUG_CHECKS.get(key)
    if known is not None and known[1] is wrapper and now - known[0] < _DEBUG_CHECK_TTL:
        return known[2]
    check = getattr(log, "is_enabled_for", None)
    if check is None:
        enabled = True
    else:
        try:
            enabled = bool(check(logging.DEBUG))
        except Exception:  # a custom wrapper class without a working level check
            enabled = True
    if len(_DEBUG_CHECKS) >= 1024:
        _DEBUG_CHECKS.clear()
    _DEBUG_CHECKS[key] = (now, wrapper, enabled)
    return enabled


class DebugCheck:
    """:func:`is_debug_enabled` for one logger, asked again once a second at most: for a
    check made on every call of a hot path (a Client's enqueue), where asking structlog
    for its configuration each time cost a tenth of the call's Python. A change of the
    configuration shows within that second, as a stdlib level change does there."""

    __slots__ = ("_enabled", "_log", "_until")

    def __init__(self, log: Any) -> None:
        self._log = log
        self._until = -math.inf
        self._enabled = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now >= self._until:
            self._enabled = is_debug_enabled(self._log)
            self._until = now + _DEBUG_CHECK_TTL
        return self._enabled


def task_fields(msg: TaskMessage) -> dict[str, Any]:
    """The fields bound to every task event: task_id, task_type, queue."""
    return {"task_id": msg.id, "task_type": msg.type, "queue": msg.queue}


def error_text(exc: BaseException) -> str:
    """An error as text: asynq's message for asyncq errors, else ``"<Class>: <message>"``.

    This is what goes into a task's ``error_msg`` (asynq's ``err.Error()``) and the logs.
    """
    text = str(exc)
    if isinstance(exc, AsyncqError):
        return text or exc.__class__.__name__
    name = exc.__class__.__qualname__
    return f"{name}: {text}" if text else name


class RateLimiter:
    """Allows one event per *interval* seconds and counts the ones it held back."""

    __slots__ = ("_clock", "_last", "interval", "suppressed")

    def __init__(self, interval: float = 3.0, *, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self.suppressed = 0

    def allow(self) -> bool:
        """True when an event may be emitted now; callers report :attr:`suppressed` then."""
        now = self._clock()
        if self._last is None or now - self._last >= self.interval:
            self._last = now
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        """The number of events held back since the last allowed one, and reset it."""
        n, self.suppressed = self.suppressed, 0
        return n


class Backoff:
    """Exponential backoff: *initial*, doubling up to *maximum* seconds; reset on success."""

    __slots__ = ("attempts", "initial", "maximum")

    def __init__(self, initial: float = 0.05, maximum: float = 1.0) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self.attempts = 0

    def next_delay(self) -> float:
        """The delay before the next attempt (grows with every call)."""
        delay: float = min(self.maximum, self.initial * float(1 << min(self.attempts, 32)))
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
