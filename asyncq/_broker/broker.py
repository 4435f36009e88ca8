"""Broker: awaitable methods over asynq v0.26's Redis layout (asynq's ``internal/rdb``).

Every method that changes more than one key runs a Lua script from ``lua/``
so that no ID ever sits in a list or sorted set without its task hash. The
scripts take asynq's KEYS/ARGV in asynq's order and leave the same Redis
state (hash fields, scores in unix seconds, ``pending_since`` in unix
nanoseconds, counters with ``EXPIREAT`` now + 90 days and the max-int64
wrap), so Go servers, the asynq CLI and asynqmon work on what asyncq writes
and the other way round. Times come from the injectable ``clock`` (unix
seconds as a float) or from aware datetimes; naive datetimes raise ValueError.

Errors: a task missing from the structure an operation expects raises
:class:`~asyncq.errors.TaskNotFoundError` (asynq's ``NOT FOUND`` reply);
other script errors raise :class:`~asyncq.errors.BrokerError`; connection
problems propagate as ``redis.exceptions.RedisError`` subclasses.

asyncq extensions (Go asynq is unaffected by all of them):

* **Instant pickup.** The enqueue, enqueue_unique, requeue and forward scripts
  PUBLISH the queue name on :func:`asyncq._keys.wakeup_channel` when they push
  into a pending list that was empty (LPUSH/RPUSH returned 1). The channel
  and the message are extra trailing ARGV after asynq's, so KEYS and asynq's
  ARGV are unchanged; a channel is not a key, so cluster slots are unaffected.
  The PUBLISH is best effort (``redis.pcall``): a user whose ACL denies the
  channel, which Go asynq never needs, still gets the write and no error.
* **Batched dequeue.** :meth:`Broker.fetch` (``dequeue_queues.lua``, see
  :mod:`asyncq._broker.multiqueue`) moves up to a count of tasks, each exactly
  as asynq's dequeue does, from queues tried in the given order, in one call
  for all queues (per node on a cluster). The forwarder, recoverer and janitor
  passes are batched over the queues the same way; asynq's per-queue scripts
  are kept in the tests only, as the reference these are checked against.
* **Undecodable messages are archived, never dropped.** A ``msg`` that fails
  to decode (or whose id is not the task's id, or, at dequeue, whose queue
  is not the queue it is stored in) is moved to ``archived`` of that queue by
  ``archive_undecodable.lua``: the same transition and counters as asynq's
  Archive, but the raw bytes are kept as they are and the reason goes into
  the extra hash field ``asyncq_error`` (the protobuf cannot be rewritten).
  This happens in fetch, scan_leases and read_aggregation_set.
* **Batch enqueue** (asynq HEAD's BatchEnqueue): SCRIPT LOAD, then one
  non-transactional pipeline of SADD + one EVALSHA per item. Unlike asynq,
  an item whose ID already exists is reported as TaskIdConflictError (asynq
  silently counts it as not enqueued), and unique and group items are
  supported through their usual scripts.
* **Batched acknowledgement.** ``ack_many.lua`` applies asynq's Done or
  MarkAsComplete to many tasks of one queue in one call, building task keys
  from the queue's prefix (same hash tag, so the same cluster slot); the
  processed counters take one INCRBY per call unless the all-time counter is
  near its max-int64 wrap. Several queues go in one call (ack_queues.lua; a
  cluster pipelines one call per queue). A workflow step's success goes in the
  same call, which records it in its workflow and hands off (the batch's steps
  of one workflow and stage together; workflow_advance.lua).
* **asynq:queues registration.** The first time a Broker instance sees a
  queue it SADDs it to ``asynq:queues`` before the write (a per-instance
  cache, like asynq's per-process one). It is a separate command, not part
  of the scripts, because the global key is not in the queue's cluster slot.
* **Stranded groups.** The forward and reclaim scripts re-add the
  group name to ``groups`` (an extra trailing KEYS entry) when they put tasks
  back into a group; asynq does not, so such a group is not aggregated until
  another task joins it.
* **Orphan ids.** An id without a task hash (never written by asyncq) is
  dropped from scheduled/retry by forward and from active by dequeue instead
  of being moved on with a half-made hash; the archive trim never trims the
  task being archived.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property

from asyncq import _keys as keys
from asyncq._broker._base import (
    AGGREGATION_TIMEOUT,
    ARCHIVE_MAX_SIZE,
    ARCHIVED_EXPIRATION,
    LEASE_DURATION,
    SCHEDULER_HISTORY_CAP,
    STATS_TTL,
)
from asyncq._broker.aggregation import GroupTransitions
from asyncq._broker.delivery import DirectDelivery
from asyncq._broker.durable import SuspendPlan, start_inline
from asyncq._broker.durable import ack_step as ack_durable_step
from asyncq._broker.durable import suspend_run as suspend_durable_run
from asyncq._broker.heartbeats import HeartbeatWrites
from asyncq._broker.multiqueue import FetchResult, MultiQueue
from asyncq._broker.observations import Observations
from asyncq._broker.processing import DequeuedTask, ProcessingTransitions
from asyncq._broker.producer import BatchItem, ProducerWrites
from asyncq._broker.typerate import take_type_tokens
from asyncq._broker.workflow import AckMode, ack_step
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "AGGREGATION_TIMEOUT",
    "ARCHIVED_EXPIRATION",
    "ARCHIVE_MAX_SIZE",
    "LEASE_DURATION",
    "SCHEDULER_HISTORY_CAP",
    "STATS_TTL",
    "BatchItem",
    "Broker",
    "DequeuedTask",
    "FetchResult",
]


class Broker(
    ProducerWrites,
    ProcessingTransitions,
    DirectDelivery,
    HeartbeatWrites,
    GroupTransitions,
    Observations,
):
    """Awaitable asynq operations on one Redis connection (plain, Sentinel or Cluster).

    *redis* must return bytes (``decode_responses=False``): task messages are
    binary protobufs. *clock* returns the current unix time in seconds; every
    "now" of every operation comes from it. *fast*, a pipelined connection to
    the same server and database as *redis* (see
    :class:`~asyncq._redis.transport.FastConnection`), carries the script
    calls and hot-path commands when given; *redis* keeps the rest.
    """

    # -- what the worker's roles call (the WorkerBroker protocol, asyncq._worker.broker) ----

    @cached_property
    def _multi(self) -> MultiQueue:
        return MultiQueue(self)

    async def fetch(
        self,
        qnames: Sequence[str],
        count: int,
        *,
        strict: bool = False,
        max_bytes: int | None = None,
        first_free: bool = True,
        limits: Mapping[str, tuple[int, ...]] | None = None,
    ) -> FetchResult:
        """Take up to *count* tasks from *qnames*, tried in order, in one script call per
        Redis node (see :meth:`asyncq._broker.multiqueue.MultiQueue.dequeue`)."""
        return await self._multi.dequeue(
            qnames, count, strict=strict, max_bytes=max_bytes, first_free=first_free, limits=limits
        )

    async def forward_queues(self, qnames: Sequence[str]) -> int:
        """Move the due scheduled and retry tasks of every queue to pending (or their group)."""
        return await self._multi.forward(qnames)

    async def forward_due(self, qnames: Sequence[str]) -> tuple[int, float | None]:
        """:meth:`forward_queues`, and the earliest score left in the queues' scheduled and
        retry sets (unix s; None when empty), in the same script call per node."""
        return await self._multi.forward_due(qnames)

    async def scan_leases(
        self, cutoff: datetime, qnames: Sequence[str]
    ) -> tuple[list[tuple[str, TaskMessage]], float | None]:
        """``(queue, message)`` of the active tasks whose lease expired at or before
        *cutoff*, and the earliest lease expiry after it (unix s; None when none)."""
        return await self._multi.scan_leases(cutoff, qnames)

    async def delete_expired_completed_queues(
        self, qnames: Sequence[str], batch_size: int = 100
    ) -> int:
        """Delete the completed tasks past their retention in every queue."""
        return await self._multi.delete_expired_completed(qnames, batch_size)

    async def reclaim_stale_aggregation_sets_queues(self, qnames: Sequence[str]) -> None:
        """Put the members of aggregation sets past their deadline back into their group."""
        await self._multi.reclaim_stale_aggregation_sets(qnames)

    async def take_type_tokens(
        self, task_type: str, count: int, *, interval_us: int, burst: int, max_wait_us: int
    ) -> tuple[list[int], int]:
        """Take up to *count* tokens of *task_type*'s fleet-wide bucket in one call: the
        waits (µs) of the tokens taken and, when fewer were, the wait for the next one."""
        return await take_type_tokens(
            self, task_type, count, interval_us=interval_us, burst=burst, max_wait_us=max_wait_us
        )

    async def ack_workflow_step(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
        """Acknowledge a workflow step and advance its workflow atomically; its state after."""
        return await ack_step(self, msg, mode, err_msg)

    async def ack_durable_step(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
        """Acknowledge a durable run's step and record it in the run atomically."""
        return await ack_durable_step(self, msg, mode, err_msg)

    async def suspend_run(
        self, msg: TaskMessage, plan: SuspendPlan, *, step_here: float | None = None
    ) -> str:
        """End a durable run's attempt as *plan* says, atomically (*step_here*: see
        :func:`~asyncq._broker.durable.suspend_run`)."""
        return await suspend_durable_run(self, msg, plan, step_here=step_here)

    async def start_inline_steps(
        self, qname: str, attempts: Sequence[tuple[str, SuspendPlan]], lease_expiry: float
    ) -> list[str]:
        """Lease each plan's one step to us, its run's attempt going on (see
        :func:`~asyncq._broker.durable.start_inline`)."""
        return await start_inline(self, qname, attempts, lease_expiry)

    async def all_queues(self) -> set[str]:
        """The names in ``asynq:queues``."""
        return {
            m.decode() if isinstance(m, bytes) else m
            for m in await self.redis.smembers(keys.ALL_QUEUES)
        }

    async def mark_ordered(self, qname: str) -> None:
        """Mark *qname* ordered (asyncq flow control; the flag the dequeue script reads)."""
        await self.redis.set(keys.ordered_key(qname), "1")
