"""The Metrics page and the dashboard's throughput chart filled from the metrics history,
in a real browser (Playwright driving Debian's chromium, as tests/web/test_web_browser.py).
With ``ASYNCQ_SCREENSHOTS=DIR`` the tests save screenshots (docs/images/metrics.png is
``metrics.png``, docs/images/dashboard.png ``dashboard-history.png``)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq.history import bucket_of
from tests.support import webdata
from tests.support.browser import SHOTS, WebProcess, new_page, shot

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]

# task type, queue, runs per minute, failed per minute, run time (s) of most runs, of a few
TYPES = [
    ("email:send", "default", 90, 3, 0.03, 0.4),
    ("report:build", "critical", 12, 1, 1.5, 6.0),
    ("image:resize", "default", 40, 0, 0.12, 0.9),
]
MINUTES = 60


async def seed_history(redis: Redis, minutes: int = MINUTES) -> int:
    """Write the hashes a worker would have flushed for the last *minutes* whole minutes
    (each type's rate swinging with the minute); the last minute's processed total."""
    now = int(time.time()) // 60
    last_total = 0
    for back in range(minutes, 0, -1):
        minute = now - back
        swing = 1 + (back % 10) / 10
        pipe = redis.pipeline(transaction=False)
        total = 0
        for task_type, queue, runs, failed, usual, rare in TYPES:
            n = int(runs * swing)
            few = max(1, n // 20)
            key = keys.metrics_history_key(queue, minute)
            pipe.hincrby(key, f"p:{task_type}", n)
            pipe.hincrby(key, f"f:{task_type}", failed)
            pipe.hincrby(key, f"r:{task_type}", failed)
            pipe.hincrby(key, f"us:{task_type}", int(((n - few) * usual + few * rare) * 1e6))
            pipe.hincrby(key, f"h{bucket_of(usual)}:{task_type}", n - few)
            pipe.hincrby(key, f"h{bucket_of(rare)}:{task_type}", few)
            pipe.expire(key, 3600 * 2)
            total += n
        await pipe.execute()
        last_total = total
    for _, queue, *_ in TYPES:
        await redis.sadd(keys.ALL_QUEUES, queue)
    return last_total


VALUES = "'.u-series:not(:first-child) .u-value'"
LEGENDS = f"""(sel) => Array.from(document.querySelectorAll(sel)).map((chart) =>
  Array.from(chart.querySelectorAll({VALUES})).map((el) => el.textContent))"""


async def test_metrics_page(web: WebProcess, browser: object, redis: Redis) -> None:
    seeded = int(time.time()) // 60
    await seed_history(redis)
    page = await new_page(browser)
    await page.goto(web.url + "/")  # type: ignore[attr-defined]
    await page.click("header nav >> text=Metrics")  # type: ignore[attr-defined]
    await page.wait_for_url("**/history")  # type: ignore[attr-defined]
    # one chart of every type together, then two per task type (runs, run times)
    await page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelectorAll('#history-charts canvas').length === 7"
    )
    titles = await page.locator("#history-charts h2").all_inner_texts()  # type: ignore[attr-defined]
    assert [t.splitlines()[0] for t in titles] == [
        "All task types",
        "email:send",
        "image:resize",
        "report:build",
    ]
    # every legend says something at first view, without hovering
    legends = await page.evaluate(LEGENDS, "#history-charts .uplot")  # type: ignore[attr-defined]
    assert len(legends) == 7
    assert all(v and all(x not in ("--", "–", "") for x in v) for v in legends), legends
    latency = dict(zip(("p50", "p95", "p99"), legends[4], strict=True))  # image:resize
    assert latency["p50"].endswith(" ms") and latency["p99"].endswith(" ms")
    rows = await page.locator("#types tbody tr").all_inner_texts()  # type: ignore[attr-defined]
    assert [r.split("\t")[0] for r in rows] == ["email:send", "image:resize", "report:build"]
    report = rows[2].split("\t")
    # one failure a minute; the 1 h window is the current minute and the 59 before it,
    # so each minute ended since the seed leaves one seeded minute out of the window
    ended = int(time.time()) // 60 - seeded
    assert report[1] == "critical"
    assert report[3] in {f"{MINUTES - 1 - n}" for n in range(ended + 1)}, (report, ended)
    # the 6 h window, and a queue filter
    await page.click(".range >> text=6 h")  # type: ignore[attr-defined]
    await page.wait_for_url("**/history?window=360")  # type: ignore[attr-defined]
    await page.select_option("select[name=queue]", "critical")  # type: ignore[attr-defined]
    await page.wait_for_url("**queue=critical**")  # type: ignore[attr-defined]
    await page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelectorAll('#history-charts canvas').length === 3"
    )
    # a refresh redraws from the new page's data
    await page.evaluate("() => window.asyncqRefresh(true)")  # type: ignore[attr-defined]
    await page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelectorAll('#history-charts canvas').length === 3"
    )
    await page.goto(web.url + "/history")  # type: ignore[attr-defined]
    await page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelectorAll('#history-charts canvas').length === 7"
    )
    await shot(page, "metrics")
    # 400 px: nothing pushes the page sideways
    await page.set_viewport_size({"width": 400, "height": 860})  # type: ignore[attr-defined]
    await page.reload()  # type: ignore[attr-defined]
    await page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelectorAll('#history-charts canvas').length === 7"
    )
    width = await page.evaluate("() => document.documentElement.scrollWidth")  # type: ignore[attr-defined]
    assert width <= 400, width
    await shot(page, "narrow-metrics")
    assert page.js_errors == []  # type: ignore[attr-defined]
    # Prometheus keeps its URL
    async with httpx.AsyncClient() as h:
        prom = await h.get(web.url + "/metrics")
        api = await h.get(web.url + "/api/history", params={"window": 60})
        bad = await h.get(web.url + "/api/history", params={"window": 7})
    assert prom.headers["content-type"].startswith("text/plain")
    assert "asynq_tasks_processed_total" in prom.text
    body = api.json()
    assert body["step"] == 60 and len(body["t"]) == 60
    assert [t["task_type"] for t in body["types"]] == ["email:send", "image:resize", "report:build"]
    assert bad.status_code == 400 and "window" in bad.text


async def test_dashboard_throughput_starts_from_history(
    new_web: WebProcess, browser: object, redis: Redis, redis_url: str
) -> None:
    page = await new_page(browser)
    started: list[WebProcess] = []
    if SHOTS is not None:
        # README's picture (docs/images/dashboard.png) has queues in every state too
        await webdata.seed(redis)
    try:
        rates, last_minute = await _throughput_legend(page, new_web, redis, redis_url, started)
    finally:
        for extra in started:
            extra.stop()
    processed = float(rates[0][0].replace(",", ""))
    assert processed == pytest.approx(last_minute / 60, abs=0.01)
    assert float(rates[0][1]) == pytest.approx(4 / 60, abs=0.01)
    await shot(page, "dashboard-history")
    assert page.js_errors == []  # type: ignore[attr-defined]


async def _throughput_legend(
    page: object, web: WebProcess, redis: Redis, redis_url: str, started: list[WebProcess]
) -> tuple[list[list[str]], int]:
    """The throughput legend of a first view, and the runs of the last whole minute seeded."""
    site = web
    for _ in range(3):
        minute = int(time.time()) // 60
        last_minute = await seed_history(redis)
        await page.goto(site.url + "/")  # type: ignore[attr-defined]
        # The web process has one sample only (this render): the throughput comes from the
        # history, with values in its legend at first view.
        await page.wait_for_function(  # type: ignore[attr-defined]
            f"""() => {{ const v = document.querySelectorAll('#rate-chart ' + {VALUES});
                       return v.length === 2 && v[0].textContent !== '--'; }}"""
        )
        points = await page.evaluate(  # type: ignore[attr-defined]
            "() => document.querySelectorAll('#rate-chart canvas').length"
        )
        assert points == 1
        rates = await page.evaluate(LEGENDS, "#rate-chart .uplot")  # type: ignore[attr-defined]
        if int(time.time()) // 60 == minute:
            return rates, last_minute
        # A minute ended between seeding and reading: the page's last whole minute is then
        # the one the seed left empty. Seed again for the new minute, and read it from a
        # new web process: this one now holds two samples, so its chart ends in a live
        # rate (0 with no worker) instead of the history's last minute.
        await redis.flushdb()
        site = await asyncio.to_thread(WebProcess, redis_url)
        started.append(site)
    raise AssertionError("a minute ended during each of three tries")
