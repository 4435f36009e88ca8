"""The forwarder moves scheduled and retry tasks when they are due, not at its next
fixed pass (issue 41, item 2).

Bounded by construction: the forwarder's interval (``delayed_task_check_interval``)
is an hour here, so under the fixed pass a task due after the worker's first pass
would wait an hour; the tests wait (on the task's observable state) far less than
that, and only the wake at the earliest due score can move it in time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import ServeMux, Server, Task
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq.task import TaskState
from tests.support.procs import fast, wait_until

HOUR = timedelta(hours=1)
SETTINGS = fast(delayed_task_check=HOUR, recoverer=HOUR)
WITHIN = 30.0  # an hour's pass could not have moved the task by then


@pytest.fixture
async def client(redis: Redis) -> AsyncIterator[Client]:
    async with Client(redis) as c:
        yield c


async def test_a_1s_retry_delay_retries_about_1s_later(redis: Redis, client: Client) -> None:
    attempts: list[int] = []

    async def flaky(task: Task) -> None:
        attempts.append(task.retry_count)
        if task.retry_count == 0:
            raise RuntimeError("first attempt fails")

    mux = ServeMux()
    mux.handle("flaky", flaky)
    server = Server(redis, retry_delay=lambda n, exc, task: timedelta(seconds=1), **SETTINGS)
    await server.start(mux)
    try:
        info = await client.enqueue(Task("flaky"), max_retry=3, retention=HOUR)
        # The retry is written after the forwarder's pass at start: only the wake at
        # its due time (this server's own retry) can move it within the test.
        await wait_until(lambda: attempts == [0, 1], within=WITHIN, what="the retry ran")
        done = await client.wait(info.id, timeout=WITHIN)
        assert done.state is TaskState.COMPLETED and done.retried == 1
        assert server.stats.forwarded == 1
    finally:
        await server.shutdown()


async def test_a_task_scheduled_before_a_pass_moves_when_due(redis: Redis, client: Client) -> None:
    ran: list[str] = []

    async def record(task: Task) -> None:
        ran.append(task.id or "")

    mux = ServeMux()
    mux.handle("later", record)
    # Scheduled by a client: the forwarder's pass at start reads its due time.
    info = await client.enqueue(Task("later"), process_in=timedelta(seconds=2))
    server = Server(redis, **SETTINGS)
    await server.start(mux)
    try:
        assert await redis.zscore(keys.scheduled_key("default"), info.id) is not None
        await wait_until(lambda: ran == [info.id], within=WITHIN, what="the scheduled task ran")
        assert await redis.zcard(keys.scheduled_key("default")) == 0
    finally:
        await server.shutdown()
