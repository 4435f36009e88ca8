"""The Redis broker: every state transition of a task as one Lua script call.

Split by concern: :mod:`.producer` (enqueue writes), :mod:`.processing` (dequeue,
acks, retry, archive, forward, leases), :mod:`.records` (server and scheduler
records), :mod:`.aggregation` (groups), :mod:`.inspect` (the Inspector's reads and
bulk operations); :mod:`.broker` composes the first four into :class:`Broker`.
"""

from asyncq._broker.broker import LEASE_DURATION, BatchItem, Broker, DequeuedTask
from asyncq._broker.producer import PendingItem

__all__ = ["LEASE_DURATION", "BatchItem", "Broker", "DequeuedTask", "PendingItem"]
