"""A durable run's page in a real browser (Playwright driving Debian's chromium, as
tests/web/test_web_browser.py): its steps and what it waits for shown, a signal sent
with the page's form, and a run cancelled with its button. With
``ASYNCQ_SCREENSHOTS=DIR`` it saves ``durable-run.png`` (docs/images/durable-run.png) and
``durable-run-inline.png`` (a step under way inline)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import DurableRunNotFoundError, Inspector, Server
from asyncq import _keys as keys
from tests.support import durable_app as d
from tests.support.browser import WebProcess, mutation, new_page, shot
from tests.support.procs import wait_until

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]

Q = d.QUEUE


@pytest.fixture
async def worker(redis: Redis, redis_url: str) -> AsyncIterator[Server]:
    d.app.redis = redis_url
    server = await d.start_worker()
    try:
        yield server
    finally:
        await server.shutdown()
        await d.app.aclose()


async def test_a_runs_page_shows_its_steps_sends_a_signal_and_cancels(
    web: WebProcess, browser: Any, worker: Server, redis_url: str
) -> None:
    async with Inspector(redis_url) as insp:

        async def state(run_id: str) -> str | None:
            try:
                return (await insp.get_durable_run(Q, run_id)).state
            except DurableRunNotFoundError:
                return None

        async def on_signal(run_id: str) -> bool:  # not on a step it took on the way
            try:
                wait = (await insp.get_durable_run(Q, run_id)).waiting_for
            except DurableRunNotFoundError:
                return False
            return wait is not None and wait.kind == "signal"

        held = await d.fickle.start()  # a step, then a wait for fickle/k
        other = await d.waiter.start("x", None)  # a wait for go/x, no timeout
        await wait_until(lambda: on_signal(held.id), what="the run waits")
        await wait_until(lambda: on_signal(other.id), what="the other run waits")

        page = await new_page(browser)
        await page.goto(f"{web.url}/durable?queue={Q}")
        await page.click(f"#durable-runs a:text-is('{held.id}')")
        await page.wait_for_selector("#entries")
        rows = await page.locator("#entries tbody tr").all_inner_texts()
        assert 'step d:add {"a":2,"b":3}' in rows[0] and "5" in rows[0]
        assert "wait fickle k" in rows[1] and "waiting" in rows[1]
        assert await page.locator("#waits-for").inner_text() == "signal fickle / k (no timeout)"
        await shot(page, "durable-run")

        # the form names the signal the run waits for: send it with a payload
        await page.fill("#signal-form input[name=payload]", '{"ok": true}')
        async with mutation(page):
            await page.click("#signal-form button")
        await page.wait_for_selector("#toast:text('Signal taken by 1 run')")
        assert await held.result(timeout=30) == 5
        await page.reload()
        assert await page.locator("#run-state").inner_text() == "completed"
        assert await page.locator("button:text('Cancel run')").count() == 0

        # cancel the other run with its page's button
        await page.goto(f"{web.url}/queues/{Q}/durable/{other.id}")
        async with mutation(page):
            await page.click("button:text('Cancel run')")
        await page.wait_for_selector("#run-state:text('cancelled')")
        assert await state(other.id) == "cancelled"
        assert await page.locator("button:text('Cancel run')").count() == 0
        assert page.js_errors == []


async def test_a_runs_page_shows_the_step_it_runs_inline(
    web: WebProcess, browser: Any, worker: Server, redis: Redis
) -> None:
    d.gate["open"] = asyncio.Event()
    try:
        handle = await d.gate_inline.start(1)  # its one step waits for the gate, inline
        step = f"{handle.id}-0"
        await wait_until(
            lambda: redis.exists(keys.task_key(Q, step)), what="the inline step started"
        )
        page = await new_page(browser)
        await page.goto(f"{web.url}/queues/{Q}/durable/{handle.id}")
        await page.wait_for_selector("#entries")
        assert await page.locator("#run-state").inner_text() == "running"
        assert await page.locator("#waits-for").inner_text() == "-"
        (row,) = await page.locator("#entries tbody tr").all_inner_texts()
        assert 'step d:gated {"n":1}' in row and row.rstrip().endswith("running")
        await shot(page, "durable-run-inline")
        d.gate["open"].set()
        assert await handle.result(timeout=30) == 101
        await page.reload()
        assert await page.locator("#run-state").inner_text() == "completed"
        (row,) = await page.locator("#entries tbody tr").all_inner_texts()
        assert "101" in row and "running" not in row
        assert page.js_errors == []
    finally:
        d.gate["open"].set()
