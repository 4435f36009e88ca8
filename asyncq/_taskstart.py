""":func:`start_task`: anyio's ``TaskGroup.start`` handshake for asyncio tasks.

A long-lived task is started, not only created: its body takes a ``task_status``
(anyio's :class:`anyio.abc.TaskStatus`) and calls ``task_status.started()`` once it
serves, and :func:`start_task` returns then. A body that raises before that makes
:func:`start_task` raise the same exception at once, where a readiness event with a timeout
would only say "not ready in time"; the task itself then ends without raising, so the
starter, not the group the task runs in, decides what the failure means. A body that
returns without calling ``started()`` counts as started (it had nothing to wait for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from anyio.abc import TaskStatus

__all__ = ["Spawn", "TaskOwner", "start_task"]

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]
"""Creates the task in its owner: ``task_group.create_task`` with a name, say."""


class _Status:
    """The ``task_status`` one :func:`start_task` hands its task (anyio's TaskStatus)."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def started(self, value: None = None) -> None:
        if not self.ready.done():
            self.ready.set_result(None)


def _sole(exc: BaseException) -> BaseException:
    """A TaskGroup raises a failure of its own body inside an ExceptionGroup: the one
    exception of such a group, itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def start_task(
    spawn: Spawn, body: Callable[[TaskStatus[None]], Awaitable[None]]
) -> asyncio.Task[None]:
    """Run ``body(task_status)`` in a task made by *spawn*; return the task once it
    called ``task_status.started()``, or raise what it raised before."""
    status = _Status()

    async def run() -> None:
        try:
            await body(status)
        except BaseException as exc:
            if status.ready.done():
                raise
            if isinstance(exc, asyncio.CancelledError):
                status.ready.cancel()
                raise
            status.ready.set_exception(_sole(exc))
            return
        status.started()

    task = spawn(run())
    await status.ready
    return task


class TaskOwner:
    """The group of an object's background tasks where no ``asyncio.TaskGroup`` can be
    held open: the object is no task's scope (a Client is made in one task, used from
    many and closed in another). Like a TaskGroup it keeps every task it created, and
    :meth:`aclose` cancels those still running, waits for all of them and raises the
    first error one ended with: no task outlives its owner, and no failure is lost."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def create_task(self, body: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(body, name=name)
        self._tasks.add(task)
        return task

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
