"""The syncer role (asynq's syncer).

A task outcome (done, retry, archive...) that could not be written because
Redis was unreachable is queued here and retried every ``syncer_interval``
(5 s) until the task's lease deadline; past it the write is dropped with an
error line, because by then the task belongs to the recoverer (it will be
retried, never lost). At shutdown the queue is flushed one last time (not on a
forced shutdown); whatever is left, or handed over afterwards, is logged as an
error and dropped: the recoverer retries those tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

from asyncq._logging import error_text, task_fields
from asyncq._redis.errors import REDIS_ERRORS, is_transient
from asyncq._worker.roles import PeriodicRole, RoleDeps
from asyncq.proto.asynq import TaskMessage

__all__ = ["Syncer"]


@dataclass(slots=True)
class _PendingWrite:
    write: Callable[[], Awaitable[None]]
    deadline: float
    what: str
    msg: TaskMessage


class Syncer(PeriodicRole):
    """Retries failed task-outcome writes until their lease deadline."""

    name: ClassVar[str] = "syncer"
    run_at_start: ClassVar[bool] = False

    def __init__(self, deps: RoleDeps, interval: float) -> None:
        super().__init__(deps, interval)
        self.pending: list[_PendingWrite] = []
        self._closed = False

    def add(
        self, write: Callable[[], Awaitable[None]], *, deadline: float, what: str, msg: TaskMessage
    ) -> None:
        """Queue a write to retry until *deadline* (unix s)."""
        item = _PendingWrite(write, deadline, what, msg)
        if self._closed:
            self._dropped(item)
            return
        self.pending.append(item)

    async def tick(self) -> None:
        await self.flush()

    async def flush(self) -> None:
        """Try every queued write once, keeping those that still fail and are not overdue."""
        if not self.pending:
            return
        clock = self.broker.clock
        batch, self.pending = self.pending, []
        keep: list[_PendingWrite] = []
        for item in batch:
            fields = task_fields(item.msg)
            if clock() > item.deadline:
                self.log.error(
                    "gave up writing a task outcome: its lease expired; the recoverer will "
                    "retry the task",
                    outcome=item.what, **fields,
                )  # fmt: skip
                continue
            try:
                await item.write()
            except REDIS_ERRORS as exc:
                if is_transient(exc):
                    keep.append(item)
                    self.redis_error("could not write task outcome", exc, **fields)
                else:
                    self.log.error(
                        "task outcome rejected by Redis", outcome=item.what,
                        error=error_text(exc), **fields,
                    )  # fmt: skip
            else:
                self.log.info("task outcome written by the syncer", outcome=item.what, **fields)
        self.pending = keep + self.pending

    async def cleanup(self) -> None:
        await self.flush()
        self.close()

    async def finish(self, *, forced: bool) -> None:
        if forced:
            self.close()  # no final flush: Redis may be what we are not waiting for
        else:
            await self.cleanup()

    def close(self) -> None:
        """Drop what is left (logged); later writes are logged and dropped at once."""
        self._closed = True
        for item in self.pending:
            self._dropped(item)
        self.pending.clear()

    def _dropped(self, item: _PendingWrite) -> None:
        self.log.error(
            "task outcome not written at shutdown; the recoverer will retry the task",
            outcome=item.what, **task_fields(item.msg),
        )  # fmt: skip
