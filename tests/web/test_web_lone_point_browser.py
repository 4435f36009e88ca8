"""The Metrics page draws a type's single minute of data (issue 41, item 6): a value with
no value beside it has no line, and uPlot hides points where they are dense, so the
run-time chart stayed empty while its legend read ``p50: 14 ms``. In a real browser
(Playwright driving chromium, as tests/test_web_browser.py); the canvas is read back."""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq.history import bucket_of
from tests.support.browser import WebProcess, inked, new_page, shot

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]


async def test_one_minute_of_a_type_is_drawn(web: WebProcess, browser: Any, redis: Redis) -> None:
    minute = int(time.time()) // 60 - 2  # a minute that is over
    key = keys.metrics_history_key("default", minute)
    await redis.hset(
        key,
        mapping={
            "p:report:build": 120,
            "f:report:build": 3,
            "us:report:build": 120 * 14_000,
            f"h{bucket_of(0.014)}:report:build": 120,
        },
    )
    await redis.expire(key, 3600)
    await redis.sadd(keys.ALL_QUEUES, "default")
    page = await new_page(browser)
    await page.goto(web.url + "/history")
    await page.wait_for_function(
        "() => document.querySelectorAll('#history-charts canvas').length === 3"
    )
    legend = await page.locator("#history-charts .uplot").nth(2).inner_text()
    assert "p50" in legend and " ms" in legend
    # the last type's run-time chart: its lone p50 point
    assert await inked(page, "#history-charts canvas", "--pending") > 0
    await shot(page, "metrics-one-minute")
