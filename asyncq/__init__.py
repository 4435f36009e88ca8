"""asyncq: an asyncio-native task queue on Redis, wire-compatible with Go asynq v0.26."""

from asyncq.client import Client
from asyncq.connection import (
    Connection,
    RedisClientOpts,
    RedisClusterOpts,
    RedisSentinelOpts,
    TLSConfig,
    parse_redis_uri,
)
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
    "Client",
    "Connection",
    "DuplicateTaskError",
    "EnqueueOptions",
    "FailedPreconditionError",
    "HandlerNotFoundError",
    "LeaseExpiredError",
    "QueueNotEmptyError",
    "QueueNotFoundError",
    "RedisClientOpts",
    "RedisClusterOpts",
    "RedisSentinelOpts",
    "RevokeTask",
    "ServerClosedError",
    "SkipRetry",
    "TLSConfig",
    "Task",
    "TaskIdConflictError",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskOptions",
    "TaskState",
    "__version__",
    "parse_redis_uri",
]
