"""Durable steps on a Redis Cluster: a step's success acknowledged in the batch of its
queue only when its run's record shares the queue's hash slot."""

from __future__ import annotations

import uuid

import pytest
from redis.crc import key_slot

from asyncq import Client, Task
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.durable import RUN_HEADER, RUN_QUEUE_HEADER, STEP_HEADER
from asyncq.errors import BrokerError
from tests.support import transitions
from tests.support.cluster import RedisClusterProcs

pytestmark = pytest.mark.cluster


def other_slot(q: str) -> str:
    """A queue name whose keys live in another hash slot than *q*'s."""
    return next(
        name
        for name in (f"{q}-{i}" for i in range(100))
        if key_slot(f"{{{name}}}".encode()) != key_slot(f"{{{q}}}".encode())
    )


async def test_a_step_whose_run_is_in_another_slot_fails_alone_not_its_batch(
    cluster: RedisClusterProcs,
) -> None:
    q = f"dq-{uuid.uuid4().hex[:8]}"
    away = other_slot(q)

    def step(run_queue: str, run_id: str) -> Task:
        headers = {RUN_HEADER: run_id, RUN_QUEUE_HEADER: run_queue, STEP_HEADER: "0"}
        return Task("step", b"{}", headers=headers, queue=q)

    async with Client(cluster.url) as client:
        broker = Broker(client.redis)
        await client.redis.hset(keys.run_key(q, "near"), "w:0", "1")
        await client.enqueue(Task("plain", queue=q), task_id="p1")
        await client.enqueue(step(q, "near"), task_id="near-0")
        await client.enqueue(step(away, "far"), task_id="far-0")
        got = await transitions.dequeue_many(broker, [q], 3)
        assert len(got) == 3
        results = await broker.ack_many([(t.message, False) for t in got])
        by_id = {t.message.id: r for t, r in zip(got, results, strict=True)}
        # the plain task and the step of a run in its slot are acknowledged in the batch
        assert by_id["p1"] is None and by_id["near-0"] is None
        assert await client.redis.hget(keys.run_key(q, "near"), "r:0") == b"null"
        # the other run's keys are in another slot: that step fails, alone
        assert isinstance(by_id["far-0"], BrokerError)
