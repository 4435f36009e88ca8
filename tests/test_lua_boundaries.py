"""The edges of the Lua scripts' comparisons, where mutants of them survived the rest.

Each test pins one boundary a script decides on (found by ``nox -s mutation -- lua``:
the comparison moved by one and no other test noticed). Times come from the broker's
fake clock, so each boundary is hit to the second.
"""

from __future__ import annotations

from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.multiqueue import MultiQueue
from tests.helpers import FakeClock, make_msg

Q = "edge"


async def test_a_lease_expiring_this_second_still_holds_its_limit_slot(
    redis: Redis, clock: FakeClock
) -> None:
    # dequeue_queues.lua counts live leases with ZCOUNT lease now +inf: a lease whose
    # expiry is this very second is still live, so it keeps its slot under the limit.
    broker = Broker(redis, clock=clock)
    mq = MultiQueue(broker)
    for tid in ("a", "b"):
        await broker.enqueue(make_msg(tid, queue=Q))
    first = await mq.dequeue([Q], 5, limits={Q: (1, -1)})
    assert [t.message.id for t in first.tasks] == ["a"]
    clock.now = first.tasks[0].lease_expiry
    held = await mq.dequeue([Q], 5, limits={Q: (1, -1)})
    assert held.tasks == [] and held.held == {Q}
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"b"]
    clock.now += 1  # one second later the lease has expired: the slot is free
    second = await mq.dequeue([Q], 5, limits={Q: (1, -1)})
    assert [t.message.id for t in second.tasks] == ["b"]
