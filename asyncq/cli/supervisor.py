"""``asyncq worker --processes N`` / ``--reload``: a supervisor of worker processes.

The supervisor starts N worker processes (each an ``asyncq worker`` of its own,
in its own process group so that a terminal's Ctrl-C reaches it only through
the supervisor), and:

- restarts a worker process that exits unexpectedly (a crash, a kill, the OOM
  killer) after a backoff that doubles from ``backoff_min`` to ``backoff_max``
  and resets once the process has run for ``stable_after``;
- forwards SIGTERM and SIGINT to every worker process, which then drain as a
  single worker does (stop fetching, wait up to the shutdown timeout, requeue
  what is still running), and exits once all have exited; a second signal is
  forwarded too (the workers then exit at once);
- forwards SIGTSTP (stop fetching new tasks) and SIGCONT;
- with ``reload``, restarts every worker process gracefully when a ``.py``
  file under the watched directory changes (development only; needs
  watchfiles, the ``reload`` extra);
- in burst mode, lets a worker process that exited with status 0 stay down.

A worker process notices when its supervisor is gone (even after SIGKILL) and
shuts down gracefully, so no orphaned workers are left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from asyncq._signals import log_signal_hints

__all__ = ["SUPERVISOR_ENV", "Supervisor", "watch_supervisor"]

SUPERVISOR_ENV = "ASYNCQ_SUPERVISOR_PID"
EXIT_CANNOT_CONNECT = 3
"""A supervised worker's exit status when it cannot reach Redis at start: restarting it
would fail the same way forever, so the supervisor stops the others and reports it."""
"""Set in the environment of every worker process to the supervisor's pid."""

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGTSTP, signal.SIGCONT)


