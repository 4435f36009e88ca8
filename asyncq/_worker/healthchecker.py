"""The healthchecker role (asynq's healthchecker).

Only started when ``Server(health_check=...)`` is given. Every
``health_check_interval`` (15 s) it PINGs Redis and calls the function with
None when Redis answered, or with the exception otherwise. The function may be
sync or async; an exception it raises is logged and the checks go on.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import ClassVar

from asyncq._worker.roles import PeriodicRole, RoleDeps

__all__ = ["HealthChecker"]


class HealthChecker(PeriodicRole):
    """Reports Redis reachability to the user's health-check function."""

    name: ClassVar[str] = "healthchecker"
    run_at_start: ClassVar[bool] = False

    def __init__(
        self, deps: RoleDeps, interval: float, *, ping: Callable[[], Awaitable[object]]
    ) -> None:
        super().__init__(deps, interval)
        self._ping = ping

    async def tick(self) -> None:
        fn = self.config.health_check
        if fn is None:
            return
        error: Exception | None = None
        try:
            await self._ping()
        except Exception as exc:
            error = exc
        try:
            result = fn(error)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self.log.error("health_check function raised", exc_info=exc)
