"""An in-memory :class:`~asyncq._worker.broker.WorkerBroker` with failure injection.

asyncq's reading of asynq's ``internal/testbroker``: the same task life (pending
-> active with a lease -> done / completed / retry / archived / pending again)
kept in dicts, a clock the test moves, and three ways to make it fail:

* :meth:`FakeBroker.fail` makes the next *times* calls of one method raise (a
  Redis connection error by default, or any exception given);
* :meth:`FakeBroker.down` / :meth:`FakeBroker.up` make every call raise a
  connection error until it is up again (asynq's testbroker "sleep");
* :meth:`FakeBroker.hold` makes calls of one method wait until released, so a
  test can act while a write is in flight.

Every call is recorded in :attr:`FakeBroker.calls` as ``(method, detail)``.
It is a model for testing the roles alone, not a second broker: the Redis tests
check the real scripts.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq._broker import DequeuedTask
from asyncq._broker.delivery import DeliveryNote
from asyncq._broker.durable import FAR_FUTURE, Recorded, SuspendPlan, is_durable_step
from asyncq._broker.multiqueue import FetchResult
from asyncq._broker.workflow import AckMode, is_workflow_step
from asyncq.errors import TaskNotFoundError
from asyncq.proto.asynq import ServerInfo, TaskMessage, WorkerInfo

__all__ = ["FakeBroker", "StoredTask"]


@dataclass
class StoredTask:
    """A task as the fake stores it: its message, state and the score of its set."""

    msg: TaskMessage
    state: str
    score: float = 0.0
    result: bytes | None = None
    error: str = ""


@dataclass
class _Hold:
    release: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class FakeBroker:
    """The worker's broker in memory; see the module docstring."""

    def __init__(self, *, now: float = 1_700_000_000.0, lease_duration: float = 30.0) -> None:
        self.now = now
        self.lease_duration = lease_duration
        self.tasks: dict[str, StoredTask] = {}
        self.pending: dict[str, list[str]] = defaultdict(list)  # index 0 is dequeued first
        self.leases: dict[str, float] = {}
        self.tokens: dict[str, int] = defaultdict(lambda: 1_000_000)
        self.processed = 0
        self.failed = 0
        self.servers: dict[str, tuple[ServerInfo, list[WorkerInfo]]] = {}
        self.groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.sets: dict[tuple[str, str, str], list[str]] = {}
        self.queues: set[str] = set()
        self.ordered: set[str] = set()
        self.calls: list[tuple[str, Any]] = []
        self.fetches: list[dict[str, Any]] = []
        """Each fetch's queues and options, in order."""
        self.held: set[str] = set()
        """Queues every fetch reports held by a limit (the script's ``held`` list)."""
        self.credits: dict[str, int] = {}
        """Direct-delivery credit by server id (expiry is not modelled; disarming deletes it)."""
        self.waiters: dict[str, list[str]] = defaultdict(list)
        """Server ids registered for direct delivery, by queue."""
        self.workflow_steps: list[tuple[str, AckMode]] = []
        """Workflow steps acknowledged with their hand-off, by either method, in order."""
        self.durable_steps: list[tuple[str, AckMode]] = []
        """Durable runs' steps acknowledged with their record, in order."""
        self.suspensions: list[tuple[str, SuspendPlan]] = []
        self.inline_steps: list[tuple[str, str]] = []  # (run id, step id) leased inline
        """Durable runs suspended (run id, plan), in order."""
        self.wakes: dict[str, str] = {}
        """Step id -> the id of the parked run (a stored task) its success wakes: to pending,
        or active and leased to the caller when ``ack_many``'s *runs_here* takes its queue."""
        self.completions: list[tuple[str, str]] = []
        """(channel, task id) of the completion notices published, in order."""
        self.events: list[dict[str, str]] = []
        self.progress: dict[tuple[str, str], dict[str, str]] = {}
        """Stored progress by (queue, task id); expiry is not modelled, deletion is."""
        self.history: dict[tuple[str, int], dict[str, int]] = {}
        """Metrics-history counts by (queue, unix minute), summed as the script sums them."""
        self._failures: dict[str, list[BaseException]] = defaultdict(list)
        self._down = False
        self._holds: dict[str, _Hold] = {}
        self._ids = itertools.count(1)

    # -- the test's controls -----------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def fail(self, method: str, exc: BaseException | None = None, *, times: int = 1) -> None:
        """The next *times* calls of *method* raise *exc* (a connection error by default)."""
        for _ in range(times):
            self._failures[method].append(exc or RedisConnectionError(f"fake {method} failed"))

    def down(self) -> None:
        """Every call raises a connection error until :meth:`up`."""
        self._down = True

    def up(self) -> None:
        self._down = False

    def hold(self, method: str) -> _Hold:
        """Calls of *method* wait until ``hold.release`` is set; ``hold.arrived`` once one waits."""
        hold = self._holds[method] = _Hold()
        return hold

    def called(self, method: str) -> list[Any]:
        return [detail for name, detail in self.calls if name == method]

    async def _enter(self, method: str, detail: Any = None) -> None:
        self.calls.append((method, detail))
        hold = self._holds.get(method)
        if hold is not None and not hold.release.is_set():
            hold.waiting += 1
            hold.arrived.set()
            await hold.release.wait()
        if self._down:
            raise RedisConnectionError("fake broker is down")
        failures = self._failures.get(method)
        if failures:
            raise failures.pop(0)

    # -- seeding and reading -------------------------------------------------------------------

    def enqueue(self, msg: TaskMessage) -> TaskMessage:
        if not msg.id:
            msg.id = f"t{next(self._ids)}"
        self.tasks[msg.id] = StoredTask(msg, "pending")
        self.pending[msg.queue].append(msg.id)
        self.queues.add(msg.queue)
        return msg

    def deliver(self, msg: TaskMessage, server_id: str) -> bytes | None:
        """Enqueue *msg* as enqueue.lua does for an armed server: active, leased to it, and
        the note it would publish; None (and pending) when the server has no credit. The
        lease runs from the enqueuer's clock (this broker's), in whole seconds, as
        enqueue.lua's does: its ARGV now plus the member's lease seconds."""
        if not msg.id:
            msg.id = f"t{next(self._ids)}"
        self.queues.add(msg.queue)
        if server_id not in self.waiters[msg.queue] or self.credits.get(server_id, 0) <= 0:
            self.enqueue(msg)
            return None
        self.credits[server_id] -= 1
        self.tasks[msg.id] = StoredTask(msg, "active")
        expiry = int(self.now) + int(self.lease_duration)
        self.leases[msg.id] = float(expiry)
        q, tid = msg.queue.encode(), msg.id.encode()
        return b"%d %d %d " % (expiry, len(q), len(tid)) + q + tid + bytes(msg)

    def state(self, task_id: str) -> str | None:
        stored = self.tasks.get(task_id)
        return None if stored is None else stored.state

    def _active(self, msg: TaskMessage, lease_expired_by: float | None = None) -> StoredTask:
        stored = self.tasks.get(msg.id)
        if stored is None or stored.state != "active" or msg.id not in self.leases:
            raise TaskNotFoundError(msg.queue, msg.id)
        if lease_expired_by is not None and self.leases[msg.id] > lease_expired_by:
            raise TaskNotFoundError(msg.queue, msg.id)  # leased again since the scan
        del self.leases[msg.id]
        return stored

    # -- processor -----------------------------------------------------------------------------

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
        await self._enter("fetch", count)
        self.fetches.append({
            "queues": list(qnames), "count": count, "strict": strict, "max_bytes": max_bytes,
            "first_free": first_free, "limits": limits,
        })  # fmt: skip
        got: list[DequeuedTask] = []
        empty: set[str] = set()
        expiry = self.now + self.lease_duration
        for q in qnames:
            ids = self.pending[q]
            while ids and len(got) < count:
                tid = ids.pop(0)
                stored = self.tasks[tid]
                stored.state = "active"
                self.leases[tid] = float(int(expiry))
                got.append(DequeuedTask(stored.msg, expiry))
            if not ids:
                empty.add(q)
        return FetchResult(got, empty, self.held & set(qnames))

    async def arm_delivery(self, server_id: str, ttl: float, qnames: Sequence[str] = ()) -> bool:
        await self._enter("arm_delivery", (server_id, list(qnames)))
        if server_id not in self.credits and not qnames:
            return False
        self.credits[server_id] = 1
        for q in qnames:
            if server_id not in self.waiters[q]:
                self.waiters[q].append(server_id)
        return True

    async def disarm_delivery(self, server_id: str, qnames: Sequence[str]) -> None:
        await self._enter("disarm_delivery", (server_id, list(qnames)))
        self.credits.pop(server_id, None)
        for q in qnames:
            if server_id in self.waiters[q]:
                self.waiters[q].remove(server_id)

    async def reject_delivered(self, note: DeliveryNote) -> None:
        await self._enter("reject_delivered", note.task_id)
        stored = self.tasks.get(note.task_id)
        if stored is not None:
            stored.state = "archived"
            self.leases.pop(note.task_id, None)

    async def ack_many(
        self,
        items: Sequence[tuple[TaskMessage, bool]],
        *,
        runs_here: Callable[[str], bool] | None = None,
        inline: Mapping[str, bytes | None] | None = None,
    ) -> Sequence[Exception | DequeuedTask | Recorded | None]:
        # asked as the batch is built, before the call: as Broker.ack_many does
        here = {
            m.id for m, _ in items
            if m.id in self.wakes and runs_here is not None
            and runs_here(self.tasks[self.wakes[m.id]].msg.queue)
        }  # fmt: skip
        await self._enter("ack_many", [(m.id, c) for m, c in items])
        out: list[Exception | DequeuedTask | Recorded | None] = []
        for msg, complete in items:
            try:
                self._finish(msg, complete)
            except TaskNotFoundError as exc:
                out.append(exc)
            else:
                out.append(None)
                if is_workflow_step(msg):  # with its hand-off, as Broker.ack_many
                    self.workflow_steps.append((msg.id, "complete" if complete else "done"))
                elif is_durable_step(msg):  # with its record in its run, as Broker.ack_many
                    self.durable_steps.append((msg.id, "complete" if complete else "done"))
                    if inline and msg.id in inline:  # recorded in its run, which goes on
                        held = inline[msg.id]
                        out[-1] = Recorded(held if held is not None else b"null")
                    else:
                        out[-1] = self._wake(msg.id, msg.id in here)
        return out

    def _wake(self, step_id: str, here: bool) -> DequeuedTask | None:
        run_id = self.wakes.pop(step_id, None)
        if run_id is None:
            return None
        run = self.tasks[run_id]
        if not here:
            run.state = "pending"
            self.pending[run.msg.queue].append(run_id)
            return None
        run.state = "active"
        expiry = self.now + self.lease_duration
        self.leases[run_id] = float(int(expiry))
        return DequeuedTask(run.msg, expiry)

    def _finish(self, msg: TaskMessage, complete: bool) -> None:
        stored = self._active(msg)
        self.processed += 1
        if complete:
            stored.state, stored.score = "completed", self.now + msg.retention
        else:
            del self.tasks[msg.id]

    async def done(self, msg: TaskMessage) -> None:
        await self._enter("done", msg.id)
        self._finish(msg, False)

    async def mark_as_complete(self, msg: TaskMessage) -> None:
        await self._enter("mark_as_complete", msg.id)
        self._finish(msg, True)

    async def requeue(self, msg: TaskMessage) -> None:
        await self._enter("requeue", msg.id)
        stored = self._active(msg)
        stored.state = "pending"
        self.pending[msg.queue].insert(0, msg.id)

    async def retry(
        self,
        msg: TaskMessage,
        process_at: datetime,
        err_msg: str,
        *,
        is_failure: bool,
        lease_expired_by: float | None = None,
    ) -> None:
        await self._enter("retry", (msg.id, process_at.timestamp(), err_msg, is_failure))
        stored = self._active(msg, lease_expired_by)
        if is_failure:
            stored.msg.retried += 1
            self.processed += 1
            self.failed += 1
        stored.state, stored.score, stored.error = "retry", process_at.timestamp(), err_msg

    async def archive(
        self, msg: TaskMessage, err_msg: str, *, lease_expired_by: float | None = None
    ) -> None:
        await self._enter("archive", (msg.id, err_msg))
        stored = self._active(msg, lease_expired_by)
        self.processed += 1
        self.failed += 1
        stored.state, stored.score, stored.error = "archived", self.now, err_msg

    async def ack_workflow_step(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
        await self._enter("ack_workflow_step", (msg.id, mode))
        if mode == "archive":
            stored = self._active(msg)
            stored.state, stored.error = "archived", err_msg
        else:
            self._finish(msg, mode == "complete")
        self.workflow_steps.append((msg.id, mode))
        return "running"

    async def ack_durable_step(self, msg: TaskMessage, mode: AckMode, err_msg: str = "") -> str:
        await self._enter("ack_durable_step", (msg.id, mode))
        if mode == "archive":
            stored = self._active(msg)
            stored.state, stored.error = "archived", err_msg
        else:
            self._finish(msg, mode == "complete")
        self.durable_steps.append((msg.id, mode))
        return "recorded"

    async def suspend_run(
        self, msg: TaskMessage, plan: SuspendPlan, *, step_here: float | None = None
    ) -> str:
        """Parks the run as scheduled (records are not modelled) and enqueues its steps;
        with *step_here*, the first one active and leased to the caller instead."""
        await self._enter("suspend_run", (msg.id, plan.mode, step_here is not None))
        stored = self._active(msg)
        stored.state = "scheduled"
        stored.score = FAR_FUTURE if plan.until is None else plan.until
        leased = False
        for n, (_, step) in enumerate(plan.steps):
            if step.id not in self.tasks:
                if n == 0 and step_here is not None:
                    self.tasks[step.id] = StoredTask(step, "active")
                    self.leases[step.id] = float(int(step_here))
                    leased = True
                    continue
                self.tasks[step.id] = StoredTask(step, "pending")
                self.pending[step.queue].append(step.id)
        self.suspensions.append((msg.id, plan))
        return "here" if leased else "parked"

    async def start_inline_steps(
        self, qname: str, attempts: Sequence[tuple[str, SuspendPlan]], lease_expiry: float
    ) -> list[str]:
        """Leases each plan's one step to the caller, the run staying active (records are
        not modelled); "there" when the step's task exists."""
        await self._enter("start_inline_steps", [(r, p.steps[0][1].id) for r, p in attempts])
        out = []
        for run_id, plan in attempts:
            step = plan.steps[0][1]
            if step.id in self.tasks:
                out.append("there")
                continue
            self.tasks[step.id] = StoredTask(step, "active")
            self.leases[step.id] = float(int(lease_expiry))
            self.inline_steps.append((run_id, step.id))
            out.append("here")
        return out

    async def take_type_tokens(
        self, task_type: str, count: int, *, interval_us: int, burst: int, max_wait_us: int
    ) -> tuple[list[int], int]:
        await self._enter("take_type_tokens", (task_type, count))
        n = min(count, self.tokens[task_type])
        self.tokens[task_type] -= n
        return [0] * n, (0 if n == count else interval_us)

    async def write_result(self, qname: str, task_id: str, data: bytes) -> int:
        await self._enter("write_result", task_id)
        self.tasks[task_id].result = data
        return len(data)

    # -- forwarder, recoverer, janitor -----------------------------------------------------------

    async def forward_queues(self, qnames: Sequence[str]) -> int:
        await self._enter("forward_queues", list(qnames))
        moved = 0
        for stored in self.tasks.values():
            msg = stored.msg
            due = stored.state in ("retry", "scheduled") and stored.score <= self.now
            if due and msg.queue in qnames:
                stored.state = "pending"
                self.pending[msg.queue].append(msg.id)
                moved += 1
        return moved

    async def forward_due(self, qnames: Sequence[str]) -> tuple[int, float | None]:
        moved = await self.forward_queues(qnames)
        left = [
            stored.score
            for stored in self.tasks.values()
            if stored.state in ("retry", "scheduled") and stored.msg.queue in qnames
        ]
        return moved, min(left, default=None)

    async def scan_leases(
        self, cutoff: datetime, qnames: Sequence[str]
    ) -> tuple[list[tuple[str, TaskMessage]], float | None]:
        await self._enter("scan_leases", cutoff.timestamp())
        cut = cutoff.timestamp()
        expired: list[tuple[str, TaskMessage]] = []
        later: list[float] = []
        for tid, expiry in self.leases.items():
            msg = self.tasks[tid].msg
            if msg.queue not in qnames:
                continue
            if expiry <= cut:
                expired.append((msg.queue, msg))
            else:
                later.append(expiry)
        return expired, min(later, default=None)

    async def reclaim_stale_aggregation_sets_queues(self, qnames: Sequence[str]) -> None:
        await self._enter("reclaim_stale_aggregation_sets_queues", list(qnames))

    async def delete_expired_completed_queues(
        self, qnames: Sequence[str], batch_size: int = 100
    ) -> int:
        await self._enter("delete_expired_completed_queues", (list(qnames), batch_size))
        gone = [
            tid
            for tid, s in self.tasks.items()
            if s.state == "completed" and s.score <= self.now and s.msg.queue in qnames
        ]
        for tid in gone:
            del self.tasks[tid]
        return len(gone)

    # -- heartbeater -------------------------------------------------------------------------------

    async def extend_lease(self, qname: str, task_ids: Sequence[str]) -> float:
        await self._enter("extend_lease", (qname, list(task_ids)))
        expiry = self.now + self.lease_duration
        for tid in task_ids:
            if tid in self.leases:
                self.leases[tid] = float(int(expiry))
        return expiry

    async def write_server_state(
        self,
        info: ServerInfo,
        workers: Sequence[WorkerInfo],
        ttl: float,
        *,
        type_rates: Mapping[str, str] | None = None,
        queue_flow: Mapping[str, str] | None = None,
    ) -> None:
        await self._enter("write_server_state", len(workers))
        self.servers[info.server_id] = (info, list(workers))

    async def clear_server_state(self, host: str, pid: int, server_id: str) -> None:
        await self._enter("clear_server_state", server_id)
        self.servers.pop(server_id, None)

    # -- aggregator --------------------------------------------------------------------------------

    def add_to_group(self, msg: TaskMessage, group: str) -> None:
        self.tasks[msg.id] = StoredTask(msg, "aggregating", self.now)
        self.groups[msg.queue, group].append(msg.id)

    async def list_groups(self, qname: str) -> list[str]:
        await self._enter("list_groups", qname)
        return sorted(g for (q, g), ids in self.groups.items() if q == qname and ids)

    async def aggregation_check(
        self,
        qname: str,
        group: str,
        t: datetime,
        grace_period: float,
        max_delay: float,
        max_size: int,
    ) -> str | None:
        await self._enter("aggregation_check", (qname, group))
        ids = self.groups[qname, group]
        newest = max((self.tasks[i].score for i in ids), default=None)
        ready = bool(ids) and (
            (max_size and len(ids) >= max_size)
            or (newest is not None and newest <= t.timestamp() - grace_period)
        )
        if not ready:
            return None
        set_id = f"set{next(self._ids)}"
        self.sets[qname, group, set_id] = list(ids)
        ids.clear()
        return set_id

    async def read_aggregation_set(
        self, qname: str, group: str, set_id: str
    ) -> tuple[list[TaskMessage], datetime]:
        await self._enter("read_aggregation_set", set_id)
        ids = self.sets[qname, group, set_id]
        deadline = datetime.fromtimestamp(self.now + 120, UTC)
        return [self.tasks[i].msg for i in ids], deadline

    async def delete_aggregation_set(self, qname: str, group: str, set_id: str) -> None:
        await self._enter("delete_aggregation_set", set_id)
        for tid in self.sets.pop((qname, group, set_id), []):
            self.tasks.pop(tid, None)

    # -- queue watcher ---------------------------------------------------------------------------

    async def all_queues(self) -> set[str]:
        await self._enter("all_queues")
        return set(self.queues)

    async def mark_ordered(self, qname: str) -> None:
        await self._enter("mark_ordered", qname)
        self.ordered.add(qname)

    # -- observers ---------------------------------------------------------------------------

    async def publish_completions(self, notices: Sequence[tuple[str, str]]) -> None:
        await self._enter("publish_completions", list(notices))
        self.completions += notices

    async def append_events(self, events: Sequence[Mapping[str, str]], max_events: int) -> None:
        await self._enter("append_events", len(events))
        self.events += (dict(e) for e in events)

    async def write_progress(
        self, queue: str, task_id: str, fields: Mapping[str, str], ttl_ms: int, update: str
    ) -> None:
        await self._enter("write_progress", task_id)
        if ttl_ms > 0:
            self.progress[queue, task_id] = dict(fields)
        else:
            self.progress.pop((queue, task_id), None)

    async def expire_progress(self, queue: str, task_id: str, ttl_ms: int) -> None:
        await self._enter("expire_progress", task_id)
        if ttl_ms <= 0:
            self.progress.pop((queue, task_id), None)

    async def write_history(
        self, queue: str, minute: int, expire_at: int, counts: Sequence[str | int]
    ) -> None:
        await self._enter("write_history", (queue, minute))
        cell = self.history.setdefault((queue, minute), {})
        for name, n in zip(counts[::2], counts[1::2], strict=True):
            cell[str(name)] = cell.get(str(name), 0) + int(n)
