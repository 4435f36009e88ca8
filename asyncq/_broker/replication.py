"""Opt-in synchronous replication for the Broker's durable writes (``min_replicas``).

Redis replicates asynchronously: a write the master acknowledged and then lost
in a crash before shipping it to a replica is gone after a failover. With
:class:`Replication`, each durable write (enqueue-like scripts, a finished
task's outcome) is sent in one pipeline together with ``WAIT <n> <ms>``, on
the same connection: WAIT counts the replicas that acknowledged everything
that connection wrote so far, so a reply of at least *n* proves that this
write is on *n* replicas. Fewer raises
:class:`~asyncq.errors.ReplicationTimeoutError` (the write was applied on the
master, only its replication is unconfirmed).

Sending both in one pipeline matters: a WAIT on another pooled connection, or
on a reconnected socket, would count replicas for *that* connection's writes
and could confirm nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from redis.exceptions import NoScriptError

from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import Script
from asyncq._redis.transport import FastConnection
from asyncq.errors import ReplicationTimeoutError

__all__ = ["Replication", "replica_wait_seconds"]

Pipeline = Callable[[Sequence[Sequence[Any]]], Awaitable[list[Any]]]


def replica_wait_seconds(min_replicas: object, replica_timeout: object) -> float:
    """Check the public ``min_replicas``/``replica_timeout`` options; the timeout in seconds."""
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
        raise TypeError(f"min_replicas must be an int, got {min_replicas!r}")
    if min_replicas < 0:
        raise ValueError(f"min_replicas cannot be negative, got {min_replicas}")
    if not isinstance(replica_timeout, timedelta):
        raise TypeError(
            "replica_timeout must be a datetime.timedelta, got "
            f"{replica_timeout.__class__.__name__}"
        )
    if replica_timeout < timedelta(milliseconds=1):
        raise ValueError(f"replica_timeout must be at least 1 ms, got {replica_timeout}")
    return replica_timeout.total_seconds()


class Replication:
    """Wait for *min_replicas* replica acknowledgements, at most *timeout* seconds."""

    __slots__ = ("min_replicas", "timeout", "wait")

    def __init__(self, min_replicas: int, timeout: float) -> None:
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
            raise TypeError(f"min_replicas must be an int, got {min_replicas!r}")
        if min_replicas < 1:
            raise ValueError(
                f"min_replicas must be at least 1 to wait for replicas, got {min_replicas}"
            )
        if not timeout > 0:
            # WAIT n 0 would block forever.
            raise ValueError(f"replica_timeout must be positive, got {timeout}s")
        self.min_replicas = min_replicas
        self.timeout = timeout
        self.wait: tuple[str, int, int] = ("WAIT", min_replicas, max(1, round(timeout * 1000)))

    def check(self, reply: Any, *, queue: str = "", task_id: str = "") -> None:
        """Raise the error for a WAIT *reply* (an int, or the error Redis sent)."""
        if isinstance(reply, Exception):
            raise reply
        if int(reply) < self.min_replicas:
            raise ReplicationTimeoutError(
                acknowledged=int(reply),
                required=self.min_replicas,
                timeout=self.timeout,
                queue=queue,
                task_id=task_id,
            )

    async def script(
        self,
        pipeline: Pipeline,
        cmd: RedisClient | FastConnection,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        queue: str = "",
        task_id: str = "",
    ) -> Any:
        """Run *script* and WAIT in one pipeline; the script's reply, or its error raised."""
        call = ("EVALSHA", script.sha, len(keys), *keys, *args)
        replies = await pipeline([call, self.wait])
        if isinstance(replies[0], NoScriptError):
            # Not loaded (restart, failover, SCRIPT FLUSH): nothing ran; load and go again.
            await script.load(cmd)
            replies = await pipeline([call, self.wait])
        reply, waited = replies
        if isinstance(reply, Exception):
            raise reply  # refused by Redis: not written, whatever WAIT said
        self.check(waited, queue=queue, task_id=task_id)
        return reply

    async def confirm_existing(
        self, pipeline: Pipeline, channel: str, *, queue: str, task_id: str
    ) -> None:
        """Prove that what refused a write (the task ID or unique lock existing) is on
        *min_replicas* replicas, or raise ReplicationTimeoutError.

        The refusing script wrote nothing, so a WAIT after it would count replicas for
        this connection's earlier writes and prove nothing: an earlier attempt's write,
        applied on a master and not replicated, would be reported as existing and then
        lost by a failover. A PUBLISH is a write the master replicates (to *channel*,
        the queue's wakeup channel: waking idle workers is harmless); a WAIT after it
        counts the replicas that hold this master's whole dataset up to now, the
        existing task included. When the ACL refuses the PUBLISH, nothing can be proven
        and nothing is raised: the refusal is reported as it is without min_replicas.
        """
        published, waited = await pipeline([("PUBLISH", channel, queue), self.wait])
        if isinstance(published, Exception):
            return
        self.check(waited, queue=queue, task_id=task_id)

    def __repr__(self) -> str:
        return f"<Replication min_replicas={self.min_replicas} timeout={self.timeout:g}s>"
