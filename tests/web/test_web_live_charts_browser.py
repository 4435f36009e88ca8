"""The dashboard's two live charts (issue 41, item 6), in a real browser: "Throughput,
live" fell to 0 between refreshes and stayed empty, "Queue size, live" drew lone dots
with gaps.

Each refresh sends the web process's last 30 minutes of samples again, and the page mapped
them onto its clock with an offset taken again at each refresh: the same sample came back
a few milliseconds later as a second point whose rate read 0. And a hidden tab refreshes
about once a minute, so samples a minute apart were taken for a gap: no rate, and a lone
dot per sample. live.js keeps each sample once (by the server's time, mapped with the first
refresh's offset) and joins samples up to 150 s apart; a page seen again refreshes at once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.support.browser import WebProcess, inked, new_page, shot
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.xdist_group("web-browser"), pytest.mark.timeout(240)]

# Three refreshes, each sending every sample so far, each with another request latency.
RESENT = """() => {
  const s = new window.AsyncqLiveSeries(["active", "pending"], 150, 360);
  const rows = [[100, 0, 0, 1, 2], [105, 50, 5, 1, 3], [110, 100, 5, 0, 4]];
  s.add(rows.slice(0, 1), 100.0, 5000.0);
  s.add(rows.slice(0, 2), 105.0, 5005.03);
  s.add(rows.slice(0, 3), 110.0, 5010.01);
  return { t: s.sizes[0], pending: s.sizes[2], rt: s.rates[0],
           processed: s.rates[1], failed: s.rates[2] };
}"""

# A hidden tab's refreshes, a minute apart, then one after nobody watched for 10 minutes.
SPACED = """() => {
  const s = new window.AsyncqLiveSeries(["active"], 150, 360);
  const rows = [[0, 0, 0, 1], [61, 610, 0, 1], [122, 1220, 61, 1], [722, 1820, 61, 1]];
  rows.forEach((row, i) => s.add(rows.slice(0, i + 1), row[0], row[0] + 1000));
  return { t: s.sizes[0], active: s.sizes[1], rt: s.rates[0], processed: s.rates[1] };
}"""


async def _series(web: WebProcess, browser: Any, script: str) -> Any:
    """What *script* makes of live.js's series, run in the dashboard's page."""
    page = await new_page(browser)
    await page.goto(web.url + "/")
    got = await page.evaluate(script)
    assert page.js_errors == []
    return got


async def test_a_resent_sample_is_kept_once_and_its_rate_is_never_a_false_zero(
    web: WebProcess, browser: Any, redis: Redis
) -> None:
    got = await _series(web, browser, RESENT)
    assert got["t"] == [5000, 5005, 5010]  # one point per sample, on the first offset
    assert got["pending"] == [2, 3, 4]
    assert got["rt"] == [5005, 5010]
    assert got["processed"] == [10, 10]
    assert got["failed"] == [1, 0]


async def test_a_hidden_tab_s_minute_apart_samples_are_joined_and_only_a_real_gap_breaks(
    web: WebProcess, browser: Any, redis: Redis
) -> None:
    got = await _series(web, browser, SPACED)
    # a minute apart: joined, each rate the mean over its minute; 600 s apart: a break
    assert got["t"] == [1000, 1061, 1122, 1123, 1722]
    assert got["active"] == [1, 1, 1, None, 1]
    assert got["rt"] == [1061, 1122, 1123]
    assert got["processed"] == [10, 10, None]


async def test_the_live_charts_draw_lines_as_tasks_run(
    new_web: WebProcess, browser: Any, redis: Redis
) -> None:
    await redis.sadd("asynq:queues", "default")
    await redis.lpush("asynq:{default}:pending", "a", "b")
    page = await new_page(browser)
    await page.goto(new_web.url + "/")
    await page.wait_for_selector("#rate-chart canvas")

    async def samples() -> int:
        raw = await page.get_attribute("#live-samples", "data-live")
        return len(json.loads(raw or "{}").get("samples", []))

    for n in range(2, 7):  # a task group's counters move between refreshes
        await redis.incrby("asynq:{default}:processed", 25)
        await redis.lpush("asynq:{default}:pending", f"t{n}")

        async def sampled(n: int = n) -> bool:
            await page.evaluate("() => window.asyncqRefresh(true)")
            return await samples() >= n

        await wait_until(sampled, what=f"{n} samples")  # one a second at most, server side
    assert await inked(page, "#rate-chart canvas", "--accent") > 0  # processed/s line
    assert await inked(page, "#size-chart canvas", "--pending") > 0  # pending line
    legend = await page.locator("#rate-chart .u-legend").inner_text()
    assert "processed/s" in legend and "--" not in legend.split("processed/s")[1].split("\n")[0]
    await shot(page, "dashboard-live-charts")
    assert page.js_errors == []


async def test_a_page_seen_again_refreshes_at_once(
    web: WebProcess, browser: Any, redis: Redis
) -> None:
    page = await new_page(browser)
    await page.add_init_script("localStorage.setItem('asyncq.poll', '60')")
    await page.goto(web.url + "/")
    refreshed: list[str] = []
    page.on("request", lambda req: refreshed.append(req.url) if req.url == page.url else None)
    await page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")
    await wait_until(lambda: bool(refreshed), what="a refresh on the page being seen")
