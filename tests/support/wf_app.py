"""Typed tasks for the workflow-handle tests (imported by the tests and by
``asyncq worker tests.support.wf_app:app`` in a subprocess)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

from redis.asyncio import Redis

from asyncq import App

GO = "wf-test:go"

app = App(os.environ.get("TEST_REDIS_URL", "redis://localhost:6379/0"))


@app.task(name="wf:price", timeout=timedelta(seconds=60))
async def price(item: int) -> int:
    """Waits until the test sets GO, so a test can look before the callback exists."""
    async with Redis.from_url(str(app.redis)) as r:
        while not await r.exists(GO):  # noqa: ASYNC110 - the signal is a Redis key
            await asyncio.sleep(0.02)
    return item * 10


@app.task(name="wf:add_up")
async def add_up(prices: list[int], discount: int = 0) -> int:
    return sum(prices) - discount


@app.task(name="wf:incr")
async def incr(n: int) -> int:
    return n + 1


@app.task(name="wf:scale")
async def scale(n: int, factor: int) -> int:
    return n * factor


@app.task(name="wf:label")
async def label(text: str, suffix: str = "") -> str:
    return text + suffix


@app.task(name="wf:fail", max_retry=0)
async def fail(n: int) -> int:
    raise RuntimeError(f"refused {n}")


@app.task(name="wf:count_ok")
async def count_ok(values: list[int | None]) -> int:
    return sum(v is not None for v in values)
