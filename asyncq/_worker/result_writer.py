"""The handler-side ResultWriter: ``await task.result_writer.write(b"...")``.

As in asynq, the result goes into the task hash's ``result`` field (HSET), and
writing is refused once the task's context is done: the handler returned, its
deadline passed, it was cancelled, or its lease expired.
"""

from __future__ import annotations

from typing import Protocol

from asyncq.errors import AsyncqError

__all__ = ["ResultWriteError", "TaskContext", "TaskResultWriter"]


class ResultWriteError(AsyncqError):
    """The result could not be written because the task's context is done."""


class TaskContext(Protocol):
    """What the result writer needs to know about the running task."""

    @property
    def task_id(self) -> str: ...

    @property
    def queue(self) -> str: ...

    def done_reason(self) -> str | None:
        """None while the handler may still act for the task, else why it may not."""
        ...


class ResultStore(Protocol):
    """Where results go: the broker's ``write_result`` (HSET of the ``result`` field)."""

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int: ...


class TaskResultWriter:
    """Writes a running task's result (asynq's ``ResultWriter``)."""

    __slots__ = ("_broker", "_ctx")

    def __init__(self, broker: ResultStore, ctx: TaskContext) -> None:
        self._broker = broker
        self._ctx = ctx

    @property
    def task_id(self) -> str:
        return self._ctx.task_id

    async def write(self, data: bytes) -> int:
        """Store *data* as the task's result; returns ``len(data)``.

        Raises ResultWriteError once the task's context is done, TypeError for non-bytes.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(
                f"task result must be bytes, got {data.__class__.__name__}; "
                "encode it first (e.g. json.dumps(...).encode())"
            )
        reason = self._ctx.done_reason()
        if reason is not None:
            raise ResultWriteError(f"failed to write task result: {reason}")
        return await self._broker.write_result(self._ctx.queue, self._ctx.task_id, bytes(data))

    def __repr__(self) -> str:
        return f"<TaskResultWriter task_id={self.task_id!r}>"
