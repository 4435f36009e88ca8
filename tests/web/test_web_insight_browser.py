"""The dashboard's first view, failure triage, JSON highlighting, the dark theme and a
400 px viewport in a real browser (Playwright driving Debian's chromium, as
tests/web/test_web_browser.py). With ``ASYNCQ_SCREENSHOTS=DIR`` each test saves screenshots."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from tests.support import webdata
from tests.support.browser import (
    WebProcess,
    mutation,
    new_page,
    shot,
)
from tests.support.triage import KEYERR, seed_mixed

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]


VALUES = "' .u-series:not(:first-child) .u-value'"
LEGEND_VALUES = (
    f"(sel) => Array.from(document.querySelectorAll(sel + {VALUES})).map((el) => el.textContent)"
)


RATE_SHOWN = (
    "() => document.querySelector('#rate-chart .u-series:nth-child(2) .u-value')"
    ".textContent !== '--'"
)


async def _legend(page: object, chart: str) -> list[str]:
    return await page.evaluate(LEGEND_VALUES, chart)  # type: ignore[attr-defined, no-any-return]


async def _until(page: object, script: str, arg: object = None) -> None:
    """Wait until *script* (a JS function of *arg*) returns true in the page."""
    await page.wait_for_function(script, arg=arg)  # type: ignore[attr-defined]


async def test_dashboard_first_view_says_something(
    new_web: WebProcess, browser: object, redis: Redis
) -> None:
    await webdata.seed(redis)
    await seed_mixed(redis)
    page = await new_page(browser)
    await page.goto(new_web.url + "/")  # type: ignore[attr-defined]
    await page.wait_for_selector("#history-chart canvas")  # type: ignore[attr-defined]
    # One stacked bar per queue, biggest first, its parts coloured as the state badges.
    names = await page.locator(".sizes .qn").all_inner_texts()  # type: ignore[attr-defined]
    assert names == ["default", "critical", "low"]
    colours = await page.evaluate(  # type: ignore[attr-defined]
        """() => ['pending', 'archived'].map((s) => [
          getComputedStyle(document.querySelector('.sizes .qbar .st-' + s)).backgroundColor,
          getComputedStyle(document.querySelector('.chip.st-' + s)).backgroundColor])"""
    )
    assert all(bar == chip for bar, chip in colours), colours
    # Every legend shows current values without hovering, the throughput too (measured
    # between the first view and a quick second reading).
    script = f"""(sels) => sels.every((sel) => {{
      const vals = Array.from(document.querySelectorAll(sel + {VALUES}));
      return vals.length > 0 && vals.every((el) => el.textContent !== '--');
    }})"""
    await _until(page, script, ["#size-chart", "#history-chart", "#rate-chart"])
    size = dict(zip(["active", "pending", "aggregating", "scheduled", "retry", "archived",
                     "completed"], await _legend(page, "#size-chart"), strict=True))  # fmt: skip
    assert size["archived"] == "17" and size["retry"] == "6" and size["pending"] == "6"
    assert (await _legend(page, "#history-chart"))[1] == "2"  # today's failures
    # The history chart refreshes with the page: today's counter moves, the legend follows.
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    await redis.incrby(f"asynq:{{default}}:processed:{today}", 100)
    await page.evaluate("() => window.asyncqRefresh(true)")  # type: ignore[attr-defined]
    await _until(
        page,
        """() => { const v = document.querySelectorAll('#history-chart .u-series .u-value');
                   return v.length > 1 && v[1].textContent === '108'; }""",
    )
    # Each dashboard render records a sample (at most one a second): a few refreshes while
    # the counters move draw the live lines, and a new page starts with all of them.
    samples = (
        "() => JSON.parse(document.getElementById('live-samples').dataset.live).samples.length"
    )
    for step in range(1, 6):
        before = await page.evaluate(samples)  # type: ignore[attr-defined]
        await redis.incrby("asynq:{default}:processed", 40 * step)
        await redis.incrby("asynq:{default}:failed", step)
        for _ in range(300):  # a new sample needs a second since the last one
            await page.wait_for_timeout(200)  # type: ignore[attr-defined]
            await page.evaluate("() => window.asyncqRefresh(true)")  # type: ignore[attr-defined]
            if await page.evaluate(samples) > before:  # type: ignore[attr-defined]
                break
        else:
            raise AssertionError("the dashboard recorded no new sample")
    # The new page's own render may add a sample: the counters move before it too, so the
    # newest throughput is not zero whether it does or not.
    await redis.incrby("asynq:{default}:processed", 240)
    await redis.incrby("asynq:{default}:failed", 6)
    fresh = await new_page(browser)
    await fresh.goto(new_web.url + "/")  # type: ignore[attr-defined]
    await fresh.wait_for_selector("#history-chart canvas")  # type: ignore[attr-defined]
    kept = await fresh.evaluate(samples)  # type: ignore[attr-defined]
    assert kept >= 6  # the first view's and the five above (more when renders fell apart)
    await _until(fresh, script, ["#size-chart", "#history-chart", "#rate-chart"])
    rates = await _legend(fresh, "#rate-chart")
    assert float(rates[0]) > 0 and float(rates[1]) > 0
    await shot(fresh, "dashboard-live")
    assert page.js_errors == [] and fresh.js_errors == []  # type: ignore[attr-defined]


async def test_failure_triage_page_and_a_group_action(
    web: WebProcess, browser: object, redis: Redis
) -> None:
    await webdata.seed(redis)
    made = await seed_mixed(redis)
    page = await new_page(browser)
    await page.goto(web.url + "/errors")  # type: ignore[attr-defined]
    groups = page.locator(".egroup")  # type: ignore[attr-defined]
    # seed_mixed's five groups and webdata's two (a retry "gateway timeout", two "gave up")
    assert await groups.count() == 7
    counts = await page.locator(".egroup .ecount b").all_inner_texts()  # type: ignore[attr-defined]
    assert counts == ["9", "5", "3", "2", "2", "1", "1"]
    await shot(page, "failure-triage")
    card = page.locator(f'.egroup[data-key="{KEYERR.key}"]')  # type: ignore[attr-defined]
    assert "KeyError" in await card.locator(".sig").inner_text()
    async with mutation(page):
        await card.locator("button.danger").click()  # Delete all (the dialog is accepted)
    assert not any([await redis.exists(t.key) for t in made["key"]])
    await _until(page, "(key) => !document.querySelector(`.egroup[data-key='${key}']`)", KEYERR.key)
    assert "5 task(s)" in await page.locator("#toast").inner_text()  # type: ignore[attr-defined]
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_json_payloads_and_results_are_highlighted(
    web: WebProcess, browser: object, redis: Redis
) -> None:
    s = await webdata.seed(redis)
    assert s.completed is not None
    page = await new_page(browser)
    await page.goto(f"{web.url}/queues/default/tasks/{s.completed.id}")  # type: ignore[attr-defined]
    payload = page.locator("#payload")  # type: ignore[attr-defined]
    result = page.locator("#result")  # type: ignore[attr-defined]
    await page.wait_for_selector("#result .token.boolean")  # type: ignore[attr-defined]
    assert await payload.locator(".token.property").all_inner_texts() == ['"id"']
    assert await result.locator(".token.number").all_inner_texts() == ["12"]
    assert await result.inner_text() == '{\n  "rows": 12,\n  "ok": true\n}'  # text unchanged
    await shot(page, "task-json")
    await page.goto(web.url + "/queues/critical?state=pending")  # type: ignore[attr-defined]
    cells = page.locator("td.payload .token.property")  # type: ignore[attr-defined]
    assert await cells.count() == 3  # the three JSON payloads; the binary one stays plain
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_dark_theme_is_remembered(web: WebProcess, browser: object, redis: Redis) -> None:
    s = await webdata.seed(redis)
    await seed_mixed(redis)
    page = await new_page(browser, color_scheme="light")
    await page.goto(web.url + "/")  # type: ignore[attr-defined]
    bg = "() => getComputedStyle(document.body).backgroundColor"
    assert await page.evaluate(bg) == "rgb(247, 247, 249)"  # type: ignore[attr-defined]
    await page.click("#theme")  # type: ignore[attr-defined]
    assert await page.evaluate(bg) == "rgb(21, 23, 28)"  # type: ignore[attr-defined]
    for path in ("/", "/errors", f"/queues/default/tasks/{s.completed.id}"):  # type: ignore[union-attr]
        await page.goto(web.url + path)  # type: ignore[attr-defined]
        assert await page.evaluate(bg) == "rgb(21, 23, 28)", path  # type: ignore[attr-defined]
    await page.goto(web.url + "/")  # type: ignore[attr-defined]
    await page.wait_for_selector("#history-chart canvas")  # type: ignore[attr-defined]
    await _until(page, RATE_SHOWN)
    await shot(page, "dashboard-dark")
    await page.goto(web.url + "/errors")  # type: ignore[attr-defined]
    await shot(page, "failure-triage-dark")
    await page.click("#theme")  # type: ignore[attr-defined]
    await page.reload()  # type: ignore[attr-defined]
    assert await page.evaluate(bg) == "rgb(247, 247, 249)"  # type: ignore[attr-defined]
    assert page.js_errors == []  # type: ignore[attr-defined]


async def test_pages_fit_a_400px_screen(web: WebProcess, browser: object, redis: Redis) -> None:
    s = await webdata.seed(redis)
    await seed_mixed(redis)
    assert s.completed is not None
    page = await new_page(browser)
    await page.set_viewport_size({"width": 400, "height": 860})  # type: ignore[attr-defined]
    paths = {
        "narrow-dashboard": "/",
        "narrow-failure-triage": "/errors",
        "narrow-task": f"/queues/default/tasks/{s.completed.id}",
        "narrow-queue": "/queues/default?state=archived",
        "narrow-servers": "/servers",
        "narrow-schedulers": "/schedulers",
        "narrow-redis": "/redis",
    }
    for name, path in paths.items():
        await page.goto(web.url + path)  # type: ignore[attr-defined]
        if path == "/":
            await page.wait_for_selector("#history-chart canvas")  # type: ignore[attr-defined]
            await _until(page, RATE_SHOWN)
        # Nothing pushes the page sideways (wide tables scroll inside their own box).
        width = await page.evaluate("() => document.documentElement.scrollWidth")  # type: ignore[attr-defined]
        assert width <= 400, (path, width)
        if name in ("narrow-dashboard", "narrow-failure-triage", "narrow-task"):
            await shot(page, name)
    assert page.js_errors == []  # type: ignore[attr-defined]
