"""The edges of the Lua scripts' comparisons, where mutants of them survived the rest.

Each test pins one boundary a script decides on (found by ``nox -s mutation -- lua``:
the comparison moved by one and no other test noticed). Times come from the broker's
fake clock, so each boundary is hit to the second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from asyncq import Client, Task, chain, group
from asyncq import _keys as keys
from asyncq._broker import Broker, PendingItem
from asyncq._broker.multiqueue import MultiQueue
from asyncq._broker.workflow import ack_step
from asyncq._codec import encode_task_message
from tests.support import transitions
from tests.support.helpers import FakeClock, make_msg

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


@pytest.fixture
async def wakeups(redis_url: str) -> AsyncIterator[PubSub]:
    client = Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.subscribe(keys.wakeup_channel(Q))
    assert (await pubsub.get_message(timeout=5) or {}).get("type") == "subscribe"
    try:
        yield pubsub
    finally:
        await pubsub.aclose()
        await client.aclose()


async def _published(redis: Redis, pubsub: PubSub) -> list[bytes]:
    """What was published on the queue's wake-up channel, up to a marker sent now."""
    await redis.publish(keys.wakeup_channel(Q), "marker")
    out: list[bytes] = []
    while True:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
        assert msg is not None, "the marker never arrived"
        if msg["data"] == b"marker":
            return out
        out.append(msg["data"])


async def test_requeue_wakes_workers_only_when_pending_was_empty(
    redis: Redis, clock: FakeClock, wakeups: PubSub
) -> None:
    # requeue.lua publishes when its RPUSH made the list one long, never otherwise.
    broker = Broker(redis, clock=clock)
    for tid in ("a", "b", "c"):
        await broker.enqueue(make_msg(tid, queue=Q))
    assert await _published(redis, wakeups) == [Q.encode()]
    taken = await transitions.dequeue_many(broker, [Q], 2)
    await broker.requeue(taken[0].message)  # "c" is still pending: no wake-up
    assert await _published(redis, wakeups) == []
    await redis.delete(keys.pending_key(Q))
    await broker.requeue(taken[1].message)  # into an empty list: one wake-up
    assert await _published(redis, wakeups) == [Q.encode()]


async def test_a_batch_of_pending_tasks_wakes_workers_only_when_pending_was_empty(
    redis: Redis, clock: FakeClock, wakeups: PubSub
) -> None:
    # enqueue_many.lua (the Client's batch path) publishes once, when its LPUSH filled
    # an empty list, and not for a batch added to waiting work.
    broker = Broker(redis, clock=clock)

    def batch(*ids: str) -> list[PendingItem]:
        return [PendingItem(Q, tid, encode_task_message(make_msg(tid, queue=Q))) for tid in ids]

    assert await broker.enqueue_batch(batch("a", "b")) == [None, None]
    assert await _published(redis, wakeups) == [Q.encode()]
    assert await broker.enqueue_batch(batch("c", "d")) == [None, None]
    assert await _published(redis, wakeups) == []
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"d", b"c", b"b", b"a"]


async def test_a_workflow_wakes_workers_once_per_stage_it_enqueues(
    redis: Redis, client: Client, wakeups: PubSub
) -> None:
    # workflow_start.lua and the hand-off (workflow_advance.lua) publish once per queue
    # a stage is pushed to, whatever the list held; a member that is not its stage's
    # last enqueues nothing and wakes no one.
    broker = Broker(redis)
    await chain(group(Task("a", queue=Q), Task("a", queue=Q)), Task("b", queue=Q)).enqueue(client)
    assert await _published(redis, wakeups) == [Q.encode()]
    members = await transitions.dequeue_many(broker, [Q], 2)
    assert await ack_step(broker, members[0].message, "done") == "running"
    assert await _published(redis, wakeups) == []
    assert await broker.ack_many([(members[1].message, False)]) == [None]
    assert await _published(redis, wakeups) == [Q.encode()]
