"""The typed-API tests' App (tests/support/typed_app.py), shared by the files here that
enqueue its tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from asyncq import App
from tests.support import typed_app as ta


@pytest.fixture
async def app(redis: Redis, redis_url: str) -> AsyncIterator[App[ta.State]]:
    """The typed-API tests' App, pointed at the flushed test Redis."""
    ta.app.redis = redis_url
    ta.EVENTS.clear()
    try:
        yield ta.app
    finally:
        await ta.app.aclose()
