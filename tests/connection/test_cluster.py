"""Redis Cluster smoke test: three masters started by the fixture, asyncq on top."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._producer.client import Client
from asyncq._redis.connection import Connection
from asyncq.task import Task, TaskState
from tests.support import transitions
from tests.support.cluster import RedisClusterProcs

pytestmark = pytest.mark.cluster

QUEUES = ("critical", "default", "low", "reports:eu", "q7", "video")


@pytest.fixture
async def client(cluster: RedisClusterProcs) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        await c.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
        yield c


def test_queue_keys_share_one_slot() -> None:
    for q in QUEUES:
        slot = key_slot(keys.pending_key(q).encode())
        same = [
            keys.task_key(q, "id"),
            keys.scheduled_key(q),
            keys.active_key(q),
            keys.lease_key(q),
            keys.unique_key(q, "t", b"p"),
            keys.group_key(q, "g"),
            keys.all_groups(q),
            keys.paused_key(q),
        ]
        assert {key_slot(k.encode()) for k in same} == {slot}
    assert len({key_slot(keys.pending_key(q).encode()) for q in QUEUES}) == len(QUEUES)


def test_queues_spread_over_every_master(cluster: RedisClusterProcs) -> None:
    # Checked against the cluster's own slot map, not assumed from the slot numbers.
    owners = {cluster.master_port_of(f"asynq:{{{q}}}:pending") for q in QUEUES}
    assert owners == cluster.master_ports() and len(owners) == 3


async def test_enqueue_and_dequeue_on_a_cluster(client: Client) -> None:
    assert isinstance(client.redis, RedisCluster)
    await client.ping()
    enqueued = {}
    for q in QUEUES:
        info = await client.enqueue(Task("cluster:test", q.encode()), queue=q)
        assert info.state is TaskState.PENDING
        enqueued[q] = info.id
    unique = await client.enqueue(Task("u", b"x"), queue="low", unique=timedelta(minutes=1))
    batch = await client.enqueue_many([(Task("b", q.encode()), {"queue": q}) for q in QUEUES])
    assert all(not isinstance(r, Exception) for r in batch)

    assert await client.redis.smembers(keys.ALL_QUEUES) == {q.encode() for q in QUEUES}

    broker = Broker(client.redis)
    seen: dict[str, list[str]] = {q: [] for q in QUEUES}
    for q in QUEUES:
        while (got := await transitions.dequeue(broker, [q])) is not None:
            assert got.message.queue == q
            seen[q].append(got.message.id)
            await broker.done(got.message)
    for q in QUEUES:
        assert enqueued[q] in seen[q]
        assert len(seen[q]) == (3 if q == "low" else 2)
    assert unique.id in seen["low"]
    for q in QUEUES:
        assert await client.redis.llen(keys.pending_key(q)) == 0
        assert await client.redis.llen(keys.active_key(q)) == 0


async def test_pubsub_on_a_cluster(cluster: RedisClusterProcs) -> None:
    async with Connection(cluster.url) as conn:
        ps_client = await conn.pubsub()
        pubsub = ps_client.pubsub()
        await pubsub.subscribe(keys.CANCEL_CHANNEL)
        # Publish through another node: the cluster bus carries it to every node.
        subscribed_port = ps_client.connection_pool.connection_kwargs["port"]
        other = next(n for n in cluster.nodes if n.port != subscribed_port)
        async with Connection(f"redis://127.0.0.1:{other.port}") as node:
            for _ in range(100):
                await node.redis.publish(keys.CANCEL_CHANNEL, b"task-1")
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
                if message is not None:
                    break
        assert message is not None and message["data"] == b"task-1"
        await pubsub.aclose()
