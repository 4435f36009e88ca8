"""asyncq: an asyncio-native task queue on Redis, wire-compatible with Go asynq v0.26."""

from asyncq.errors import (
    AsyncqError,
    DuplicateTaskError,
    FailedPreconditionError,
    HandlerNotFoundError,
    LeaseExpiredError,
    QueueNotEmptyError,
    QueueNotFoundError,
    RevokeTask,
    ServerClosedError,
    SkipRetry,
    TaskIdConflictError,
    TaskNotFoundError,
)
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskOptions, TaskState

__version__ = "0.1.0"

__all__ = [
    "AsyncqError",
    "DuplicateTaskError",
    "EnqueueOptions",
    "FailedPreconditionError",
    "HandlerNotFoundError",
    "LeaseExpiredError",
    "QueueNotEmptyError",
    "QueueNotFoundError",
    "RevokeTask",
    "ServerClosedError",
    "SkipRetry",
    "Task",
    "TaskIdConflictError",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskOptions",
    "TaskState",
    "__version__",
]
