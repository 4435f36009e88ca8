"""asyncq: an asyncio-native task queue on Redis, wire-compatible with Go asynq v0.26.

Producers ``await Client(...).enqueue(Task(...))``; workers run a ``Server`` with
a ``ServeMux`` of ``async def`` handlers; operators use the ``Inspector`` (and
the ``asyncq`` command line); cron-style work goes through a ``Scheduler``.
"""

from types import FunctionType as _FunctionType

from asyncq._inspection.inspector import Inspector
from asyncq._inspection.records import (
    ArchiveReport,
    ClusterNode,
    DailyStats,
    ErrorGroup,
    ErrorGroupResult,
    ErrorReport,
    GroupInfo,
    QueueInfo,
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    SkippedQueue,
    TypeRateInfo,
    WorkerInfo,
)
from asyncq._producer.client import Client
from asyncq._producer.completion import TaskFailedError
from asyncq._producer.failover import EnqueueRetryError, RetryPolicy
from asyncq._producer.workflow import (
    Group,
    Pipe,
    Step,
    StepFailure,
    Workflow,
    WorkflowExistsError,
    WorkflowFailedError,
    WorkflowHandle,
    WorkflowInfo,
    WorkflowNotFoundError,
    WorkflowStepInfo,
    chain,
    chord,
    group,
    group_results,
    typed_group,
)
from asyncq._redis.connection import Connection
from asyncq._redis.options import (
    RedisClientOpts,
    RedisClusterOpts,
    RedisSentinelOpts,
    TLSConfig,
    parse_redis_uri,
)
from asyncq._scheduling.periodic import PeriodicTaskConfig, PeriodicTaskManager
from asyncq._scheduling.scheduler import EntryNotFoundError, Scheduler
from asyncq._serde import TaskArgumentError, TaskResultError
from asyncq._worker.config import Aggregation, GroupAggregator, Intervals, Limits
from asyncq._worker.result_writer import ResultWriteError
from asyncq._worker.server import Server, ServerStats
from asyncq.app import App, CronEntry, TaskCall, TaskHandle, TypedTask, WorkerOptions, current_task
from asyncq.errors import (
    AsyncqError,
    BrokerError,
    DeadlineExceededError,
    DuplicateTaskError,
    FailedPreconditionError,
    HandlerNotFoundError,
    LeaseExpiredError,
    QueueNotEmptyError,
    QueueNotFoundError,
    RateLimited,
    RedisOutOfMemoryError,
    ReplicationTimeoutError,
    RevokeTask,
    ServerClosedError,
    SkipRetry,
    TaskCanceledError,
    TaskIdConflictError,
    TaskNotFoundError,
    UnsupportedServerError,
)
from asyncq.events import Event
from asyncq.hooks import WorkerHooks
from asyncq.lifespan import lifespan_state
from asyncq.mux import Handler, Middleware, ServeMux
from asyncq.progress import progress
from asyncq.sync import SyncClient, SyncTaskHandle
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskOptions, TaskProgress, TaskState

__version__ = "0.1.0"

__all__ = [
    "Aggregation",
    "App",
    "ArchiveReport",
    "AsyncqError",
    "BrokerError",
    "Client",
    "ClusterNode",
    "Connection",
    "CronEntry",
    "DailyStats",
    "DeadlineExceededError",
    "DuplicateTaskError",
    "EnqueueOptions",
    "EnqueueRetryError",
    "EntryNotFoundError",
    "ErrorGroup",
    "ErrorGroupResult",
    "ErrorReport",
    "Event",
    "FailedPreconditionError",
    "Group",
    "GroupAggregator",
    "GroupInfo",
    "Handler",
    "HandlerNotFoundError",
    "Inspector",
    "Intervals",
    "LeaseExpiredError",
    "Limits",
    "Middleware",
    "PeriodicTaskConfig",
    "PeriodicTaskManager",
    "Pipe",
    "QueueInfo",
    "QueueNotEmptyError",
    "QueueNotFoundError",
    "RateLimited",
    "RedisClientOpts",
    "RedisClusterOpts",
    "RedisOutOfMemoryError",
    "RedisSentinelOpts",
    "ReplicationTimeoutError",
    "ResultWriteError",
    "RetryPolicy",
    "RevokeTask",
    "Scheduler",
    "SchedulerEnqueueEvent",
    "SchedulerEntry",
    "ServeMux",
    "Server",
    "ServerClosedError",
    "ServerInfo",
    "ServerStats",
    "SkipRetry",
    "SkippedQueue",
    "Step",
    "StepFailure",
    "SyncClient",
    "SyncTaskHandle",
    "TLSConfig",
    "Task",
    "TaskArgumentError",
    "TaskCall",
    "TaskCanceledError",
    "TaskFailedError",
    "TaskHandle",
    "TaskIdConflictError",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskOptions",
    "TaskProgress",
    "TaskResultError",
    "TaskState",
    "TypeRateInfo",
    "TypedTask",
    "UnsupportedServerError",
    "WorkerHooks",
    "WorkerInfo",
    "WorkerOptions",
    "Workflow",
    "WorkflowExistsError",
    "WorkflowFailedError",
    "WorkflowHandle",
    "WorkflowInfo",
    "WorkflowNotFoundError",
    "WorkflowStepInfo",
    "__version__",
    "chain",
    "chord",
    "current_task",
    "group",
    "group_results",
    "lifespan_state",
    "parse_redis_uri",
    "progress",
    "typed_group",
]

# Names defined in private modules present themselves as ``asyncq.<name>`` (as httpx
# does), so reprs, tracebacks and docs show the public path, not an internal one.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type | _FunctionType) and _obj.__module__.startswith("asyncq._"):
        _obj.__module__ = "asyncq"
del _name, _obj, _FunctionType
