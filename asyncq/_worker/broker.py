"""The one door from the worker's roles to Redis: the :class:`WorkerBroker` protocol.

asynq's roles talk to Redis through its ``base.Broker`` interface, and its
tests swap in ``internal/testbroker``. This protocol is asyncq's reading of
it: exactly the calls the roles make (processor, heartbeater, recoverer,
forwarder, janitor, syncer, aggregator, queue watcher, history) and the
processor's observers make (completion notices, events, progress), nothing else.
:class:`asyncq._broker.Broker` implements it on Redis (each multi-queue call
is one script call per Redis node); ``tests/support/fakebroker.py`` implements it in
memory, with failure injection, so each role can be tested alone.

What the roles do not get here: the Redis client itself. The subscriber gets
its Pub/Sub connection, the health checker a ``ping`` and the watchdog a
connection factory, each from the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from asyncq._broker.delivery import DeliveryNote
    from asyncq._broker.durable import Recorded, SuspendPlan
    from asyncq._broker.multiqueue import FetchResult
    from asyncq._broker.processing import DequeuedTask
    from asyncq._broker.workflow import AckMode
    from asyncq.proto.asynq import ServerInfo as ServerInfoProto
    from asyncq.proto.asynq import TaskMessage
    from asyncq.proto.asynq import WorkerInfo as WorkerInfoProto

__all__ = ["WorkerBroker"]


class WorkerBroker(Protocol):
    """What the worker's roles call on the broker; see the module docstring."""

    clock: Callable[[], float]
    """The current unix time in seconds; every "now" of every call comes from it."""
    lease_duration: float
    """Seconds a dequeue or an extension leases a task for."""

    # -- processor --------------------------------------------------------------------------

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
        """Take up to *count* tasks from *qnames* in order, each with its own lease."""
        ...

    async def arm_delivery(self, server_id: str, ttl: float, qnames: Sequence[str] = ()) -> bool:
        """Ask for the next task of *qnames* to be delivered directly (none: renew the credit);
        False when the credit had expired and no queues were given."""
        ...

    async def disarm_delivery(self, server_id: str, qnames: Sequence[str]) -> None:
        """Stop being delivered tasks; leave the waiters lists of *qnames*."""
        ...

    async def reject_delivered(self, note: DeliveryNote) -> None:
        """Archive a delivered task whose message is unusable here, as a fetch would."""
        ...

    async def ack_many(
        self,
        items: Sequence[tuple[TaskMessage, bool]],
        *,
        runs_here: Callable[[str], bool] | None = None,
        inline: Mapping[str, bytes | None] | None = None,
    ) -> Sequence[Exception | DequeuedTask | Recorded | None]:
        """Done (False) or MarkAsComplete (True) for many tasks; one result per item.

        A workflow step's is its :meth:`ack_workflow_step` (``done`` or ``complete``):
        the workflow records it and hands off in the same write. A durable step's records
        it in its run; a run it wakes whose queue *runs_here* accepts continues on this
        worker: the step's result is then the run, leased to us, to start in its slot. A
        step of *inline* (id: the result its handler wrote, held until now) answers with
        what it recorded in its run, whose attempt goes on here
        (:class:`~asyncq._broker.durable.Recorded`), or None."""
        ...

    async def done(self, msg: TaskMessage) -> None: ...

    async def mark_as_complete(self, msg: TaskMessage) -> None: ...

    async def requeue(self, msg: TaskMessage) -> None: ...

    async def retry(
        self,
        msg: TaskMessage,
        process_at: datetime,
        err_msg: str,
        *,
        is_failure: bool,
        lease_expired_by: float | None = None,
    ) -> None: ...

    async def archive(
        self, msg: TaskMessage, err_msg: str, *, lease_expired_by: float | None = None
    ) -> None: ...

    async def ack_workflow_step(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
        """Acknowledge a workflow step with its hand-off; the workflow's state after.

        The processor writes a step's archive or revoke with it, and a step's success
        with it only when its batched acknowledgement (:meth:`ack_many`) failed."""
        ...

    async def ack_durable_step(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
        """Acknowledge a durable run's step, recording its outcome in the run (and waking
        the run when it waits for nothing more) in the same write; what the run got."""
        ...

    async def suspend_run(
        self, msg: TaskMessage, plan: SuspendPlan, *, step_here: float | None = None
    ) -> str:
        """End a durable run's attempt as *plan* says (its records, its steps enqueued, the
        run task parked or pending again); ``parked`` or ``ready``, or ``here`` when the
        plan's first step was leased to this worker until *step_here* instead of pending,
        or ``cancelled`` (nothing written) when the run was cancelled while it ran."""
        ...

    async def start_inline_steps(
        self, qname: str, attempts: Sequence[tuple[str, SuspendPlan]], lease_expiry: float
    ) -> list[str]:
        """For each ``(run id, plan)`` of *qname*: write what the run's attempt decided and
        lease the plan's one step to us until *lease_expiry*, the run task staying active;
        ``here``, or why not (nothing written for it), one answer per attempt."""
        ...

    async def take_type_tokens(
        self, task_type: str, count: int, *, interval_us: int, burst: int, max_wait_us: int
    ) -> tuple[list[int], int]:
        """Up to *count* tokens of the type's bucket: waits of those taken, wait for the next."""
        ...

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int: ...

    # -- forwarder, recoverer, janitor ------------------------------------------------------

    async def forward_queues(self, qnames: Sequence[str]) -> int:
        """Move due scheduled and retry tasks to pending (or their group); how many."""
        ...

    async def forward_due(self, qnames: Sequence[str]) -> tuple[int, float | None]:
        """:meth:`forward_queues`, and the earliest score (unix s) left in the queues'
        scheduled and retry sets, None when they are empty."""
        ...

    async def scan_leases(
        self, cutoff: datetime, qnames: Sequence[str]
    ) -> tuple[list[tuple[str, TaskMessage]], float | None]:
        """Tasks whose lease expired by *cutoff* (with the queue storing them), and the
        earliest lease expiry after it."""
        ...

    async def reclaim_stale_aggregation_sets_queues(self, qnames: Sequence[str]) -> None: ...

    async def delete_expired_completed_queues(
        self, qnames: Sequence[str], batch_size: int = 100
    ) -> int: ...

    # -- heartbeater ------------------------------------------------------------------------

    async def extend_lease(self, qname: str, task_ids: Sequence[str]) -> float:
        """Extend the leases of *task_ids*; the new expiry (unix s)."""
        ...

    async def write_server_state(
        self,
        info: ServerInfoProto,
        workers: Sequence[WorkerInfoProto],
        ttl: float,
        *,
        type_rates: Mapping[str, str] | None = None,
        queue_flow: Mapping[str, str] | None = None,
    ) -> None: ...

    async def clear_server_state(self, host: str, pid: int, server_id: str) -> None: ...

    # -- aggregator -------------------------------------------------------------------------

    async def list_groups(self, qname: str) -> list[str]: ...

    async def aggregation_check(  # noqa: PLR0917 - asynq's AggregationCheck signature
        self,
        qname: str,
        group: str,
        t: datetime,
        grace_period: float,
        max_delay: float,
        max_size: int,
    ) -> str | None: ...

    async def read_aggregation_set(
        self, qname: str, group: str, set_id: str
    ) -> tuple[list[TaskMessage], datetime]: ...

    async def delete_aggregation_set(self, qname: str, group: str, set_id: str) -> None: ...

    # -- queue watcher ----------------------------------------------------------------------

    async def all_queues(self) -> set[str]:
        """The queue names in ``asynq:queues``."""
        ...

    async def mark_ordered(self, qname: str) -> None: ...

    # -- observers: completion notices, events, progress, metrics history ---------------------

    async def publish_completions(self, notices: Sequence[tuple[str, str]]) -> None: ...

    async def append_events(self, events: Sequence[Mapping[str, str]], max_events: int) -> None: ...

    async def write_progress(
        self, queue: str, task_id: str, fields: Mapping[str, str], ttl_ms: int, update: str
    ) -> None: ...

    async def expire_progress(self, queue: str, task_id: str, ttl_ms: int) -> None: ...

    async def write_history(
        self, queue: str, minute: int, expire_at: int, counts: Sequence[str | int]
    ) -> None: ...
