"""``asyncq._signals.signal_handlers`` where signals cannot be handled: a loop outside the
main thread (a worker started from a web framework's thread) and a platform without
``add_signal_handler`` (Windows). The caller then runs until its own end, and says so.
The main-thread path is exercised by the subprocess tests that send real signals."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import pytest

from asyncq._signals import signal_handlers


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event))

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event))


async def _run_until_own_end(log: Log) -> str | None:
    async with signal_handlers(log, announce=True, on_stop=lambda: None) as watch:
        return await watch.wait_or(asyncio.sleep(0.01, "finished"))


def test_outside_the_main_thread_no_handler_is_installed_and_that_is_said() -> None:
    log = Log()
    before = signal.getsignal(signal.SIGINT)
    out: list[str | None] = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(_run_until_own_end(log))))
    thread.start()
    thread.join(30)
    assert out == [None]  # ended by its own work, not by a signal
    assert log.lines == [("warning", "not in the main thread: no signal handlers installed")]
    assert signal.getsignal(signal.SIGINT) is before


async def test_a_loop_without_signal_support_runs_without_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    def unsupported(*_: object) -> None:
        raise NotImplementedError

    monkeypatch.setattr(loop, "add_signal_handler", unsupported)
    removed: list[int] = []
    monkeypatch.setattr(loop, "remove_signal_handler", removed.append)
    log = Log()
    assert await _run_until_own_end(log) is None
    # the hint names TERM and INT only: no handler for TSTP could be installed
    assert log.lines == [("info", "send signal TERM or INT to terminate the process")]
    assert removed == []  # nothing installed, nothing to remove
