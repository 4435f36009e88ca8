"""The tasks' coroutines of a processor, tracked as asynq's processor tracks them, and
owned by one task of the processor's TaskGroup.

Why not ``TaskGroup.create_task`` for each: on Python 3.11 it is Python code (a name to
set, a done callback of its own, run again when the task ends), about 7 calls per task,
worth several µs of worker CPU per task (issue 40). Here a task's coroutine costs the
loop's ``create_task``, ``set.add`` and ``add_done_callback(set.discard)``, all in C,
and the group still waits for every one of them through :meth:`OwnedAttempts.own`, a
task of the group: it returns once no new coroutine can start and every one has ended,
and when the group is cancelled it cancels them and waits for them, as the group would.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine
from typing import Any

__all__ = ["OwnedAttempts"]


class OwnedAttempts:
    """The running tasks' coroutines of one ``Processor.run()``; see the module docstring."""

    def __init__(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._owning = True  # own() has not returned: new coroutines join _tasks
        self._no_more = asyncio.Event()
        group.create_task(self.own())

    def spawn(
        self, coro: Coroutine[Any, Any, None], context: contextvars.Context
    ) -> asyncio.Task[None]:
        """Start a task's coroutine in *context*, owned by :meth:`own` (or by the group
        itself once that one has returned)."""
        if not self._owning:
            return self._group.create_task(coro, context=context)
        task = self._loop.create_task(coro, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def close(self) -> None:
        """No new coroutine will come from the fetch loop: :meth:`own` may return once the
        running ones have ended."""
        self._no_more.set()

    async def own(self) -> None:
        """Return once :meth:`close` was called and every coroutine has ended; cancelled
        with the group, cancel them and wait for them."""
        tasks = self._tasks
        try:
            await self._no_more.wait()
            while tasks:
                await asyncio.wait(list(tasks))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            while tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait(list(tasks))
            raise
        finally:
            self._owning = False
