"""Fixtures of the workflow tests that run the typed App of tests/support/wf_app.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from asyncq import Server
from tests.support import wf_app as wf
from tests.support.procs import FAST


@pytest.fixture
async def app(redis: Redis, redis_url: str) -> AsyncIterator[None]:
    wf.app.redis = redis_url
    try:
        yield None
    finally:
        await wf.app.aclose()


@pytest.fixture
async def worker(app: None) -> AsyncIterator[Server]:
    server = wf.app.server(**FAST)
    await server.start(wf.app.mux)
    try:
        yield server
    finally:
        await server.shutdown()
