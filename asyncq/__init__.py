"""asyncq: an asyncio-native task queue on Redis, wire-compatible with Go asynq v0.26.

Producers ``await Client(...).enqueue(Task(...))``; workers run a ``Server`` with
a ``ServeMux`` of ``async def`` handlers; operators use the ``Inspector`` (and
the ``asyncq`` command line); cron-style work goes through a ``Scheduler``.

``import asyncq`` is light: each public name's module is imported the first time the
name is used (PEP 562), so a web app that only enqueues does not load the worker, the
inspector or the workflows, and the command line starts without loading what a
command does not use.
"""

from importlib import import_module
from types import FunctionType
from typing import TYPE_CHECKING, Any

# ``asyncq.progress`` is a module and a function: the function is bound here, at once,
# so that a later first import of the module cannot rebind the package's attribute.
from asyncq.progress import progress

if TYPE_CHECKING:
    from asyncq._inspection.inspector import Inspector
    from asyncq._inspection.records import (
        ArchiveReport,
        ClusterNode,
        DailyStats,
        DurableEntry,
        DurableRunInfo,
        DurableRunPage,
        DurableRunSummary,
        DurableWait,
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
    from asyncq._worker.config import (
        Aggregation,
        GroupAggregator,
        Intervals,
        Limits,
        ServerOptions,
    )
    from asyncq._worker.result_writer import ResultWriteError
    from asyncq._worker.server import Server, ServerStats
    from asyncq.app import (
        App,
        CronEntry,
        DurableFunction,
        TaskCall,
        TaskHandle,
        TypedTask,
        WorkerOptions,
        current_task,
    )
    from asyncq.durable import Run, StepCall, StepFailedError
    from asyncq.errors import (
        AmbiguousIdError,
        AsyncqError,
        BrokerError,
        DeadlineExceededError,
        DuplicateTaskError,
        DurableRunNotFoundError,
        FailedPreconditionError,
        HandlerNotFoundError,
        LeaseExpiredError,
        NonDeterminismError,
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
        TaskStoppedError,
        UnsupportedServerError,
    )
    from asyncq.events import Event
    from asyncq.hooks import WorkerHooks
    from asyncq.lifespan import lifespan_state
    from asyncq.mux import Handler, Middleware, ServeMux
    from asyncq.sync import SyncClient, SyncTaskHandle
    from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskOptions, TaskProgress, TaskState

__version__ = "0.1.0"

__all__ = [
    "Aggregation",
    "AmbiguousIdError",
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
    "DurableEntry",
    "DurableFunction",
    "DurableRunInfo",
    "DurableRunNotFoundError",
    "DurableRunPage",
    "DurableRunSummary",
    "DurableWait",
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
    "NonDeterminismError",
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
    "Run",
    "Scheduler",
    "SchedulerEnqueueEvent",
    "SchedulerEntry",
    "ServeMux",
    "Server",
    "ServerClosedError",
    "ServerInfo",
    "ServerOptions",
    "ServerStats",
    "SkipRetry",
    "SkippedQueue",
    "Step",
    "StepCall",
    "StepFailedError",
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
    "TaskStoppedError",
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

_HOMES: dict[str, str] = {
    "Inspector": "asyncq._inspection.inspector",
    "ArchiveReport": "asyncq._inspection.records",
    "ClusterNode": "asyncq._inspection.records",
    "DailyStats": "asyncq._inspection.records",
    "DurableEntry": "asyncq._inspection.records",
    "DurableRunInfo": "asyncq._inspection.records",
    "DurableRunPage": "asyncq._inspection.records",
    "DurableRunSummary": "asyncq._inspection.records",
    "DurableWait": "asyncq._inspection.records",
    "ErrorGroup": "asyncq._inspection.records",
    "ErrorGroupResult": "asyncq._inspection.records",
    "ErrorReport": "asyncq._inspection.records",
    "GroupInfo": "asyncq._inspection.records",
    "QueueInfo": "asyncq._inspection.records",
    "SchedulerEnqueueEvent": "asyncq._inspection.records",
    "SchedulerEntry": "asyncq._inspection.records",
    "ServerInfo": "asyncq._inspection.records",
    "SkippedQueue": "asyncq._inspection.records",
    "TypeRateInfo": "asyncq._inspection.records",
    "WorkerInfo": "asyncq._inspection.records",
    "Client": "asyncq._producer.client",
    "TaskFailedError": "asyncq._producer.completion",
    "EnqueueRetryError": "asyncq._producer.failover",
    "RetryPolicy": "asyncq._producer.failover",
    "Group": "asyncq._producer.workflow",
    "Pipe": "asyncq._producer.workflow",
    "Step": "asyncq._producer.workflow",
    "StepFailure": "asyncq._producer.workflow",
    "Workflow": "asyncq._producer.workflow",
    "WorkflowExistsError": "asyncq._producer.workflow",
    "WorkflowFailedError": "asyncq._producer.workflow",
    "WorkflowHandle": "asyncq._producer.workflow",
    "WorkflowInfo": "asyncq._producer.workflow",
    "WorkflowNotFoundError": "asyncq._producer.workflow",
    "WorkflowStepInfo": "asyncq._producer.workflow",
    "chain": "asyncq._producer.workflow",
    "chord": "asyncq._producer.workflow",
    "group": "asyncq._producer.workflow",
    "group_results": "asyncq._producer.workflow",
    "typed_group": "asyncq._producer.workflow",
    "Connection": "asyncq._redis.connection",
    "RedisClientOpts": "asyncq._redis.options",
    "RedisClusterOpts": "asyncq._redis.options",
    "RedisSentinelOpts": "asyncq._redis.options",
    "TLSConfig": "asyncq._redis.options",
    "parse_redis_uri": "asyncq._redis.options",
    "PeriodicTaskConfig": "asyncq._scheduling.periodic",
    "PeriodicTaskManager": "asyncq._scheduling.periodic",
    "EntryNotFoundError": "asyncq._scheduling.scheduler",
    "Scheduler": "asyncq._scheduling.scheduler",
    "TaskArgumentError": "asyncq._serde",
    "TaskResultError": "asyncq._serde",
    "Aggregation": "asyncq._worker.config",
    "GroupAggregator": "asyncq._worker.config",
    "Intervals": "asyncq._worker.config",
    "Limits": "asyncq._worker.config",
    "ServerOptions": "asyncq._worker.config",
    "ResultWriteError": "asyncq._worker.result_writer",
    "Server": "asyncq._worker.server",
    "ServerStats": "asyncq._worker.server",
    "App": "asyncq.app",
    "CronEntry": "asyncq.app",
    "TaskCall": "asyncq.app",
    "TaskHandle": "asyncq.app",
    "TypedTask": "asyncq.app",
    "WorkerOptions": "asyncq.app",
    "current_task": "asyncq.app",
    "DurableFunction": "asyncq.app",
    "Run": "asyncq.durable",
    "StepCall": "asyncq.durable",
    "StepFailedError": "asyncq.durable",
    "NonDeterminismError": "asyncq.errors",
    "AmbiguousIdError": "asyncq.errors",
    "AsyncqError": "asyncq.errors",
    "BrokerError": "asyncq.errors",
    "DeadlineExceededError": "asyncq.errors",
    "DuplicateTaskError": "asyncq.errors",
    "DurableRunNotFoundError": "asyncq.errors",
    "FailedPreconditionError": "asyncq.errors",
    "HandlerNotFoundError": "asyncq.errors",
    "LeaseExpiredError": "asyncq.errors",
    "QueueNotEmptyError": "asyncq.errors",
    "QueueNotFoundError": "asyncq.errors",
    "RateLimited": "asyncq.errors",
    "RedisOutOfMemoryError": "asyncq.errors",
    "ReplicationTimeoutError": "asyncq.errors",
    "RevokeTask": "asyncq.errors",
    "ServerClosedError": "asyncq.errors",
    "SkipRetry": "asyncq.errors",
    "TaskCanceledError": "asyncq.errors",
    "TaskStoppedError": "asyncq.errors",
    "TaskIdConflictError": "asyncq.errors",
    "TaskNotFoundError": "asyncq.errors",
    "UnsupportedServerError": "asyncq.errors",
    "Event": "asyncq.events",
    "WorkerHooks": "asyncq.hooks",
    "lifespan_state": "asyncq.lifespan",
    "Handler": "asyncq.mux",
    "Middleware": "asyncq.mux",
    "ServeMux": "asyncq.mux",
    "SyncClient": "asyncq.sync",
    "SyncTaskHandle": "asyncq.sync",
    "EnqueueOptions": "asyncq.task",
    "Task": "asyncq.task",
    "TaskInfo": "asyncq.task",
    "TaskOptions": "asyncq.task",
    "TaskProgress": "asyncq.task",
    "TaskState": "asyncq.task",
}
"""Where each public name (but ``progress``) is defined."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'asyncq' has no attribute {name!r}")
    obj = getattr(import_module(home), name)
    # Names defined in private modules present themselves as ``asyncq.<name>`` (as httpx
    # does), so reprs, tracebacks and docs show the public path, not an internal one.
    if isinstance(obj, type | FunctionType) and obj.__module__.startswith("asyncq._"):
        obj.__module__ = "asyncq"
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
