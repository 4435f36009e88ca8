"""Run until SIGTERM/SIGINT: the signal handling shared by Server, Scheduler and
PeriodicTaskManager.

:func:`signal_handlers` installs the handlers on the running loop (only from
the main thread; elsewhere, and on Windows, there are none and the caller runs
until its own end) and removes them when the block exits, so a second signal
during the caller's shutdown still reaches ``on_repeat``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["SignalWatch", "log_signal_hints", "signal_handlers"]


class SignalWatch:
    """What :func:`signal_handlers` yields: the first terminating signal, once received."""

    __slots__ = ("received", "signame")

    def __init__(self) -> None:
        self.received = asyncio.Event()
        self.signame: str | None = None

    async def wait_or(self, until: Awaitable[object]) -> str | None:
        """Wait for a terminating signal or for *until*; the signal's name, or None.

        A task or future given as *until* is left running (the caller owns it); a
        coroutine is wrapped in a task that is cancelled when a signal wins.
        """
        owned = not isinstance(until, asyncio.Future)
        other = asyncio.ensure_future(until)
        waiter = asyncio.ensure_future(self.received.wait())
        try:
            await asyncio.wait({other, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if owned:
                other.cancel()
        return self.signame


def log_signal_hints(log: Any, *, tstp: bool = True) -> None:
    """The two lines that tell an operator how to stop a worker (once per worker or
    supervisor, never in burst mode)."""
    if tstp:
        log.info("send signal TSTP to stop processing new tasks")
    log.info("send signal TERM or INT to terminate the process")


@contextlib.asynccontextmanager
async def signal_handlers(
    log: Any,
    *,
    on_repeat: Callable[[str], object] | None = None,
    on_stop: Callable[[], object] | None = None,
    announce: bool = False,
) -> AsyncIterator[SignalWatch]:
    """SIGTERM/SIGINT handlers for the block: the first sets the watch, later ones call
    *on_repeat* (name of the signal); SIGTSTP calls *on_stop* when given."""
    loop = asyncio.get_running_loop()
    watch = SignalWatch()

    def on_terminate(signame: str) -> None:
        if watch.received.is_set():
            if on_repeat is not None:
                on_repeat(signame)
            return
        watch.signame = signame
        log.info("signal received: shutting down", signal=signame)
        watch.received.set()

    def stop() -> None:
        log.info("signal received: stopping", signal="SIGTSTP")
        if on_stop is not None:
            on_stop()

    installed: list[int] = []
    if threading.current_thread() is threading.main_thread():
        wanted: list[tuple[str, Callable[[], None]]] = [
            ("SIGTERM", lambda: on_terminate("SIGTERM")),
            ("SIGINT", lambda: on_terminate("SIGINT")),
        ]
        if on_stop is not None:
            wanted.append(("SIGTSTP", stop))
        for signame, callback in wanted:
            signum = getattr(signal, signame, None)
            if signum is None:
                continue
            try:
                loop.add_signal_handler(signum, callback)
            except (NotImplementedError, RuntimeError):  # Windows / not the main loop
                continue
            installed.append(signum)
        if announce:
            log_signal_hints(log, tstp=getattr(signal, "SIGTSTP", None) in installed)
    elif announce:
        log.warning("not in the main thread: no signal handlers installed")
    try:
        yield watch
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
