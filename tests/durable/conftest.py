"""Fixtures of the durable tests that run the App of tests/support/durable_app.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from asyncq import Server
from tests.support import durable_app as d
from tests.support.procs import FAST


@pytest.fixture
async def app(redis: Redis, redis_url: str) -> AsyncIterator[None]:
    d.app.redis = redis_url
    d.flip["on"] = False
    try:
        yield None
    finally:
        await d.app.aclose()


@pytest.fixture
async def worker(app: None) -> AsyncIterator[Server]:
    server = d.app.server(queues={d.QUEUE: 1}, concurrency=4, **FAST)
    await server.start(d.app.mux)
    try:
        yield server
    finally:
        await server.shutdown()
