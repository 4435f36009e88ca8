"""The aggregator role: group aggregation (asynq's aggregator, spec 5.10).

Only started when ``Server(aggregation=Aggregation(aggregator=...))`` is given. Every
``group_check_interval`` (asynq: min(7 s, ``group_grace_period``)) it runs
asynq's aggregation check on every group of every configured queue, with at
most three checks in flight (an overdue tick is skipped with a warning, as in
asynq). A group is ready when it reached ``group_max_size`` tasks, when its
oldest task waited ``group_max_delay``, or when no task joined it for
``group_grace_period``. The ready tasks are staged in an aggregation set, the
aggregator function (sync functions run in a worker thread) turns them into
one task, which is enqueued into the group's queue (``queue=`` always wins
over the task's own option); only then is the set deleted.

If the aggregator raises, returns something that is not a Task, or the
enqueue fails, the error is logged and the set stays staged; after its
deadline (2 min) the recoverer puts its tasks back into the group, so no task
is ever lost, and they are aggregated again at a later check.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import anyio.to_thread

from asyncq._redis.errors import REDIS_ERRORS
from asyncq._worker.config import GroupAggregator
from asyncq._worker.roles import PeriodicRole, RoleDeps
from asyncq.mux import is_async_callable
from asyncq.task import Task, TaskInfo

__all__ = ["GroupAggregatorRole"]

_MAX_CONCURRENT_CHECKS = 3


class GroupAggregatorRole(PeriodicRole):
    """Stages ready groups and enqueues their aggregated task."""

    name: ClassVar[str] = "aggregator"

    def __init__(
        self,
        deps: RoleDeps,
        interval: float,
        *,
        enqueue: Callable[[Task, str], Awaitable[TaskInfo]],
    ) -> None:
        super().__init__(deps, interval)
        self._checks: set[asyncio.Task[None]] = set()
        self._group: asyncio.TaskGroup | None = None
        self._enqueue = enqueue

    async def run(self) -> None:
        # The checks run beside the ticks, as members of this role's own group: leaving
        # the loop waits for the checks in flight (each stops at its next group once the
        # role is stopping), and the server's cancel of a role that takes too long
        # reaches them too.
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await super().run()
            finally:
                self._group = None

    async def tick(self) -> None:
        if len(self._checks) >= _MAX_CONCURRENT_CHECKS:
            self.log.warning(
                "skipping an aggregation check: the previous ones are still running",
                running=len(self._checks),
            )
            return
        assert self._group is not None  # ticks only run inside run()
        t = datetime.fromtimestamp(self.broker.clock(), UTC)
        check = self._group.create_task(self._check(t))
        self._checks.add(check)
        check.add_done_callback(self._checks.discard)

    async def _check(self, t: datetime) -> None:
        cfg = self.config
        broker = self.broker
        try:
            for qname in self.queues.names():
                for group in await broker.list_groups(qname):
                    if self.stopping:
                        return
                    set_id = await broker.aggregation_check(
                        qname,
                        group,
                        t,
                        cfg.group_grace_period,
                        cfg.group_max_delay,
                        cfg.group_max_size,
                    )
                    if set_id is not None:
                        await self._aggregate(qname, group, set_id)
        except REDIS_ERRORS as exc:
            self.redis_error("aggregation check failed", exc)
        except Exception as exc:
            self.log.error("aggregation check crashed", exc_info=exc)

    async def _aggregate(self, qname: str, group: str, set_id: str) -> None:
        broker = self.broker
        fields = {"queue": qname, "group": group, "set_id": set_id}
        msgs, deadline = await broker.read_aggregation_set(qname, group, set_id)
        if not msgs:
            await broker.delete_aggregation_set(qname, group, set_id)
            return
        tasks = [Task._from_message(m) for m in msgs]
        remaining = deadline.timestamp() - broker.clock()
        fn = self.config.group_aggregator
        assert fn is not None
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                aggregated = await _call_aggregator(fn, group, tasks)
                if not isinstance(aggregated, Task):
                    raise TypeError(
                        f"group_aggregator must return an asyncq Task, "
                        f"got {aggregated.__class__.__name__}"
                    )
                info = await self._enqueue(aggregated, qname)
        except Exception as exc:
            self.stats.aggregation_errors += 1
            self.log.error(
                "aggregation failed; its tasks go back to the group after the set's deadline",
                tasks=len(tasks), deadline=deadline.isoformat(), exc_info=exc, **fields,
            )  # fmt: skip
            return
        await broker.delete_aggregation_set(qname, group, set_id)
        self.stats.aggregated += 1
        self.log.info(
            "aggregated tasks", tasks=len(tasks), task_id=info.id, task_type=info.type, **fields
        )


async def _call_aggregator(fn: GroupAggregator, group: str, tasks: list[Task]) -> Any:
    if is_async_callable(fn):
        return await fn(group, tasks)  # type: ignore[misc]
    result = await anyio.to_thread.run_sync(fn, group, tasks, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        return await result
    return result
