"""Testing helpers for applications built on asyncq.

- :class:`RedisServerProcess`: a throwaway ``redis-server`` (no persistence,
  free port), for test sessions;
- :func:`run_until_empty`: run a worker for an App or a ServeMux until its
  queues are empty, then shut it down (a burst run);
- the pytest plugin (:mod:`asyncq.testing.pytest_plugin`, registered through
  the ``pytest11`` entry point) turns both into fixtures: ``asyncq_redis_url``,
  ``asyncq_client`` and ``asyncq_worker``;
- ``App.eager()`` runs typed tasks in-process for unit tests that need no Redis.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from asyncq._redis.options import RedisTarget
from asyncq.app import App
from asyncq.mux import ServeMux
from asyncq.server import Server, ServerStats

__all__ = ["QUICK_SERVER_OPTIONS", "RedisServerProcess", "run_until_empty"]

QUICK_SERVER_OPTIONS: dict[str, Any] = {
    "task_check_interval": timedelta(milliseconds=50),
    "delayed_task_check_interval": timedelta(milliseconds=100),
    "heartbeat_interval": timedelta(milliseconds=500),
    "shutdown_timeout": timedelta(seconds=5),
}
"""Server timings for tests: a burst run notices an empty queue within ~50 ms."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServerProcess:
    """A ``redis-server`` child process on 127.0.0.1 and a free port, removed by :meth:`stop`.

    Needs ``redis-server`` on PATH (RuntimeError naming it otherwise).
    """

    def __init__(self, executable: str = "redis-server") -> None:
        path = shutil.which(executable)
        if path is None:
            raise RuntimeError(
                f"{executable} is not on PATH: install Redis, or point the tests at a Redis "
                "you can flush with ASYNCQ_PYTEST_REDIS_URL"
            )
        self.executable = path
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="asyncq-pytest-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServerProcess:
        args = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--loglevel", "warning",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server on port {self.port} exited early: {err}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def run_until_empty(
    target: App[Any] | ServeMux,
    redis: RedisTarget,
    *,
    queues: dict[str, int] | None = None,
    within: timedelta = timedelta(seconds=30),
    **server_options: Any,
) -> ServerStats:
    """Run a worker until its queues are empty and nothing runs; return what it did.

    *target* is an App (its lifespan and worker settings apply; without
    *queues*, the queues its tasks declare) or a ServeMux. Tasks scheduled for
    later, or waiting for a retry, are not waited for. Raises TimeoutError
    (after shutting the worker down) when the queues are not empty after *within*.
    """
    options = {**QUICK_SERVER_OPTIONS, **server_options, "burst": True}
    if queues is not None:
        options["queues"] = queues
    if isinstance(target, App):
        # The App's worker settings (and queues) apply; the options given here win.
        mux = target.mux
        server = target.server(redis=redis, **options)
    elif isinstance(target, ServeMux):
        mux = target
        server = Server(redis, **options)
    else:
        raise TypeError(f"expected an asyncq App or ServeMux, got {type(target).__name__}")
    await server.start(mux)
    try:
        async with asyncio.timeout(within.total_seconds()):
            await server.wait_closed()
    except TimeoutError:
        await server.shutdown()
        raise TimeoutError(f"the queues were not empty after {within}") from None
    return server.stats
