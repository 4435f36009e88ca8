from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from asyncq._broker import Broker
from asyncq.client import Client
from tests.cluster import RedisClusterProcs
from tests.redis_server import RedisServer

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis the tests may flush: a throwaway server, or ASYNCQ_TEST_REDIS_URL."""
    env = os.environ.get("ASYNCQ_TEST_REDIS_URL")
    if env:
        yield env
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def cluster() -> Iterator[RedisClusterProcs]:
    """A three-master Redis Cluster for the tests that need one (started on first use)."""
    procs = RedisClusterProcs(3).start()
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A raw redis-py client on a flushed database (bytes responses)."""
    client = Redis.from_url(redis_url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def broker(redis: Redis) -> Broker:
    return Broker(redis)


@pytest.fixture
async def client(redis: Redis) -> AsyncIterator[Client]:
    """An asyncq Client sharing the test's redis-py client."""
    async with Client(redis) as c:
        yield c
