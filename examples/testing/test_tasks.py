"""Testing typed tasks with asyncq's pytest plugin (fixtures) and eager mode.

Run with ``pytest examples/testing`` (needs pytest-asyncio, and redis-server on PATH or
``asyncq[embedded]``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import tasks

from asyncq import App, Client, Task, TaskFailedError
from asyncq.testing.pytest_plugin import WorkerRunner


@pytest_asyncio.fixture
async def app(asyncq_redis_url: str) -> AsyncIterator[App[None]]:
    """The application's App, pointed at the throwaway Redis of the test session."""
    tasks.app.redis = asyncq_redis_url
    yield tasks.app
    await tasks.app.aclose()


@pytest.mark.asyncio
async def test_worker_runs_until_the_queues_are_empty(
    app: App[None], asyncq_worker: WorkerRunner
) -> None:
    first = await tasks.double.enqueue(21)
    second = await tasks.shout.enqueue("")
    stats = await asyncq_worker(app)
    assert (stats.succeeded, stats.failed) == (1, 1)
    assert await first.result(timeout=5) == 42
    with pytest.raises(TaskFailedError, match="nothing to shout"):
        await second.result(timeout=5)


@pytest.mark.asyncio
async def test_client_fixture(asyncq_client: Client) -> None:
    info = await asyncq_client.enqueue(Task("example:plain", b"x"), queue="low")
    assert info.queue == "low"


@pytest.mark.asyncio
async def test_eager_mode_needs_no_redis() -> None:
    async with tasks.app.eager():
        assert await (await tasks.double.enqueue(4)).result() == 8
        with pytest.raises(TaskFailedError, match="nothing to shout"):
            await (await tasks.shout.enqueue("")).result()
