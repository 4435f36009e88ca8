"""The browser tests' harness: ``asyncq web`` as a subprocess and one headless chromium
driven through Playwright (tests/web/test_web_*browser.py, fixtures in tests/web/conftest.py).

Skipped when chromium or playwright is missing, except on CI (CI=true), where a
missing browser is a failure: these tests must run there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import pytest

CHROMIUM = os.environ.get("ASYNCQ_CHROMIUM", "/usr/bin/chromium")
SHOTS = (
    Path(os.environ.get("ASYNCQ_SCREENSHOTS", "")) if os.environ.get("ASYNCQ_SCREENSHOTS") else None
)
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# What Playwright's own launch adds (playwright 1.65, chromiumSwitches.ts and its headless
# switches): the one chromium the tests share is started by hand, and its pages must
# behave as a launched one's do: timers of pages in the background not throttled, no
# scrollbars taking width, the same hover and pointer media, the same colour profile.
PLAYWRIGHT_SWITCHES = [
    "--disable-field-trial-config",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-back-forward-cache",
    "--disable-breakpad",
    "--disable-component-extensions-with-background-pages",
    "--no-default-browser-check",
    "--disable-default-apps",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-features=AvoidUnnecessaryBeforeUnloadCheckSync,DestroyProfileOnBrowserClose,"
    "HttpsUpgrades,HttpsFirstBalancedModeAutoEnable,LensOverlay,MediaRouter,PaintHolding,"
    "ThirdPartyStoragePartitioning,AvoidCorsURLLoaderRestartOnRedirect,OptimizationHints,"
    "NetworkTimeServiceQuerying,AimEnabled,PreconnectToSearch",
    "--enable-features=CDPScreenshotNewSurface,SkipListAccountsWithoutGaiaCookies",
    "--allow-pre-commit-input",
    "--disable-hang-monitor",
    "--disable-ipc-flooding-protection",
    "--disable-popup-blocking",
    "--disable-prompt-on-repost",
    "--disable-renderer-backgrounding",
    "--force-color-profile=srgb",
    "--metrics-recording-only",
    "--password-store=basic",
    "--use-mock-keychain",
    "--no-service-autorun",
    "--disable-search-engine-choice-screen",
    "--disable-infobars",
    "--hide-scrollbars",
    "--mute-audio",
    "--blink-settings=primaryHoverType=2,availableHoverTypes=2,primaryPointerType=4,"
    "availablePointerTypes=4",
]


def require_browser() -> None:
    missing = []
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        missing.append(f"chromium at {CHROMIUM}")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if missing:
        message = "browser tests need " + " and ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: these tests must run, not be skipped)")
        pytest.skip(message)


def _read_until(pipe: IO[str], pattern: re.Pattern[str], what: str) -> re.Match[str]:
    """Read *pipe* until a line matches *pattern* (the process said it is ready), then keep
    draining it in a thread so the process never blocks on a full pipe. An exit before the
    line ends the read (end of file): the error carries what the process said."""
    said: list[str] = []
    for line in pipe:
        said.append(line)
        found = pattern.search(line)
        if found:
            threading.Thread(target=pipe.read, daemon=True).start()
            return found
    raise RuntimeError(f"{what} did not start: {''.join(said)}")


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class WebProcess:
    """``asyncq web`` started as a user would, on a port the system picks. It listens before
    it prints its address, so the address line is the sign it is ready: a request made
    then waits in the listen backlog until the server takes it."""

    def __init__(self, redis_url: str, *extra: str) -> None:
        cmd = [sys.executable, "-m", "asyncq.cli", "--uri", redis_url, "web", "--port", "0",
               "--poll", "60", *extra]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self.proc.stdout is not None
        try:
            ready = _read_until(self.proc.stdout, _WEB_READY, "asyncq web")
        except BaseException:
            self.stop()
            raise
        self.url = ready.group(1)

    def stop(self) -> None:
        _end(self.proc)


_WEB_READY = re.compile(r"asyncq web on (http://\S+?)/ ")


class Chromium:
    """One headless chromium for a whole run (per xdist worker): each test connects to it
    over CDP and works in browser contexts of its own, closed when it disconnects."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="asyncq-chromium-")
        cmd = [CHROMIUM, *PLAYWRIGHT_SWITCHES, *ARGS, "--remote-debugging-port=0",
               f"--user-data-dir={self.profile}"]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        try:
            self.endpoint = _read_until(self.proc.stderr, _CDP_READY, "chromium").group(1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _end(self.proc)
        shutil.rmtree(self.profile, ignore_errors=True)


_CDP_READY = re.compile(r"DevTools listening on (ws://\S+)")


async def shot(page: object, name: str) -> None:
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]


_INKED = """([sel, name]) => {
  const canvases = document.querySelectorAll(sel);
  const c = canvases[canvases.length - 1];
  const probe = document.createElement('canvas').getContext('2d');
  probe.fillStyle = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  probe.fillRect(0, 0, 1, 1);
  const [pr, pg, pb] = probe.getImageData(0, 0, 1, 1).data;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let inked = 0;
  for (let i = 0; i < d.length; i += 4) {
    const near = Math.abs(d[i] - pr) + Math.abs(d[i + 1] - pg) + Math.abs(d[i + 2] - pb);
    if (d[i + 3] > 200 && near < 30) inked++;
  }
  return inked;
}"""


async def inked(page: object, canvases: str, colour: str) -> int:
    """Pixels of the last canvas matching *canvases* drawn in the CSS variable *colour*
    (what a chart strokes a series with): the canvas read back, as a user would see it."""
    return int(await page.evaluate(_INKED, [canvases, colour]))  # type: ignore[attr-defined]


async def new_page(browser: object, **kw: object) -> object:
    ctx = await browser.new_context(viewport={"width": 1400, "height": 900}, **kw)  # type: ignore[attr-defined]
    ctx.set_default_timeout(60_000)  # the machine may be busy; never a speed assertion
    page = await ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda d: d.accept())
    page.js_errors = errors
    return page


def _is_mutation(resp: object) -> bool:
    return "/api/" in resp.url and resp.request.method != "GET"  # type: ignore[attr-defined]


@asynccontextmanager
async def mutation(page: object) -> AsyncIterator[None]:
    """Wait for the answer to the API call the actions in the block make (every button
    calls one); the server answers once Redis holds the change, so it can be read then."""
    async with page.expect_response(_is_mutation) as answer:  # type: ignore[attr-defined]
        yield
    resp = await answer.value
    assert resp.ok, (resp.url, resp.status, await resp.text())
