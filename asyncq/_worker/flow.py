"""Flow control on the worker side: per-queue concurrency limits.

The limits are enforced inside the dequeue script (``dequeue_queues.lua``):

* ``queue_concurrency`` (fleet-wide): at most N tasks of the queue hold a live
  lease at once, counted over every server in Redis (ZCOUNT of the queue's
  lease set with score >= now, so the expired leases of a dead worker hold
  nothing). A limit stored with ``Inspector.set_limit`` / ``asyncq queue
  limit`` overrides the configured one and is read on every fetch.
* ``local_queue_concurrency`` (this server only): this process runs at most N
  tasks of the queue; the processor passes the room left (N minus what it
  runs) with each fetch.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Mapping

from asyncq import _keys as keys

__all__ = ["QueueLimits", "validate_limits"]


def validate_limits(option: str, limits: Mapping[str, int] | None) -> Mapping[str, int]:
    """A read-only copy of ``{queue: limit}``; every bad entry raises naming the problem."""
    if limits is None:
        return types.MappingProxyType({})
    if not isinstance(limits, Mapping):
        raise TypeError(f"{option} must be a mapping of queue name to limit, got {limits!r}")
    out: dict[str, int] = {}
    for qname, limit in limits.items():
        if not isinstance(qname, str) or not qname.strip():
            raise ValueError(f"{option}: queue names must be non-blank strings, got {qname!r}")
        keys.refuse_braces("queue name", qname)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"{option}: queue {qname!r} needs an integer limit >= 0, got {limit!r}"
            )
        out[qname] = limit
    return types.MappingProxyType(out)


class QueueLimits:
    """The limits one fetch passes to the dequeue script, and the local running counts."""

    __slots__ = ("_fleet", "_local", "_running")

    def __init__(self, fleet: Mapping[str, int], local: Mapping[str, int]) -> None:
        self._fleet = dict(fleet)
        self._local = dict(local)
        self._running: Counter[str] = Counter()

    def started(self, qname: str) -> None:
        self._running[qname] += 1

    def finished(self, qname: str) -> None:
        self._running[qname] -= 1
        if self._running[qname] <= 0:
            del self._running[qname]

    def running(self, qname: str) -> int:
        """Tasks of *qname* this server runs now."""
        return self._running[qname]

    def is_local_limited(self, qname: str) -> bool:
        """Whether a finished task of *qname* frees room under a server-local limit."""
        return qname in self._local

    def for_fetch(self) -> dict[str, tuple[int, int]] | None:
        """``{queue: (fleet limit, local room)}`` (-1 = none), or None when nothing is limited."""
        if not self._fleet and not self._local:
            return None
        out: dict[str, tuple[int, int]] = {}
        for qname in self._fleet.keys() | self._local.keys():
            local = self._local.get(qname)
            room = -1 if local is None else max(0, local - self._running[qname])
            out[qname] = (self._fleet.get(qname, -1), room)
        return out
