"""The lifecycle shared by the long-running services: Server, Scheduler, PeriodicTaskManager.

States, in order (a service lives them once; it cannot start again after closing)::

    new --start()--> running --shutdown()--> stopping --> closed
    new --shutdown()--> closed            (never started: nothing to stop)

A service owns one **main task**: what it runs while ``running`` (the Server's and
the Scheduler's TaskGroup of roles, the PeriodicTaskManager's sync loop). ``start()``
does the service's set-up (:meth:`Service._open`: connect, first heartbeat or sync),
then starts the main task and returns once it says it serves (a start handshake, see
:mod:`asyncq._taskstart`); a set-up that raises leaves the service ``closed``, with what
it held released (:meth:`Service._release`), and a main task that fails before it serves
shuts the service down and raises its error from ``start()``. ``shutdown()``
runs the service's :meth:`Service._close` once, in one task whoever asks (several
callers, a signal, a burst run ending): it stops the main task's work, waits for it,
and releases what the service holds. The main task is never left running after ``closed``.

``run()`` is start, then serve until SIGTERM/SIGINT or until the main task ends
(a burst run, a failed role group), then shut down; a main task that ended with an
error is raised afterwards, as RuntimeError.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import types
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, Literal, Self

from anyio.abc import TaskStatus

from asyncq._signals import signal_handlers
from asyncq._taskstart import start_task

__all__ = ["Service", "ServiceState"]

ServiceState = Literal["new", "running", "stopping", "closed"]


class Service:
    """Base of a long-running service: the states, the main task, run-until-signal.

    A subclass names itself in :attr:`kind` (used in errors and task names), binds
    :attr:`log`, and writes :meth:`_open`, :meth:`_main_loop` and :meth:`_close`.
    """

    kind: ClassVar[str] = "service"
    log: Any

    def __init__(self) -> None:
        self._state: ServiceState = "new"
        self._main: asyncio.Task[None] | None = None
        """The main task, created by :meth:`_start_service`, awaited by :meth:`_close`."""
        self._closing: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    # -- what a subclass writes -----------------------------------------------------------

    async def _open(self) -> None:
        """Set-up before the main task starts (raising here leaves the service closed)."""

    async def _main_loop(self, task_status: TaskStatus[None]) -> None:
        """The main task's body: ``task_status.started()`` once it serves (``start()``
        returns then); it returns once :meth:`_close` asked it to stop."""
        raise NotImplementedError

    async def _close(self) -> None:
        """Stop the main task's work, wait for the main task, release resources."""

    async def _release(self) -> None:
        """Release what the service holds when it closes without running: shut down
        before starting, or its :meth:`_open` raised."""

    async def _open_failed(self) -> None:
        """After :meth:`_open` raised: by default the service closes, releasing what it held."""
        self._state = "closed"
        try:
            await self._release()
        finally:
            self._closed.set()

    # -- the lifecycle ----------------------------------------------------------------------

    @property
    def service_state(self) -> ServiceState:
        """Where the service is in its life: new, running, stopping or closed."""
        return self._state

    def _refuse_start(self) -> None:
        if self._state != "new":
            raise RuntimeError(f"the {self.kind} cannot start: it is {self._state}")

    async def _start_service(self, context: contextvars.Context | None = None) -> None:
        """Set up, then start the main task (in *context*, default a copy of the current)
        and wait for its handshake (:func:`asyncq._taskstart.start_task`): a main task that
        fails before it serves raises its error here, after the service shut down."""
        self._refuse_start()
        try:
            await self._open()
        except BaseException:
            await self._open_failed()
            raise
        self._state = "running"

        def spawn(body: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
            # Kept at once: whatever happens to the handshake, _close awaits this task.
            self._main = asyncio.create_task(body, name=f"asyncq-{self.kind}", context=context)
            return self._main

        try:
            await start_task(spawn, self._main_loop)
        except BaseException:
            await self.shutdown()
            raise

    async def shutdown(self) -> None:
        """Stop the service and wait until it is closed. Safe to call more than once, from
        several tasks, and before ``start()``."""
        if self._state == "new":
            self._state = "closed"
            try:
                await self._release()
            finally:
                self._closed.set()
            return
        if self._closing is None and self._state == "closed":
            return  # its set-up failed, or it was closed before starting
        await asyncio.shield(self._begin_shutdown())

    def _begin_shutdown(self) -> asyncio.Task[None]:
        """The one shutdown task, created on the first request."""
        if self._closing is None:
            self._state = "stopping"
            self._closing = asyncio.get_running_loop().create_task(
                self._shutdown_once(), name=f"asyncq-{self.kind}-shutdown"
            )
        return self._closing

    async def _shutdown_once(self) -> None:
        try:
            await self._close()
        finally:
            main = self._main
            if main is not None and not main.done():  # _close did not end it: never left behind
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
            self._state = "closed"
            self._closed.set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        """Leaving ``async with`` shuts the service down; an error raised inside passes on."""
        await self.shutdown()

    async def wait_closed(self) -> None:
        """Wait until the service has shut down."""
        await self._closed.wait()

    async def _main_ended(self) -> None:
        """Return when the main task ended or the service closed (whichever first)."""
        closed = asyncio.ensure_future(self._closed.wait())
        waited: set[asyncio.Future[Any]] = {closed}
        if self._main is not None:
            waited.add(self._main)
        try:
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()

    async def _run_until_signal(
        self,
        start: Callable[[], Awaitable[None]],
        *,
        on_repeat: Callable[[str], object] | None = None,
        on_stop: Callable[[], object] | None = None,
        started: Callable[[], object] | None = None,
    ) -> None:
        """Install the signal handlers, *start*, serve until SIGTERM/SIGINT or the main
        task's end, then shut down.

        With *on_repeat* the shutdown runs while the handlers are still installed, so a
        second signal reaches it (the Server's "exit without waiting"); without, the
        handlers are removed first and a second signal ends the process. The handlers
        go in before *start*: a signal that arrives while the service starts must not
        meet the default action, which kills the process (SIGTERM) or suspends it
        (SIGTSTP). A main task that failed is raised as RuntimeError after the shutdown.
        """
        try:
            async with signal_handlers(self.log, on_repeat=on_repeat, on_stop=on_stop) as signals:
                await start()
                if started is not None:
                    started()
                await signals.wait_or(self._main_ended())
                if on_repeat is not None:
                    await self.shutdown()
        finally:
            await self.shutdown()
        main = self._main
        if main is not None and main.done() and not main.cancelled():
            failure = main.exception()
            if failure is not None:
                raise RuntimeError(f"the {self.kind}'s roles failed") from failure
