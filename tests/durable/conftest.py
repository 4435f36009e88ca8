"""Fixtures of the durable tests that run the App of tests/support/durable_app.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from asyncq import Server
from tests.support import durable_app as d


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
    server = await d.start_worker()
    try:
        yield server
    finally:
        await server.shutdown()


@pytest.fixture
def gate() -> Iterator[None]:
    """:func:`~tests.support.durable_app.gated` waits until the test opens the gate (or
    the test ends)."""
    d.gate["open"] = asyncio.Event()
    yield
    d.gate["open"].set()
