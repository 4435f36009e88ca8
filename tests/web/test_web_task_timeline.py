"""The task page's timeline of a running task has its "started" line, and every moment
on the page is written one way (issue 41, item 12)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import Inspector, ServeMux, Server, Task
from asyncq._producer.client import Client
from asyncq.web import create_app
from tests.support.procs import FAST, wait_until

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")


@pytest.fixture
async def running(redis: Redis) -> AsyncIterator[str]:
    release = asyncio.Event()

    async def hold(task: Task) -> None:
        await release.wait()

    mux = ServeMux()
    mux.handle("hold", hold)
    server = Server(redis, **FAST)
    await server.start(mux)
    try:
        async with Client(redis) as client:
            info = await client.enqueue(
                Task("hold"), deadline=datetime.now(UTC) + timedelta(minutes=5), max_retry=2
            )
        async with Inspector(redis) as insp:

            async def listed() -> bool:  # the heartbeat publishes the running tasks
                return any(
                    w.task_id == info.id for s in await insp.servers() for w in s.active_workers
                )

            await wait_until(listed, what="the worker lists the running task")
        yield info.id
    finally:
        release.set()
        await server.shutdown()


async def test_a_running_tasks_timeline_starts_with_started(redis_url: str, running: str) -> None:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        page = (await http.get(f"/queues/default/tasks/{running}")).text
    timeline = page[page.index('<ol class="timeline">') : page.index("</ol>")]
    lines = re.findall(r"<time [^>]*>([^<]*)</time> <span>([^<]*)</span>", timeline)
    assert [what for _, what in lines] == ["started (attempt 1 of 3)", "now: active", "deadline"]
    assert all(STAMP.match(when) for when, _ in lines), lines
    # The fields above the timeline are written the same way.
    deadline = re.search(r"<dt>Deadline</dt><dd>([^<]*)</dd>", page)
    assert deadline is not None and STAMP.match(deadline.group(1)), deadline
