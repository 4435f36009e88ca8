"""Sentinel smoke test: master + replica + one sentinel started by the fixture."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._producer.client import Client
from asyncq.task import Task
from tests.support import transitions
from tests.support.cluster import SentinelSetup, redis_cli
from tests.support.helpers import wait_until

pytestmark = pytest.mark.sentinel


async def sentinel_command(setup: SentinelSetup, *args: str) -> object:
    client = Redis(port=setup.sentinel_port)
    try:
        return await client.execute_command(*args)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelSetup]:
    setup = SentinelSetup().start()
    try:
        yield setup
    finally:
        setup.cleanup()


async def test_enqueue_and_dequeue_through_sentinel(sentinel: SentinelSetup) -> None:
    async with Client(sentinel.url) as client:
        await client.redis.flushdb()
        info = await client.enqueue(Task("sentinel:test", b"payload"), queue="s1")
        # The write went to the master the sentinel reported and reached the replica.
        assert await client.redis.execute_command("WAIT", 1, 5000) == 1
        replica = Redis(port=sentinel.replica.port)
        try:
            assert await replica.lrange(keys.pending_key("s1"), 0, -1) == [info.id.encode()]
        finally:
            await replica.aclose()

        broker = Broker(client.redis)
        got = await transitions.dequeue(broker, ["s1"])
        assert got is not None
        assert got.message.id == info.id
        assert got.message.payload == b"payload"
        await broker.done(got.message)
        assert not await client.redis.exists(keys.task_key("s1", info.id))


async def test_client_follows_a_failover(sentinel: SentinelSetup) -> None:
    """After SENTINEL FAILOVER the same Client writes to the promoted replica."""
    async with Client(sentinel.url) as client:
        await client.redis.flushdb()
        before = await client.enqueue(Task("before", b"1"), queue="fo")
        assert await client.redis.execute_command("WAIT", 1, 5000) == 1
        old_port = sentinel.master_port()
        await sentinel_command(sentinel, "SENTINEL", "FAILOVER", sentinel.master_name)
        await wait_until(lambda: sentinel.master_port() != old_port, within=30, what="the failover")
        assert sentinel.master_port() == sentinel.replica.port
        # Until the old master is demoted it still takes writes that the resync then
        # drops (Redis' failover window, not asyncq's). The sentinel only notices it on
        # its next 10 s INFO poll, so demote it ourselves, as the sentinel will.
        redis_cli(old_port, "replicaof", "127.0.0.1", str(sentinel.replica.port))
        await wait_until(
            lambda: "role:slave" in redis_cli(old_port, "info", "replication"),
            within=30,
            what="the old master to become a replica",
        )

        # The pooled connection still points at the demoted master; redis-py turns its
        # READONLY reply into a ConnectionError, asyncq's retry reconnects to the new one.
        after = None
        for _ in range(100):
            try:
                after = await client.enqueue(Task("after", b"2"), queue="fo")
                break
            except ConnectionError:
                await asyncio.sleep(0.1)
        assert after is not None
        new_master = Redis(port=sentinel.replica.port)
        try:
            pending = await new_master.lrange(keys.pending_key("fo"), 0, -1)
        finally:
            await new_master.aclose()
        assert pending == [after.id.encode(), before.id.encode()]
