"""Progress bars and the live event tail in a real browser (Playwright driving Debian's
chromium, as tests/web/test_web_browser.py). With ``ASYNCQ_SCREENSHOTS=DIR`` it saves
``events.png`` and ``task-progress.png``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Server, Task
from tests.support import progress_app as pa
from tests.support.browser import WebProcess, new_page, shot
from tests.support.procs import FAST, wait_until

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]


@pytest.fixture
async def worker(redis: Redis, redis_url: str) -> AsyncIterator[Server]:
    pa.app.redis = redis_url  # the handlers' gate reads this Redis
    server = Server(redis_url, events=True, **FAST)
    await server.start(pa.app.mux)
    try:
        yield server
    finally:
        await server.shutdown()


async def test_progress_bars_and_live_event_tail(
    web: WebProcess, browser: Any, worker: Server, redis: Redis, redis_url: str
) -> None:
    async with Client(redis_url, events=True) as client, Inspector(redis_url) as insp:
        for _ in range(3):
            done = await client.enqueue(Task.from_json("steps", {"n": 0}))
        failed = await client.enqueue(Task("failing"), max_retry=0)
        running = await client.enqueue(Task.from_json("steps", {"n": 5, "hold": True}))

        async def at_last_step() -> bool:
            p = (await insp.get_task("default", running.id)).progress
            return p is not None and p.message == "step 4/5"

        await wait_until(at_last_step, what="the running task's last step")
        page = await new_page(browser)
        await page.goto(web.url + "/queues/default?state=active")
        bar = page.locator("progress.task-progress")
        assert await bar.get_attribute("value") == "0.8"
        await page.goto(f"{web.url}/queues/default/tasks/{running.id}")
        row = page.locator(".progress-row")
        assert "80%" in await row.inner_text() and "step 4/5" in await row.inner_text()
        await shot(page, "task-progress")

        await page.goto(web.url + "/events")
        await page.wait_for_selector(f"#events a[title='{failed.id}']")
        kinds = await page.locator(
            f"#events tr:has(a[title='{failed.id}']) .badge"
        ).all_inner_texts()
        # The worker's events in order, newest first; the client's "enqueued" is written
        # after the enqueue, so a task picked up at once may show it after "started".
        assert [k for k in kinds if k != "enqueued"] == ["archived", "failed", "started"]
        assert "enqueued" in kinds
        # enqueued, started, succeeded: its progress event is hidden by default (a running
        # task writes up to 10 a second), shown with the "progress" box ticked.
        assert await page.locator(f"#events a[title='{done.id}']").count() == 3
        assert await page.locator("#events tr.ev-progress").count() == 0
        # Live: a new task's events appear without reloading.
        later = await client.enqueue(Task.from_json("steps", {"n": 0}))
        await page.wait_for_selector(f"#events tr.ev-succeeded a[title='{later.id}']")
        await redis.rpush(pa.GATE + running.id, 1)
        await page.wait_for_selector(f"#events tr.ev-succeeded a[title='{running.id}']")
        await shot(page, "events")
        await page.check("input[name=progress]")
        await page.click("form.filters button[type=submit]")
        await page.wait_for_selector(f"#events tr.ev-progress a[title='{done.id}']")
        # Filters: one kind only.
        await page.goto(web.url + "/events?kind=failed")
        badges = await page.locator("#events .badge").all_inner_texts()
        assert badges == ["failed"]
