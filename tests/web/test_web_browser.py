"""The web UI in a real browser: Playwright driving Debian's chromium against ``asyncq web``
started as a user would (a subprocess), checking Redis after each action.

Skipped when chromium or playwright is missing, except on CI (CI=true), where a
missing browser is a failure: these tests must run there.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from tests.support import gofixtures as go
from tests.support import webdata
from tests.support.browser import WebProcess, mutation, new_page, shot
from tests.support.gofixtures import GoTask
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]


async def test_every_page_opens(web: WebProcess, browser: object, redis: Redis) -> None:
    s = await webdata.seed(redis)
    await webdata.seed_flow(redis)  # the servers page shows an asyncq server's type rates
    assert s.completed is not None
    page = await new_page(browser)
    pages = {
        "dashboard": ("/", "Queues"),
        "queue-pending": ("/queues/critical?state=pending", "critical"),
        "queue-retry": ("/queues/default?state=retry", "gateway timeout"),
        "queue-aggregating": ("/queues/default?state=aggregating", "user:42"),
        "queue-archived": ("/queues/default?state=archived", "gave up"),
        "task-detail": (f"/queues/default/tasks/{s.completed.id}", "Timeline"),
        "servers": ("/servers", "go-host:4242"),
        "queue-critical": ("/queues/critical", "Ordered"),
        "schedulers": ("/schedulers", "@every 1h"),
        "scheduler-history": ("/schedulers/entry-1", "cron-task-1"),
        "redis": ("/redis", "redis_version"),
    }
    for name, (path, text) in pages.items():
        resp = await page.goto(web.url + path)  # type: ignore[attr-defined]
        assert resp.status == 200, path
        if name == "dashboard":  # both charts drawn before the screenshot
            await page.wait_for_selector("#history-chart canvas")  # type: ignore[attr-defined]
        assert text in await page.content(), (path, text)  # type: ignore[attr-defined]
        await shot(page, name)
    # the dashboard drew both charts (uPlot canvases)
    await page.goto(web.url + "/")  # type: ignore[attr-defined]
    await page.wait_for_selector("#history-chart canvas")  # type: ignore[attr-defined]
    assert await page.locator("#size-chart canvas").count() == 1  # type: ignore[attr-defined]
    assert await page.locator("#rate-chart canvas").count() == 1  # type: ignore[attr-defined]
    # a refresh swaps the table but keeps the charts (and their history)
    await redis.incrby("asynq:{default}:processed", 50)
    await page.evaluate("() => window.asyncqRefresh(true)")  # type: ignore[attr-defined]
    total = page.locator("[data-processed-total]")  # type: ignore[attr-defined]
    assert await total.get_attribute("data-processed-total") == "1090"
    assert await page.locator(".charts canvas").count() == 3  # type: ignore[attr-defined]
    # find a task by ID from the header box
    await page.fill("header .search input", s.completed.id)  # type: ignore[attr-defined]
    await page.press("header .search input", "Enter")  # type: ignore[attr-defined]
    await page.wait_for_url(f"**/queues/default/tasks/{s.completed.id}")  # type: ignore[attr-defined]
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_type_rates_on_the_servers_page(
    web: WebProcess, browser: object, redis: Redis
) -> None:
    await webdata.seed(redis)
    await webdata.seed_flow(redis)
    page = await new_page(browser)
    await page.goto(web.url + "/servers")  # type: ignore[attr-defined]
    rows = page.locator("#type-rates tbody tr")  # type: ignore[attr-defined]
    assert await rows.count() == 2
    cells = await rows.nth(0).locator("td").all_inner_texts()
    assert cells[0] == "api:partner" and cells[1] == "60/h" and cells[3] == "2"
    assert cells[2].startswith("0 (next in ") and cells[4].strip() == "1 at 60/h"
    cells = await rows.nth(1).locator("td").all_inner_texts()
    assert cells[:4] == ["mail", "100/s", "no bucket yet", "0"]
    # A second server configuring another rate: the live refresh shows the disagreement.
    from asyncq._broker import Broker
    from asyncq.proto.asynq import ServerInfo

    other = ServerInfo(host="py-host", pid=5152, server_id="py-2", concurrency=1, status="active")
    await Broker(redis).write_server_state(other, [], 3600, type_rates={"mail": "50/s"})
    await page.evaluate("() => window.asyncqRefresh(true)")  # type: ignore[attr-defined]
    mail = page.locator("#type-rates tbody tr").nth(1)  # type: ignore[attr-defined]
    assert "disagree" in await mail.inner_text()
    assert "1 at 100/s, 1 at 50/s" in await mail.inner_text()
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_actions_change_redis(web: WebProcess, browser: object, redis: Redis) -> None:
    s = await webdata.seed(redis)
    assert s.scheduled is not None
    page = await new_page(browser)

    # pause a queue from the dashboard; the row refreshes without a reload
    await page.goto(web.url + "/")  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click('tr[data-queue="critical"] button:has-text("Pause")')  # type: ignore[attr-defined]
    assert await redis.exists("asynq:{critical}:paused") == 1
    await page.wait_for_selector('tr[data-queue="critical"] .badge.paused')  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click('tr[data-queue="critical"] button:has-text("Resume")')  # type: ignore[attr-defined]
    assert await redis.exists("asynq:{critical}:paused") == 0

    # archive a scheduled task, then run it from the archived tab
    tid = s.scheduled.id
    await page.goto(web.url + "/queues/default?state=scheduled")  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click(f'tr[data-id="{tid}"] button:has-text("Archive")')  # type: ignore[attr-defined]
    assert await _state(redis, tid) == b"archived"
    assert await redis.zscore("asynq:{default}:archived", tid) is not None
    await page.goto(web.url + "/queues/default?state=archived")  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click(f'tr[data-id="{tid}"] button:has-text("Run")')  # type: ignore[attr-defined]
    assert await _state(redis, tid) == b"pending"
    assert tid.encode() in await redis.lrange("asynq:{default}:pending", 0, -1)

    # bulk delete: select every archived row, delete the selection
    await page.reload()  # type: ignore[attr-defined]
    assert await redis.zcard("asynq:{default}:archived") == 2
    await page.check("input.selall")  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click('button[data-batch="delete"]')  # type: ignore[attr-defined]
    assert await redis.zcard("asynq:{default}:archived") == 0
    for t in s.archived:
        assert await redis.exists(t.key) == 0
    await page.wait_for_selector("text=No archived tasks.")  # type: ignore[attr-defined]
    await shot(page, "queue-after-bulk-delete")

    # delete all pending tasks of a queue with the "Delete all" button
    await page.goto(web.url + "/queues/critical?state=pending")  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click('.toolbar button:has-text("Delete all")')  # type: ignore[attr-defined]
    assert await redis.llen("asynq:{critical}:pending") == 0
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_read_only_refuses_mutations(redis_url: str, browser: object, redis: Redis) -> None:
    await webdata.seed(redis)
    w = WebProcess(redis_url, "--read-only")
    try:
        page = await new_page(browser)
        await page.goto(w.url + "/queues/default?state=retry")  # type: ignore[attr-defined]
        assert await page.locator("button[data-api]").count() == 0  # type: ignore[attr-defined]
        assert await page.locator(".badge.ro").count() == 1  # type: ignore[attr-defined]
        status = await page.evaluate(  # type: ignore[attr-defined]
            """() => fetch('/api/queues/default/pause',
                   {method: 'POST', headers: {'X-Asyncq-Request': '1'}}).then(r => r.status)"""
        )
        assert status == 405
        assert await redis.exists("asynq:{default}:paused") == 0
        await shot(page, "read-only")
    finally:
        w.stop()


async def test_auth_refuses_a_missing_token(redis_url: str, browser: object, redis: Redis) -> None:
    await webdata.seed(redis)
    w = WebProcess(redis_url, "--token", "s3cret")
    try:
        anon = await new_page(browser)
        # A navigation without credentials gets a 401 with a basic-auth challenge
        # (headless chromium turns that into a navigation error), so ask through
        # the browser context's own request API.
        resp = await anon.context.request.get(w.url + "/api/queues")  # type: ignore[attr-defined]
        assert resp.status == 401
        assert resp.headers["www-authenticate"].startswith("Basic")
        resp = await anon.context.request.get(  # type: ignore[attr-defined]
            w.url + "/api/queues", headers={"Authorization": "Bearer wrong"}
        )
        assert resp.status == 401
        resp = await anon.context.request.get(  # type: ignore[attr-defined]
            w.url + "/api/queues", headers={"Authorization": "Bearer s3cret"}
        )
        assert resp.status == 200
        authed = await new_page(browser, http_credentials={"username": "ops", "password": "s3cret"})
        resp = await authed.goto(w.url + "/")  # type: ignore[attr-defined]
        assert resp.status == 200
        assert "critical" in await authed.content()  # type: ignore[attr-defined]
    finally:
        w.stop()


async def _state(redis: Redis, tid: str) -> bytes | None:
    return await redis.hget(f"asynq:{{default}}:t:{tid}", "state")  # type: ignore[no-any-return]


async def test_live_update_and_redis_down_banner(browser: object) -> None:
    """The open page picks up changes without a reload, and says so when Redis goes away."""
    server = RedisServer().start()
    w = None
    try:
        r = Redis.from_url(server.url)
        await webdata.seed(r)
        w = WebProcess(server.url, "--poll", "1")
        page = await new_page(browser)
        await page.goto(w.url + "/queues/critical?state=pending")  # type: ignore[attr-defined]
        assert await page.locator("tbody tr").count() == 4  # type: ignore[attr-defined]
        extra = GoTask("email:send", b'{"to": "new@example.com"}', queue="critical")
        await go.enqueue(r, extra, datetime.now(UTC))
        # the page polls every second: the new row appears without a reload
        await page.wait_for_selector(f'tr[data-id="{extra.id}"]')  # type: ignore[attr-defined]
        await r.aclose()
        server.stop()
        banner = page.locator("#banner")  # type: ignore[attr-defined]
        await banner.wait_for(state="visible")
        assert "unreachable" in await banner.text_content()
        await shot(page, "redis-down")
        # the rows stay on screen (no stack trace, no blank page)
        assert await page.locator(f'tr[data-id="{extra.id}"]').count() == 1  # type: ignore[attr-defined]
        direct = await page.context.request.get(w.url + "/")  # type: ignore[attr-defined]
        assert direct.status == 503
        assert "Redis is unreachable" in await direct.text()
        assert "Traceback" not in await direct.text()
    finally:
        if w is not None:
            w.stop()
        server.cleanup()


async def test_row_actions_on_hostile_ids_address_only_that_task(
    web: WebProcess, browser: object, redis: Redis
) -> None:
    """A task id holding ``..`` and ``/`` (the Client and the gateway accept it) must not
    make the browser's own URL resolution reach another queue's task (issue 25 item 5)."""
    from asyncq import Client, Task

    hostile = ["../../victimq/tasks/victim1", "..", "a/b"]
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"victim"), queue="victimq", task_id="victim1")
        for tid in hostile:
            await client.enqueue(Task("t", b"h"), queue="ten/ant", task_id=tid)
    page = await new_page(browser)
    await page.goto(web.url + "/")  # type: ignore[attr-defined]
    await page.click('a:has-text("ten/ant")')  # type: ignore[attr-defined]
    await page.wait_for_selector("table.tasks")  # type: ignore[attr-defined]
    for tid in hostile:
        async with mutation(page):
            await page.click(f'tr[data-id="{tid}"] button:has-text("Archive")')  # type: ignore[attr-defined]
        assert await redis.hget(f"asynq:{{ten/ant}}:t:{tid}", "state") == b"archived"
    # The task page of an id with dots opens, and its Delete button deletes it alone.
    await page.goto(web.url + "/queues/ten%2Fant?state=archived")  # type: ignore[attr-defined]
    await page.click(f'a[title="{hostile[0]}"]')  # type: ignore[attr-defined]
    await page.wait_for_selector(f'code:has-text("{hostile[0]}")')  # type: ignore[attr-defined]
    async with mutation(page):
        await page.click('.actions button:has-text("Delete")')  # type: ignore[attr-defined]
    assert await redis.exists("asynq:{ten/ant}:t:" + hostile[0]) == 0
    assert await redis.exists("asynq:{victimq}:t:victim1") == 1
    assert await redis.lrange("asynq:{victimq}:pending", 0, -1) == [b"victim1"]
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_active_tab_and_workflow_list(
    web: WebProcess, browser: object, redis: Redis, redis_url: str
) -> None:
    from asyncq import Client, Task, chain, chord

    s = await webdata.seed(redis)
    assert s.active is not None
    async with Client(redis_url) as client:
        for i in range(3):
            await chain(Task("fetch"), Task("parse")).enqueue(client, workflow_id=f"import-{i}")
        await chord([Task("m"), Task("m")], Task("sum")).enqueue(client, workflow_id="rep/Q4 x")
    page = await new_page(browser)
    await page.goto(web.url + "/queues/default?state=active")  # type: ignore[attr-defined]
    headers = await page.locator("table.tasks thead th").all_inner_texts()  # type: ignore[attr-defined]
    assert headers[headers.index("Status") : headers.index("Status") + 3] == [
        "Status",
        "Started",
        "Deadline",
    ]
    row = page.locator(f'tr[data-id="{s.active.id}"] td')  # type: ignore[attr-defined]
    cells = await row.all_inner_texts()
    at = headers.index("Started")
    assert cells[at].endswith(" ago") and cells[at + 1].startswith("in "), cells
    await shot(page, "queue-active")

    await page.click("nav >> text=Workflows")  # type: ignore[attr-defined]
    await page.wait_for_url("**/workflows")  # type: ignore[attr-defined]
    rows = page.locator("#workflows tbody tr")  # type: ignore[attr-defined]
    assert await rows.count() == 4
    assert "chord" in await page.locator("#workflows tr", has_text="rep/Q4 x").inner_text()  # type: ignore[attr-defined]
    await shot(page, "workflows")
    await page.click("#workflows a:text-is('rep/Q4 x')")  # type: ignore[attr-defined]
    await page.wait_for_url("**/queues/default/workflows/rep%2FQ4%20x")  # type: ignore[attr-defined]
    assert "Workflow rep/Q4 x" in await page.locator("h1").inner_text()  # type: ignore[attr-defined]
    assert page.js_errors == []  # type: ignore[attr-defined]
