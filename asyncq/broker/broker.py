"""Broker: awaitable methods over asynq v0.26's Redis layout (asynq's ``internal/rdb``).

Every method that changes more than one key runs a Lua script from ``lua/``
so that no ID ever sits in a list or sorted set without its task hash. Times
are passed in as aware datetimes or unix floats from the injectable clock and
converted to asynq's units here (scores in seconds, ``pending_since`` in
nanoseconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from asyncq.connection import RedisClient
from asyncq.proto.asynq import SchedulerEnqueueEvent, SchedulerEntry, ServerInfo, TaskMessage, WorkerInfo

__all__ = ["LEASE_DURATION", "BatchItem", "Broker", "DequeuedTask"]

LEASE_DURATION = 30.0
"""Seconds a dequeued task's lease lasts (asynq's LeaseDuration)."""


@dataclass(slots=True)
class DequeuedTask:
    """A task taken from a queue: the decoded message and its lease expiry (unix s)."""

    message: TaskMessage
    lease_expiry: float


@dataclass(slots=True)
class BatchItem:
    """One task of a batch enqueue: scheduled when ``process_at`` is set, else pending."""

    message: TaskMessage
    process_at: float | None = None


class Broker:
    """Awaitable asynq operations on one Redis connection (plain, Sentinel or Cluster)."""

    def __init__(self, redis: RedisClient, *, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.clock = clock

    # -- client-side writes (asynq rdb.go, spec section 3.1) -------------------------------
    # Each enqueue-like method also SADDs the queue into asynq:queues the first time
    # this Broker sees the queue, and publishes on keys.wakeup_channel(queue) when the
    # pending list went from empty to non-empty (asyncq's instant pickup).

    async def enqueue(self, msg: TaskMessage) -> None:
        """Write a pending task. Raises TaskIdConflictError when ``t:<id>`` exists."""
        raise NotImplementedError

    async def enqueue_unique(self, msg: TaskMessage, ttl: int) -> None:
        """Pending task guarded by ``msg.unique_key`` for *ttl* s.

        Raises DuplicateTaskError (lock held) or TaskIdConflictError.
        """
        raise NotImplementedError

    async def schedule(self, msg: TaskMessage, process_at: datetime) -> None:
        """Write a scheduled task. Raises TaskIdConflictError."""
        raise NotImplementedError

    async def schedule_unique(self, msg: TaskMessage, process_at: datetime, ttl: int) -> None:
        """Scheduled task guarded by a unique lock. Raises DuplicateTaskError/TaskIdConflictError."""
        raise NotImplementedError

    async def add_to_group(self, msg: TaskMessage, group: str) -> None:
        """Write an aggregating task into ``g:<group>``. Raises TaskIdConflictError."""
        raise NotImplementedError

    async def add_to_group_unique(self, msg: TaskMessage, group: str, ttl: int) -> None:
        """Aggregating task guarded by a unique lock. Raises DuplicateTaskError/TaskIdConflictError."""
        raise NotImplementedError

    async def enqueue_batch(self, items: Sequence[BatchItem]) -> list[Exception | None]:
        """Enqueue many tasks in one pipeline; one result per item (None = written)."""
        raise NotImplementedError

    # -- server-side processing (spec section 3.2) ------------------------------------------

    async def dequeue(self, qnames: Sequence[str]) -> DequeuedTask | None:
        """Take one task from the first non-paused, non-empty queue in *qnames* order."""
        raise NotImplementedError

    async def dequeue_many(self, qnames: Sequence[str], count: int) -> list[DequeuedTask]:
        """Take up to *count* tasks in one round trip, each with its own lease."""
        raise NotImplementedError

    async def done(self, msg: TaskMessage) -> None:
        """Success without retention: delete the task, count it processed, release its lock."""
        raise NotImplementedError

    async def mark_as_complete(self, msg: TaskMessage) -> None:
        """Success with retention: move to ``completed`` scored by now + retention."""
        raise NotImplementedError

    async def requeue(self, msg: TaskMessage) -> None:
        """Put an active task back at the front of pending (shutdown); no retry counted."""
        raise NotImplementedError

    async def retry(
        self, msg: TaskMessage, process_at: datetime, err_msg: str, *, is_failure: bool
    ) -> None:
        """Move an active task to ``retry`` at *process_at*, recording the error."""
        raise NotImplementedError

    async def archive(self, msg: TaskMessage, err_msg: str) -> None:
        """Move an active task to ``archived``, trimming old/excess archived tasks."""
        raise NotImplementedError

    async def forward_if_ready(self, qnames: Sequence[str]) -> int:
        """Move due scheduled/retry tasks to pending (or back to their group); returns count."""
        raise NotImplementedError

    async def list_lease_expired(self, cutoff: datetime, qnames: Sequence[str]) -> list[TaskMessage]:
        """Messages of active tasks whose lease expired at or before *cutoff*."""
        raise NotImplementedError

    async def extend_lease(self, qname: str, task_ids: Sequence[str]) -> float:
        """Push the leases of *task_ids* to now + LEASE_DURATION; returns the new expiry."""
        raise NotImplementedError

    async def delete_expired_completed_tasks(self, qname: str, batch_size: int) -> int:
        """Delete completed tasks whose retention expired; returns how many."""
        raise NotImplementedError

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int:
        """HSET the task's ``result`` field; returns len(data)."""
        raise NotImplementedError

    async def write_server_state(
        self, info: ServerInfo, workers: Sequence[WorkerInfo], ttl: float
    ) -> None:
        """Heartbeat: ServerInfo and WorkerInfo records with *ttl* seconds to live."""
        raise NotImplementedError

    async def clear_server_state(self, host: str, pid: int, server_id: str) -> None:
        """Remove a server's info and workers records."""
        raise NotImplementedError

    async def write_scheduler_entries(
        self, scheduler_id: str, entries: Sequence[SchedulerEntry], ttl: float
    ) -> None:
        """Scheduler heartbeat: replace the scheduler's entry list, expiring after *ttl*."""
        raise NotImplementedError

    async def clear_scheduler_entries(self, scheduler_id: str) -> None:
        """Remove a scheduler's entries record."""
        raise NotImplementedError

    async def record_scheduler_enqueue_event(
        self, entry_id: str, event: SchedulerEnqueueEvent
    ) -> None:
        """Append to an entry's history, keeping the newest 1,000 events."""
        raise NotImplementedError

    async def clear_scheduler_history(self, entry_id: str) -> None:
        """Delete an entry's history."""
        raise NotImplementedError

    async def publish_cancelation(self, task_id: str) -> None:
        """PUBLISH the task ID on ``asynq:cancel``."""
        raise NotImplementedError

    # -- aggregation (spec section 3.3) -----------------------------------------------------

    async def list_groups(self, qname: str) -> list[str]:
        """Names of the queue's groups with aggregating tasks."""
        raise NotImplementedError

    async def aggregation_check(
        self,
        qname: str,
        group: str,
        t: datetime,
        grace_period: float,
        max_delay: float,
        max_size: int,
    ) -> str | None:
        """Stage an aggregation set when the group is ready; returns its set ID or None."""
        raise NotImplementedError

    async def read_aggregation_set(
        self, qname: str, group: str, set_id: str
    ) -> tuple[list[TaskMessage], datetime]:
        """The staged messages (oldest first) and the set's deadline."""
        raise NotImplementedError

    async def delete_aggregation_set(self, qname: str, group: str, set_id: str) -> None:
        """Delete a staged set and its members' task hashes (after the aggregate is enqueued)."""
        raise NotImplementedError

    async def reclaim_stale_aggregation_sets(self, qname: str) -> None:
        """Move members of sets past their deadline back into their group."""
        raise NotImplementedError
