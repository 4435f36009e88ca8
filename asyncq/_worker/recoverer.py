"""The recoverer role (asynq's recoverer).

It finds the active tasks whose lease expired at least ``recoverer_cutoff``
(2 s) ago, in any of this server's queues and whoever ran them (a crashed
worker, a lost network): each is archived when its retries are used up, else
retried after ``retry_delay`` with a LeaseExpiredError (``is_failure``
applies; the default delay for an expired lease is none). Tasks retried for
now are forwarded to pending at once and this server's processor is woken,
so a killed worker's tasks run again about ``recoverer_cutoff`` after their
lease ran out. It also moves the tasks of aggregation sets whose deadline
passed back into their group, so an aggregation interrupted by a crash or a
failing aggregator loses no task.

When it checks: at start, then at the earliest lease expiry it saw (plus the
cutoff), and at least every ``min(recoverer_interval, lease_duration)``. A
lease created after a check expires at least ``lease_duration`` later, so no
lease waits longer than its expiry plus the cutoff (asynq checks every minute
with a 30 s cutoff, so its tasks wait 60-90 s more). Each check is one script
call per Redis node, however many queues.

Two servers may race for the same task; the loser's script answers "not
found", which is logged at debug level and skipped. A message naming another
queue than the one it is stored in (or none) is archived where it is, with
the reason: writes keyed by its queue field would never find it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from asyncq._codec import decode_task_message, encode_task_message
from asyncq._logging import error_text, is_debug_enabled, task_fields
from asyncq._redis.errors import REDIS_ERRORS, is_transient
from asyncq._worker.active import ActiveTasks
from asyncq._worker.outcome import Outcome, decide
from asyncq._worker.roles import PeriodicRole, RoleDeps
from asyncq.errors import LeaseExpiredError, TaskNotFoundError
from asyncq.history import HistoryRecorder
from asyncq.hooks import NO_HOOKS, WorkerHooks
from asyncq.proto.asynq import TaskMessage

__all__ = ["Recoverer"]


class Recoverer(PeriodicRole):
    """Retries or archives tasks whose lease expired; reclaims stale aggregation sets."""

    name: ClassVar[str] = "recoverer"

    _MIN_WAIT = 0.05
    """Seconds between two checks at least (leases are whole seconds in Redis)."""
    _RECHECK = 1.0
    """Seconds until the next check when an expired lease was left because its task runs
    here (its extension has not landed yet)."""

    def __init__(
        self,
        deps: RoleDeps,
        interval: float,
        *,
        active: ActiveTasks,
        wakeup: asyncio.Event | None = None,
        hooks: WorkerHooks = NO_HOOKS,
        history: HistoryRecorder | None = None,
    ) -> None:
        super().__init__(deps, interval)
        self.active = active
        self._wakeup = wakeup
        # Told of each task it retries or archives, as the processor's hooks are of the
        # tasks it finishes: the event stream and the metrics see a dead worker's tasks too.
        self._hooks = hooks
        # The metrics history counts the recovery where it is decided, here (asynq's stats
        # count it as a failure in the same script).
        self._history = history
        self.next_wait = min(interval, deps.config.lease_duration)
        """Seconds from the last check to the next one (see the module docstring)."""

    async def run(self) -> None:
        longest = min(self.interval, self.config.lease_duration)
        while not self.stopping:
            try:
                await self.tick()
            except REDIS_ERRORS as exc:
                self.redis_error(f"{self.name} failed", exc)
                self.next_wait = longest
            await self.sleep(self.next_wait)

    async def tick(self) -> None:
        cfg = self.config
        broker = self.broker
        queues = self.queues.names()
        clock = broker.clock()
        now = datetime.fromtimestamp(clock, UTC)
        cutoff_s = cfg.recoverer_cutoff
        cutoff = now - timedelta(seconds=cutoff_s)
        try:
            await broker.reclaim_stale_aggregation_sets_queues(queues)
        except REDIS_ERRORS as exc:
            if is_transient(exc):
                raise
            self.log.error("could not reclaim stale aggregation sets", error=error_text(exc))
        # Each message comes with the queue it is stored in (its own queue field may differ).
        expired, earliest = await broker.scan_leases(cutoff, queues)
        wait = min(self.interval, cfg.lease_duration)
        if earliest is not None:
            wait = min(wait, earliest + cutoff_s - clock)
        recovered = left = 0
        for qname, msg in expired:
            if self.stopping:
                return
            if await self._recover(qname, msg, now, cutoff.timestamp()):
                recovered += 1
            else:
                left += 1
        if left:
            wait = min(wait, self._RECHECK)
        self.next_wait = max(self._MIN_WAIT, wait)
        if recovered:
            # Retried for now (an expired lease's default delay is none): to pending
            # at once rather than at the forwarder's next pass.
            moved = await broker.forward_queues(queues)
            if moved:
                self.stats.forwarded += moved
                if self._wakeup is not None:
                    self._wakeup.set()

    async def _recover(self, qname: str, msg: TaskMessage, now: datetime, cutoff: float) -> bool:
        """Retry or archive one task; False when it was left because it runs here.

        Every write is conditional on the lease still ending by *cutoff*: recoverers
        of several workers wake at the same expiry, and the first one's retry can be
        leased again by a worker before another's write lands.
        """
        broker = self.broker
        fields = task_fields(msg)
        local = self.active.get(msg.id)
        if local is not None and not local.abandoned and local.lease.valid():
            return False  # running here, its lease extension just has not landed yet
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
                fixed = decode_task_message(encode_task_message(msg))
                fixed.queue = qname
                await broker.archive(fixed, err_msg, lease_expired_by=cutoff)
            else:
                # The same decision as the processor's for a lease that ran out there.
                exc = LeaseExpiredError()
                outcome = decide(
                    msg, exc, lease="recovering", config=self.config,
                    now=now.timestamp(), log=self.log,
                )  # fmt: skip
                await self._write(msg, outcome, now, cutoff, fields)
                self._hooks.task_finished(
                    msg.queue, msg.type, msg.id, outcome.kind, error=outcome.err_msg, exc=exc
                )
                if self._history is not None:
                    self._history.record_recovered(
                        msg.queue,
                        msg.type,
                        now.timestamp(),
                        ran_here=local is not None,
                        retried=outcome.kind == "retry",
                        archived=outcome.kind == "archive",
                    )
            self.stats.recovered += 1
            return True
        except TaskNotFoundError:
            # Another recoverer got there first (asynq #717), and maybe a worker holds
            # it again under a fresh lease: either way it is not ours to move.
            if is_debug_enabled(self.log):
                self.log.debug("task already recovered elsewhere", **fields)
            return True
        except REDIS_ERRORS as err:
            if is_transient(err):
                raise
            # Another recoverer got there first (asynq #717).
            if is_debug_enabled(self.log):
                self.log.debug("task already recovered elsewhere", error=error_text(err), **fields)
            return True
        except Exception as err:
            # Whatever the broker refuses must not stop the recovery of the tasks
            # listed after it, tick after tick.
            self.log.error(
                "could not recover task; it stays active", error=error_text(err), **fields
            )
            return True  # tried again at the next regular check, not every second

    async def _write(
        self,
        msg: TaskMessage,
        outcome: Outcome,
        now: datetime,
        cutoff: float,
        fields: dict[str, Any],
    ) -> None:
        broker = self.broker
        if outcome.kind == "archive":
            self.log.warning("archiving task whose lease expired", **fields)
            if outcome.workflow:  # the workflow learns of it in the same script call
                await broker.ack_workflow_step(msg, "archive", outcome.err_msg)
            elif outcome.durable:  # so does a durable run of its step's failure
                await broker.ack_durable_step(msg, "archive", outcome.err_msg)
            else:
                await broker.archive(msg, outcome.err_msg, lease_expired_by=cutoff)
        elif outcome.kind == "retry" and outcome.retry_at is not None:
            retry_in = (outcome.retry_at - now).total_seconds()
            self.log.warning("retrying task whose lease expired", retry_in=retry_in, **fields)
            await broker.retry(
                msg,
                outcome.retry_at,
                outcome.err_msg,
                is_failure=outcome.is_failure,
                lease_expired_by=cutoff,
            )
        else:  # an expired lease is only ever retried or archived
            raise AssertionError(f"unexpected outcome for an expired lease: {outcome}")
