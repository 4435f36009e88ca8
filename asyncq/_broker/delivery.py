"""Direct delivery: an enqueue gives its task to an idle worker without a fetch.

An idle asyncq worker on a single Redis server (plain or Sentinel; not Redis
Cluster, where the keys would span slots) *arms* itself after a fetch found
nothing (``delivery_arm.lua``): it sets its credit ``asyncq:delivery:<server id>``
to 1, with a TTL it renews while idle, and writes itself into the waiters list
of each queue it may be delivered from. An asyncq enqueue into such a queue with
nothing pending then writes the task active, with the worker's lease, and
publishes it on the worker's channel of the same name (``enqueue.lua``): the
task reaches the worker in the enqueue's own hop, and is never active without a
lease. Go asynq's enqueue never delivers directly: its tasks wake the worker through key
tracking and are fetched, as before.

The note published is ``b"<lease expiry> <len(queue)> <len(id)> " + queue + id +
msg``; :func:`read_note` reads it into the :class:`~asyncq._broker.DequeuedTask` a
fetch returns, so a delivered task enters the worker by the same door as a fetched one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncq import _keys as keys
from asyncq._broker._base import LUA_PACKAGE, BrokerBase, usable_message
from asyncq._broker.processing import DequeuedTask
from asyncq._redis.scripts import load_script
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "WAITERS_TTL",
    "DeliveryNote",
    "DirectDelivery",
    "delivered_message",
    "parse_note",
    "read_note",
]

WAITERS_TTL = 1800.0
"""Seconds a queue's waiters list lasts after the last registration in it: a waiting
worker registers again well within it (every 10 minutes), so only the list of a queue
nobody waits for any more expires."""

_ARM = load_script(LUA_PACKAGE, "delivery_arm")
_DISARM = load_script(LUA_PACKAGE, "delivery_disarm")


@dataclass(frozen=True, slots=True)
class DeliveryNote:
    """One task delivered to this worker, as published by ``enqueue.lua``."""

    lease_expiry: int
    queue: str
    task_id: str
    data: bytes


def delivered_message(note: DeliveryNote) -> TaskMessage | None:
    """The note's task message, or None when it is unusable here: it cannot be decoded,
    or names another id or queue (:meth:`DirectDelivery.reject_delivered` archives it,
    as a fetch would)."""
    found = usable_message(note.data, note.task_id, note.queue)
    return found if isinstance(found, TaskMessage) else None


def parse_note(note: bytes) -> DeliveryNote:
    """Read a delivery note; ValueError names what is wrong with a malformed one."""
    head = note.split(b" ", 3)
    if len(head) != 4 or not all(part.isdigit() for part in head[:3]):
        raise ValueError(f"malformed delivery note: {note[:60]!r}")
    expiry, qlen, idlen = (int(part) for part in head[:3])
    rest = head[3]
    if qlen + idlen > len(rest):
        raise ValueError(f"delivery note shorter than its header says: {note[:60]!r}")
    queue = rest[:qlen].decode("utf-8", "surrogateescape")
    task_id = rest[qlen : qlen + idlen].decode("utf-8", "surrogateescape")
    return DeliveryNote(expiry, queue, task_id, rest[qlen + idlen :])


def read_note(note: bytes) -> DequeuedTask | DeliveryNote:
    """The task a delivery note carries, as a fetch returns it; the note itself when its
    message is unusable here (:meth:`DirectDelivery.reject_delivered` archives it). ValueError
    (from :func:`parse_note`) for a malformed note."""
    parsed = parse_note(note)
    msg = delivered_message(parsed)
    return parsed if msg is None else DequeuedTask(msg, parsed.lease_expiry)


class DirectDelivery(BrokerBase):
    """The worker's side of direct delivery: arming, disarming, rejecting an unusable task."""

    def delivery_member(self, server_id: str) -> str:
        """What the server writes into a queue's waiters list."""
        return f"{int(self.lease_duration)}:{keys.delivery_channel(server_id)}"

    async def arm_delivery(self, server_id: str, ttl: float, qnames: Sequence[str] = ()) -> bool:
        """Ask for the next task of *qnames* (none: renew the credit, lasting *ttl* seconds);
        False when the credit had expired and no queues were given, so the caller must
        register them again. The waiters lists written last :data:`WAITERS_TTL`."""
        key = keys.delivery_channel(server_id)
        member = self.delivery_member(server_id)
        args: list[str | int] = [key, int(ttl * 1000), member, int(WAITERS_TTL * 1000), *qnames]
        return bool(await _ARM(self._cmd, (), args))

    async def disarm_delivery(self, server_id: str, qnames: Sequence[str]) -> None:
        """Stop being delivered tasks, and leave the waiters lists of *qnames* (a note already
        published still arrives)."""
        key = keys.delivery_channel(server_id)
        await _DISARM(self._cmd, (), [key, self.delivery_member(server_id), *qnames])

    async def reject_delivered(self, note: DeliveryNote) -> None:
        """Archive a delivered task whose message is unusable here (see
        :func:`delivered_message`), with the reason, exactly as a fetch would."""
        qk = self._q(note.queue)
        msg = await self._decode_or_archive(
            qk, note.task_id, note.data, self.clock(), qk.active, check_queue=True
        )
        if msg is not None:
            raise ValueError(f"task {note.task_id!r} of queue {note.queue!r} is usable")
