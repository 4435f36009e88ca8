"""Roles and their supervision, shared by the services: the Server's roles
(:mod:`asyncq._worker.roles`) and the Scheduler's (:mod:`asyncq._scheduling.roles`).

A role is one long-running loop of a service, one asyncio task in the service's
TaskGroup, running :func:`supervise` around the role's ``run()``; it leaves its loop at
the next opportunity once asked (:meth:`ServiceRole.request_stop`), and its sleeps end
then. It is started with a handshake (:mod:`asyncq._taskstart`): a role that cannot
start fails its service's ``start()`` with its own error.

Crash policy: **restart with exponential backoff**. A role whose ``run()`` raises, once
started, is logged at ERROR level with its traceback, told (:meth:`ServiceRole.crashed`,
the Server counts it) and restarted after a delay that doubles from 0.1 s up to 30 s
(reset once the role has run for a minute without crashing). Failing the whole service
instead would turn a bug in one role into the loss of all the others; restarting keeps
the service serving and the ERROR lines keep the problem loud.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, ClassVar

from anyio import TASK_STATUS_IGNORED
from anyio.abc import TaskStatus

from asyncq._logging import RateLimiter, error_text

__all__ = ["ServiceRole", "supervise"]

_RESTART_MIN = 0.1
_RESTART_MAX = 30.0
_HEALTHY_RUN = 60.0


class ServiceRole:
    """A background role of a service: ``run()`` loops until :meth:`request_stop`."""

    name: ClassVar[str] = "role"
    reports_started: ClassVar[bool] = False
    """True for a role whose ``run()`` calls :meth:`started` itself, once its service
    may count it started (the Server's subscriber: after its first attempt to
    subscribe); any other role is started as its ``run()`` begins."""

    def __init__(self, log: Any) -> None:
        self.log: Any = log.bind(role=self.name)
        self._stop = asyncio.Event()
        self._redis_errors = RateLimiter(3.0)
        self._task_status: TaskStatus[None] = TASK_STATUS_IGNORED
        self._started = False

    def started(self) -> None:
        """The role serves: its :func:`supervise` handshake completes (once)."""
        self._started = True
        self._task_status.started()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Ask the role to leave its loop at the next opportunity."""
        self._stop.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep up to *seconds*, returning early when the role is asked to stop."""
        if self._stop.is_set() or seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def run(self) -> None:
        raise NotImplementedError

    def crashed(self) -> None:
        """Told of each crash of ``run()`` once started, before the restart."""

    def redis_error(self, event: str, exc: BaseException, **kw: Any) -> None:
        """Log a Redis failure, at most once per 3 s per role."""
        if self._redis_errors.allow():
            suppressed = self._redis_errors.take_suppressed()
            self.log.warning(
                event,
                error=error_text(exc),
                suppressed_since_last=suppressed,
                **kw,
            )


async def supervise(role: ServiceRole, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
    """Run *role* until it stops, restarting it with backoff when it crashes.

    *task_status* is anyio's start handshake (:mod:`asyncq._taskstart`): started once the
    role is (see :attr:`ServiceRole.reports_started`). A crash before that is a failed
    start, not a crash to restart from: it is raised, to whoever started the role.
    """
    role._task_status = task_status
    if not role.reports_started:
        role.started()
    attempts = 0
    while True:
        began = time.monotonic()
        try:
            await role.run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not role._started:
                raise
            if time.monotonic() - began >= _HEALTHY_RUN:
                attempts = 0
            attempts += 1
            role.crashed()
            if role.stopping:
                role.log.error("role crashed while stopping", exc_info=exc)
                return
            delay = min(_RESTART_MAX, _RESTART_MIN * 2 ** (attempts - 1))
            role.log.error(
                "role crashed; restarting", restart_in=round(delay, 3), crashes=attempts,
                exc_info=exc,
            )  # fmt: skip
            await role.sleep(delay)
            if role.stopping:
                return
