"""The heartbeater role (asynq's heartbeater).

Every ``heartbeat_interval`` (5 s), starting at once, it writes the server's
ServerInfo and one WorkerInfo protobuf per running task with a TTL of twice the
interval, so ``asynq server ls``, asynqmon and asyncq's inspector see the
server and its active workers. In the same beat it extends the Redis lease of
every running task whose local lease is still valid; a running task whose
local lease has already run out is declared expired, which cancels its handler
(a failure with LeaseExpiredError, and nothing written: the recoverer takes
the task over). On stop the server's records are removed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from asyncq._logging import error_text
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._time import utc_from_timestamp
from asyncq._worker.active import ActiveTasks
from asyncq._worker.lease import Lease, extend_leases
from asyncq._worker.limits import flow_record
from asyncq._worker.roles import PeriodicRole, RoleDeps
from asyncq.proto.asynq import ServerInfo as ServerInfoProto
from asyncq.proto.asynq import WorkerInfo as WorkerInfoProto

__all__ = ["Heartbeater", "ServerIdentity"]


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """Who a server is in its heartbeat records."""

    host: str
    pid: int
    server_id: str


class Heartbeater(PeriodicRole):
    """Writes server/worker state and extends leases every heartbeat interval."""

    name: ClassVar[str] = "heartbeater"

    def __init__(
        self,
        deps: RoleDeps,
        interval: float,
        *,
        active: ActiveTasks,
        identity: ServerIdentity,
        status: Callable[[], str],
        started_at: Callable[[], datetime | None],
    ) -> None:
        super().__init__(deps, interval)
        self.active = active
        self.identity = identity
        self._status = status
        self._started_at = started_at

    async def tick(self) -> None:
        cfg = self.config
        server = self.identity
        active = list(self.active.values())
        # Leases first: they decide whether tasks keep running.
        by_queue: dict[str, list[tuple[str, Lease]]] = defaultdict(list)
        for act in active:
            if act.abandoned:
                continue
            if act.lease.valid():
                by_queue[act.msg.queue].append((act.msg.id, act.lease))
            else:
                act.lease.expire()  # cancels the task's handler
        for qname, ids, exc in await extend_leases(self.broker, by_queue):
            if isinstance(exc, ValueError):
                # A malformed message (blank queue field): its lease cannot be extended
                # and expires, but the other queues' leases must be.
                self.log.error(
                    "could not extend task leases", queue=qname, task_ids=ids,
                    error=error_text(exc),
                )  # fmt: skip
            else:
                self.redis_error("could not extend task leases", exc, queue=qname)

        info = ServerInfoProto(
            host=server.host,
            pid=server.pid,
            server_id=server.server_id,
            concurrency=cfg.concurrency,
            queues=dict(self.queues.priorities),  # concrete names, never patterns
            strict_priority=cfg.strict_priority,
            status=self._status(),
            start_time=self._started_at(),
            active_worker_count=len(active),
        )
        workers = [
            WorkerInfoProto(
                host=server.host,
                pid=server.pid,
                server_id=server.server_id,
                task_id=act.msg.id,
                task_type=act.msg.type,
                task_payload=act.msg.payload,
                queue=act.msg.queue,
                start_time=datetime.fromtimestamp(act.started, UTC),
                deadline=utc_from_timestamp(act.deadline),
            )
            for act in active
        ]
        # asynq's TTL is twice the interval; at least 2 s so sub-second test
        # intervals still give Redis a whole-second expiry.
        await self.broker.write_server_state(
            info,
            workers,
            ttl=max(2 * self.interval, 2.0),
            type_rates={t: str(rate) for t, rate in cfg.type_rate_limits.items()},
            queue_flow=flow_record(
                cfg.queue_concurrency,
                cfg.local_queue_concurrency,
                cfg.rate_limits,
                cfg.ordered_queues,
            ),
        )

    async def cleanup(self) -> None:
        server = self.identity
        try:
            await self.broker.clear_server_state(server.host, server.pid, server.server_id)
        except REDIS_ERRORS as exc:
            self.log.warning(
                "could not clear the server's state; it expires on its own",
                error=error_text(exc),
            )
