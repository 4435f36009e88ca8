"""asyncq's pytest plugin (loaded through the ``pytest11`` entry point ``asyncq``).

Fixtures:

- ``asyncq_redis_server`` (session): a throwaway server (``redis-server`` from
  PATH, else the Valkey of ``asyncq[embedded]``); with
  ``ASYNCQ_PYTEST_REDIS_URL`` set, that Redis instead (it gets FLUSHDB!);
- ``asyncq_redis_url``: its URL, the database flushed before each test;
- ``asyncq_client``: an async :class:`~asyncq.Client` on it (needs pytest-asyncio);
- ``asyncq_worker``: ``await asyncq_worker(app_or_mux)`` runs a worker until the
  queues are empty and returns its :class:`~asyncq.ServerStats` (needs pytest-asyncio).

Nothing starts (no server, no connection) unless a test asks for one
of these fixtures.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, Unpack

import pytest

if TYPE_CHECKING:
    from asyncq._producer.client import Client
    from asyncq._worker.server import ServerStats
    from asyncq.app import App, WorkerOptions
    from asyncq.mux import ServeMux

WorkerRunner: TypeAlias = "Callable[..., Awaitable[ServerStats]]"
"""``await asyncq_worker(app_or_mux, within=timedelta(seconds=30), **server_options)``."""


@pytest.fixture(scope="session")
def asyncq_redis_server() -> Iterator[str]:
    """URL of the session's Redis (a throwaway server, or ASYNCQ_PYTEST_REDIS_URL)."""
    given = os.environ.get("ASYNCQ_PYTEST_REDIS_URL")
    if given:
        yield given
        return
    from asyncq.testing import RedisServerProcess

    with RedisServerProcess() as server:
        yield server.url


@pytest.fixture
def asyncq_redis_url(asyncq_redis_server: str) -> str:
    """The session Redis' URL, its database flushed for this test."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(asyncq_redis_server)
    try:
        client.flushdb()
    finally:
        client.close()
    return asyncq_redis_server


try:
    import pytest_asyncio
except ImportError:  # the async fixtures need pytest-asyncio; the others do not
    pass
else:

    @pytest_asyncio.fixture
    async def asyncq_client(asyncq_redis_url: str) -> AsyncIterator[Client]:
        """An asyncq Client on the flushed test Redis."""
        from asyncq._producer.client import Client

        async with Client(asyncq_redis_url) as client:
            yield client

    @pytest_asyncio.fixture
    async def asyncq_worker(asyncq_redis_url: str) -> WorkerRunner:
        """Runs a worker for an App or ServeMux until the queues are empty."""
        from asyncq.testing import run_until_empty

        async def run(
            target: App[Any] | ServeMux,
            *,
            within: timedelta = timedelta(seconds=30),
            **options: Unpack[WorkerOptions],
        ) -> ServerStats:
            return await run_until_empty(target, asyncq_redis_url, within=within, **options)

        return run
