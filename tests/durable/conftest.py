"""Fixtures of the durable tests that run the App of tests/support/durable_app.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Intervals, Server
from tests.support import durable_app as d

FAST = Intervals(
    task_check=timedelta(milliseconds=100),
    delayed_task_check=timedelta(milliseconds=100),
    heartbeat=timedelta(milliseconds=200),
    recoverer=timedelta(milliseconds=200),
    janitor=timedelta(milliseconds=200),
)


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
    server = d.app.server(
        queues={d.QUEUE: 1}, concurrency=4, intervals=FAST, shutdown_timeout=timedelta(seconds=2)
    )
    await server.start(d.app.mux)
    try:
        yield server
    finally:
        await server.shutdown()