@dataclass(slots=True)
class _Slot:
    """One of the N worker processes, across its restarts."""

    index: int
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    delay: float = 0.0
    done: bool = False
    reloading: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    """Run *processes* copies of the command *argv* and keep them running.

    ``await run()`` returns the exit status for the supervisor: 0 when every
    worker process exited with status 0 after a shutdown signal (or, in burst
    mode, on its own), otherwise 1.
    """

    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        *,
        env: Mapping[str, str] | None = None,
        burst: bool = False,
        reload_dir: Path | None = None,
        backoff_min: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 30.0,
        logger: Any = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be 1 or more, got {processes}")
        self.argv = list(argv)
        self.processes = processes
        self.env = {**(os.environ if env is None else env), SUPERVISOR_ENV: str(os.getpid())}
        self.burst = burst
        self.reload_dir = reload_dir
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.log = logger or structlog.get_logger("asyncq").bind(role="supervisor")
        self._slots = [_Slot(i) for i in range(processes)]
        self._stopping = False
        self._failed = False
        self.cannot_connect = False
        """Whether a worker process exited with :data:`EXIT_CANNOT_CONNECT`."""

    @property
    def pids(self) -> list[int]:
        """Process ids of the running worker processes."""
        return [
            s.process.pid
            for s in self._slots
            if s.process is not None and s.process.returncode is None
        ]

    async def run(self) -> int:
        """Supervise until a shutdown signal (or, in burst mode, all workers are done)."""
        loop = asyncio.get_running_loop()
        for sig in _FORWARDED:
            loop.add_signal_handler(sig, self._on_signal, sig)
        watcher: asyncio.Task[None] | None = None
        try:
            if self.reload_dir is not None:
                watcher = asyncio.create_task(self._watch(self.reload_dir))
            self.log.info(
                "supervisor started",
                processes=self.processes,
                pid=os.getpid(),
                reload=bool(watcher),
            )
            if not self.burst:  # once here, for all the workers (they print none)
                log_signal_hints(self.log)
            await asyncio.gather(*(self._keep_running(s) for s in self._slots))
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            for sig in _FORWARDED:
                loop.remove_signal_handler(sig)
        self.log.info("supervisor stopped", failed=self._failed)
        return 1 if self._failed else 0

    def _on_signal(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            if not self._stopping:
                self.log.info("shutting down the worker processes", signal=sig.name)
            self._stopping = True
            for slot in self._slots:
                slot.wake.set()
        self._send_all(sig)
        if sig in (signal.SIGTERM, signal.SIGINT):
            # A worker that got SIGTSTP before it could handle it is suspended;
            # wake it so that it sees the shutdown signal.
            self._send_all(signal.SIGCONT)

    def _send_all(self, sig: signal.Signals) -> None:
        for slot in self._slots:
            proc = slot.process
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    async def _keep_running(self, slot: _Slot) -> None:
        while not self._stopping and not slot.done:
            slot.process = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, start_new_session=True
            )
            slot.started = time.monotonic()
            self.log.info("worker process started", slot=slot.index, pid=slot.process.pid)
            if self._stopping:  # a signal came while the process was being started
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(signal.SIGTERM)
            code = await slot.process.wait()
            ran = time.monotonic() - slot.started
            reloading, slot.reloading = slot.reloading, False
            if self._stopping or reloading:
                if code in (-signal.SIGTERM, -signal.SIGINT):
                    # Signalled while it was starting, before it installed its handlers:
                    # a task it may have fetched comes back when its lease expires.
                    self.log.warning(
                        "worker process ended by the signal while starting",
                        slot=slot.index,
                        pid=slot.process.pid,
                        status=_describe(code),
                    )
                elif code != 0:
                    self._failed = True
                    self.log.error(
                        "worker process exited with an error while shutting down",
                        slot=slot.index,
                        pid=slot.process.pid,
                        status=_describe(code),
                    )
                else:
                    self.log.info("worker process exited", slot=slot.index, pid=slot.process.pid)
                continue  # a reload restarts it at once; a shutdown ends the loop
            if code == EXIT_CANNOT_CONNECT:
                self.log.error(
                    "a worker process could not connect to Redis at start; stopping",
                    slot=slot.index,
                    pid=slot.process.pid,
                )
                self.cannot_connect = self._failed = True
                self._on_signal(signal.SIGTERM)
                break
            if code == 0 and self.burst:
                self.log.info("worker process done (burst)", slot=slot.index, pid=slot.process.pid)
                slot.done = True
                break
            if ran >= self.stable_after:
                slot.delay = 0.0
            slot.delay = (
                self.backoff_min if slot.delay == 0 else min(slot.delay * 2, self.backoff_max)
            )
            slot.restarts += 1
            self.log.error(
                "worker process exited unexpectedly; restarting it",
                slot=slot.index,
                pid=slot.process.pid,
                status=_describe(code),
                ran_seconds=round(ran, 1),
                restart_in=slot.delay,
                restarts=slot.restarts,
            )
            slot.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.wake.wait(), slot.delay)

    async def _watch(self, directory: Path) -> None:
        from watchfiles import PythonFilter, awatch

        async for changes in awatch(directory, watch_filter=PythonFilter()):
            if self._stopping:
                return
            names = sorted({Path(p).name for _, p in changes})
            self.log.info("code changed; restarting the worker processes", files=names[:5])
            running = [
                s for s in self._slots if s.process is not None and s.process.returncode is None
            ]
            for slot in running:
                slot.reloading = True
            self._send_all(signal.SIGTERM)
            await asyncio.gather(*(s.process.wait() for s in running if s.process is not None))


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def watch_supervisor(
    supervisor_pid: int,
    on_gone: Callable[[], None] | None = None,
    *,
    interval: float = 0.5,
) -> threading.Thread:
    """In a worker process: call *on_gone* (default: SIGTERM to itself) once the supervisor is gone.

    A supervisor killed with SIGKILL cannot forward anything; its worker
    processes are re-parented, which this daemon thread notices, and then shut
    down gracefully instead of running on unsupervised.
    """

    def gone() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    callback = on_gone or gone

    def watch() -> None:
        while os.getppid() == supervisor_pid:
            time.sleep(interval)
        structlog.get_logger("asyncq").warning(
            "the supervisor is gone; shutting down", supervisor_pid=supervisor_pid
        )
        callback()

    thread = threading.Thread(target=watch, name="asyncq-supervisor-watch", daemon=True)
    thread.start()
    return thread
