"""The recoverer role (asynq's recoverer).

At start and every ``recoverer_interval`` (1 min) it finds the active tasks
whose lease expired at least ``recoverer_cutoff`` (30 s) ago, in any of this
server's queues and whoever ran them (a crashed worker, a lost network): each
is archived when its retries are used up, else retried after ``retry_delay``
with a LeaseExpiredError (``is_failure`` applies). It also moves the tasks of
aggregation sets whose deadline passed back into their group, so an
aggregation interrupted by a crash or a failing aggregator loses no task.

Two servers may race for the same task; the loser's script answers "not
found", which is logged at debug level and skipped. A message naming another
queue than the one it is stored in (or none) is archived where it is, with
the reason: writes keyed by its queue field would never find it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import ClassVar

from asyncq._broker.multiqueue import MultiQueue
from asyncq._broker.workflow import ack_step, is_workflow_step  # [workflow hook]
from asyncq._logging import error_text, is_debug_enabled, task_fields
from asyncq._redis.errors import REDIS_ERRORS, is_transient
from asyncq._worker.active import ActiveTasks
from asyncq._worker.policy import is_failure_for, retry_delay_for
from asyncq._worker.roles import PeriodicRole, RoleDeps
from asyncq.errors import LeaseExpiredError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task

__all__ = ["Recoverer"]


class Recoverer(PeriodicRole):
    """Retries or archives tasks whose lease expired; reclaims stale aggregation sets."""

    name: ClassVar[str] = "recoverer"

    def __init__(self, deps: RoleDeps, interval: float, *, active: ActiveTasks) -> None:
        super().__init__(deps, interval)
        self.active = active

    async def tick(self) -> None:
        cfg = self.config
        broker = self.broker
        queues = self.queues.names()
        now = datetime.fromtimestamp(broker.clock(), UTC)
        cutoff = now - timedelta(seconds=cfg.recoverer_cutoff)
        multi = MultiQueue(broker)  # all queues in one script call per Redis node
        try:
            await multi.reclaim_stale_aggregation_sets(queues)
        except REDIS_ERRORS as exc:
            if is_transient(exc):
                raise
            self.log.error("could not reclaim stale aggregation sets", error=error_text(exc))
        # Each message comes with the queue it is stored in (its own queue field may differ).
        for qname, msg in await multi.list_lease_expired(cutoff, queues):
            if self.stopping:
                return
            await self._recover(qname, msg, now)

    async def _recover(self, qname: str, msg: TaskMessage, now: datetime) -> None:
        cfg = self.config
        broker = self.broker
        fields = task_fields(msg)
        local = self.active.get(msg.id)
        if local is not None and not local.abandoned and local.lease.valid():
            return  # running here, its lease extension just has not landed yet
        lease_exc = LeaseExpiredError()
        err_msg = error_text(lease_exc)
        try:
            if msg.queue != qname:
                # A malformed message naming another queue (or none): every write keyed
                # by its queue field misses it, so it would stay active forever.
                # Archive it where it is, with the reason.
                fields["queue"] = qname
                err_msg = (
                    f"asyncq: task message names queue {msg.queue!r} but is stored in queue "
                    f"{qname!r}; archived by the recoverer"
                )
                self.log.error("archiving task whose message names another queue", **fields)
                fixed = TaskMessage.parse(bytes(msg))
                fixed.queue = qname
                await broker.archive(fixed, err_msg)
            elif msg.retried >= msg.retry:
                self.log.warning("archiving task whose lease expired", **fields)
                if is_workflow_step(msg):  # [workflow hook] the workflow learns of it
                    await ack_step(broker, msg, "archive", err_msg)
                else:
                    await broker.archive(msg, err_msg)
            else:
                task = Task._from_message(msg)
                delay = retry_delay_for(cfg, self.log, msg.retried, lease_exc, task, **fields)
                is_failure = is_failure_for(cfg, self.log, lease_exc, **fields)
                self.log.warning(
                    "retrying task whose lease expired", retry_in=delay.total_seconds(),
                    **fields,
                )  # fmt: skip
                await broker.retry(msg, now + delay, err_msg, is_failure=is_failure)
            self.stats.recovered += 1
        except REDIS_ERRORS as err:
            if is_transient(err):
                raise
            # Another recoverer got there first (asynq #717).
            if is_debug_enabled(self.log):
                self.log.debug("task already recovered elsewhere", error=error_text(err), **fields)
        except Exception as err:
            # Whatever the broker refuses must not stop the recovery of the tasks
            # listed after it, tick after tick.
            self.log.error(
                "could not recover task; it stays active", error=error_text(err), **fields
            )
