"""The Redis broker: every state transition of a task as one Lua script call.

Split by concern: :mod:`.producer` (enqueue writes), :mod:`.processing` (dequeue,
acks, retry, archive, forward, leases), :mod:`.delivery` (direct delivery to an idle
worker), :mod:`.heartbeats` (what servers and schedulers write about themselves),
:mod:`.aggregation` (group transitions), :mod:`.observations` (completion notices,
events, progress, metrics history); :mod:`.broker` composes those six into
:class:`Broker`, with :mod:`.multiqueue` (the same transitions over many queues),
:mod:`.workflow`, :mod:`.typerate` and :mod:`.replication` (the ``min_replicas``
writes) underneath. Beside it, not composed: :mod:`.inspect` (the Inspector's reads
and bulk operations) and :mod:`.triage` (failure triage).
"""

from asyncq._broker.broker import LEASE_DURATION, BatchItem, Broker, DequeuedTask
from asyncq._broker.producer import PendingItem

__all__ = ["LEASE_DURATION", "BatchItem", "Broker", "DequeuedTask", "PendingItem"]
