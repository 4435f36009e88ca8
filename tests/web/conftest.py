"""The browser tests' fixtures: one ``asyncq web`` and one chromium per run (per xdist
worker), and a Playwright connection per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.browser import Chromium, WebProcess, require_browser


# The browser tests (test_web_*browser.py): the web process and Debian's chromium
# through Playwright. Modules whose `web` is something else define their own.
@pytest.fixture(scope="session")
def web(redis_url: str) -> Iterator[WebProcess]:
    """One ``asyncq web`` for the run: it keeps nothing of a test's but the dashboard's
    live samples (each test flushes the database); a test about a first view of a new
    process takes `new_web`."""
    require_browser()
    w = WebProcess(redis_url)
    yield w
    w.stop()


@pytest.fixture
def new_web(redis_url: str) -> Iterator[WebProcess]:
    """An ``asyncq web`` of this test's own, with no dashboard samples yet."""
    require_browser()
    w = WebProcess(redis_url)
    yield w
    w.stop()


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    require_browser()
    c = Chromium()
    yield c
    c.stop()


@pytest.fixture
async def browser(chromium: Chromium) -> AsyncIterator[object]:
    """The shared chromium, through a Playwright connection of this test's event loop;
    disconnecting closes the contexts the test opened."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.connect_over_cdp(chromium.endpoint)
        try:
            yield b
        finally:
            await b.close()
