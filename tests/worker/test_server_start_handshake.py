"""The server's start is a handshake (anyio's ``TaskGroup.start``): start() returns once
every role has started, and a role that cannot start fails start() with its own error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import ServeMux, Server
from asyncq._taskstart import start_task
from asyncq._worker.roles import Role, RoleDeps

UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens there: connections are refused


async def test_a_role_that_cannot_start_fails_start_with_its_own_error(redis: Redis) -> None:
    server = Server(redis, concurrency=1)

    async def broken_pubsub() -> Any:
        raise LookupError("the subscriber cannot start")

    server._subscriber._pubsub = broken_pubsub
    with pytest.raises(LookupError, match="the subscriber cannot start"):
        await asyncio.wait_for(server.start(ServeMux()), 30)
    assert server.state == "closed"
    assert not any(not task.done() for task in server._role_tasks.values())


async def test_start_returns_once_every_role_started(redis: Redis) -> None:
    async with Server(redis, concurrency=1) as server:
        await asyncio.wait_for(server.start(ServeMux()), 30)
        assert server.state == "active"
        assert [name for name in server._role_tasks] == [role.name for role in server.roles]
        assert server._subscriber.ready.is_set()  # subscribed before start() returned


async def test_with_redis_down_start_returns_after_the_first_attempt() -> None:
    """A worker outlives a Redis that comes up later: an unreachable Redis is no failed start."""
    server = Server(UNREACHABLE, concurrency=1)
    try:
        await asyncio.wait_for(server.start(ServeMux()), 60)
        assert server.state == "active"
        assert not server._subscriber.ready.is_set()
    finally:
        await server.shutdown()


async def test_a_crash_after_the_start_is_restarted_not_raised(redis: Redis) -> None:
    server = Server(redis, concurrency=1)
    crashes = 0

    class Flaky(Role):
        name = "flaky"

        async def run(self) -> None:
            nonlocal crashes
            crashes += 1
            if crashes == 1:
                raise LookupError("a crash once running")
            await self._stop.wait()

    deps = RoleDeps(
        broker=server.broker,
        config=server.config,
        log=server.log,
        stats=server.stats,
        queues=server.queue_set,
    )
    server.roles = (*server.roles, Flaky(deps))
    try:
        await asyncio.wait_for(server.start(ServeMux()), 30)
        for _ in range(200):
            if crashes >= 2:
                break
            await asyncio.sleep(0.05)
        assert crashes == 2 and server.stats.role_restarts["flaky"] == 1
    finally:
        await server.shutdown()


async def test_start_task_raises_what_the_body_raised_before_it_started() -> None:
    async def body(task_status: Any) -> None:
        raise ExceptionGroup("a group's body failed", [KeyError("the real one")])

    async with asyncio.TaskGroup() as tg:
        with pytest.raises(KeyError, match="the real one"):
            await start_task(tg.create_task, body)


async def test_start_task_returns_the_task_once_it_started() -> None:
    release = asyncio.Event()

    async def body(task_status: Any) -> None:
        task_status.started()
        await release.wait()

    async with asyncio.TaskGroup() as tg:
        task = await start_task(tg.create_task, body)
        assert not task.done()
        release.set()
    assert task.done() and task.exception() is None
