"""Every connection kind honours pool_size/pool_timeout: callers wait for a free connection."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq import Client, Inspector, Task
from asyncq._redis.options import RedisClusterOpts, RedisSentinelOpts, parse_redis_uri
from tests.support.cluster import RedisClusterProcs, SentinelSetup


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelSetup]:
    setup = SentinelSetup().start()
    try:
        yield setup
    finally:
        setup.cleanup()


@pytest.mark.sentinel
async def test_300_concurrent_enqueues_through_sentinel_with_a_small_pool(
    sentinel: SentinelSetup,
) -> None:
    opts = parse_redis_uri(sentinel.url)
    assert isinstance(opts, RedisSentinelOpts)
    async with Client(dataclasses.replace(opts, pool_size=4, pool_timeout=20.0)) as client:
        await client.redis.flushdb()
        results = await asyncio.gather(
            *(client.enqueue(Task("pool:t", b"x"), queue="pool") for _ in range(300)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == []
        assert await client.redis.llen("asynq:{pool}:pending") == 300
        # The pool never grew past its size.
        pool = client.redis.connection_pool
        assert len(pool._in_use_connections) + len(pool._available_connections) <= 4


@pytest.mark.sentinel
async def test_sentinel_pool_times_out_with_connection_error(sentinel: SentinelSetup) -> None:
    opts = parse_redis_uri(sentinel.url)
    assert isinstance(opts, RedisSentinelOpts)
    async with Inspector(dataclasses.replace(opts, pool_size=1, pool_timeout=0.2)) as inspector:
        redis = inspector.redis
        blocker = asyncio.ensure_future(redis.execute_command("BLPOP", "pool:nothing", 2))
        await asyncio.sleep(0.3)
        with pytest.raises(RedisConnectionError, match="No connection available"):
            await redis.ping()
        assert await blocker is None


@pytest.mark.cluster
async def test_300_concurrent_enqueues_through_cluster_with_a_small_pool(
    cluster: RedisClusterProcs,
) -> None:
    opts = parse_redis_uri(cluster.url)
    assert isinstance(opts, RedisClusterOpts)
    async with Client(dataclasses.replace(opts, pool_size=3)) as client:
        queues = [f"poolq{i}" for i in range(10)]
        for q in queues:
            await client.redis.delete(f"asynq:{{{q}}}:pending")
        results = await asyncio.gather(
            *(
                client.enqueue(Task("pool:t", b"x"), queue=queues[i % len(queues)])
                for i in range(300)
            ),
            return_exceptions=True,
        )
        assert [r for r in results if isinstance(r, BaseException)] == []
        total = 0
        for q in queues:
            total += await client.redis.llen(f"asynq:{{{q}}}:pending")
        assert total == 300
        for node in client.redis.get_nodes():
            assert len(node._connections) <= 3
