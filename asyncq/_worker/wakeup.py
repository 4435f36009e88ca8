"""The processor's wake-up event, and the Redis key tracking that lets it sleep.

An asyncq enqueue publishes a wake-up message when a pending list goes from
empty to non-empty, but Go asynq's enqueue (and redis-cli, or any other
producer) writes the pending list and publishes nothing. Without help the
processor finds those tasks only by polling every ``task_check_interval``
(80 ms), which over a thousand queues is most of an idle worker's Redis
commands.

So the subscriber's connection also turns on Redis key tracking (Redis >= 6)
in broadcast mode for the pending list and the paused flag of every served
queue (``CLIENT TRACKING ON BCAST REDIRECT <own id> PREFIX asynq:{q}:pending
PREFIX asynq:{q}:paused ...``) and subscribes ``__redis__:invalidate``: Redis
then sends the key's name whenever any client, Go included, writes it, at no
command cost. Each such message sets the wake-up event. While the
invalidations are live (:attr:`QueueWakeup.tracking`), the processor's idle
wait after an empty fetch is :data:`TRACKED_POLL` instead of
``task_check_interval``; a fetch that found a queue held by a concurrency or
rate limit keeps the short wait, since those free up without any pending write.

When tracking is lost (the connection drops, or is killed) the flag goes off
and the event is set at once, so the processor polls as before until the
subscriber has reconnected, turned tracking on again and woken it once more
(which fetches whatever was written meanwhile). Where tracking is refused (a
server before 6.0, a proxy or an ACL denying ``CLIENT``) or not used (Redis
Cluster, where it would be per node, and Sentinel: both use redis-py's
Pub/Sub) one line is logged and the processor polls as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from asyncq import _keys as keys

__all__ = ["INVALIDATE_CHANNEL", "TRACKED_POLL", "QueueWakeup", "tracked_prefixes"]

INVALIDATE_CHANNEL = b"__redis__:invalidate"
"""Where Redis sends tracking invalidations to a RESP2 connection."""

TRACKED_POLL = 5.0
"""Seconds between safety fetches of an idle processor while invalidations are live."""


def tracked_prefixes(queues: Iterable[str]) -> list[str]:
    """The key prefixes whose writes wake the processor: each queue's pending list and
    paused flag (un-pausing a queue with pending tasks writes only the flag)."""
    out: list[str] = []
    for q in queues:
        out += (keys.pending_key(q), keys.paused_key(q))
    return out


class QueueWakeup(asyncio.Event):
    """The event that ends the processor's idle wait, and whether key tracking drives it."""

    def __init__(self) -> None:
        super().__init__()
        self.tracking = False
        """True while Redis invalidations for every served queue's pending list arrive."""
        self.delivery = False
        """True while the server's delivery channel is subscribed: the processor may ask
        to be delivered tasks (see :mod:`asyncq._broker.delivery`)."""

    def idle_delay(self, poll: float, *, held: bool) -> float:
        """How long an idle processor waits after an empty fetch.

        *poll* is its polling delay; *held* tells that the fetch left a queue
        with work because of a limit, which no invalidation announces.
        """
        if held or not self.tracking:
            return poll
        return max(poll, TRACKED_POLL)

    def tracking_lost(self) -> None:
        """Invalidations stopped: wake the processor so that it polls again."""
        self.delivery = False
        if self.tracking:
            self.tracking = False
            self.set()
