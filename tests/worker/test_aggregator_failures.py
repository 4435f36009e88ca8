"""Aggregator failure paths: a bad return value, a sync aggregator returning an awaitable,
and checks running side by side behind a slow aggregator."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from asyncq import Aggregation, Client, GroupAggregator, ServeMux, Server, Task
from tests.support.helpers import wait_until
from tests.support.procs import FAST


def grouping(aggregator: GroupAggregator) -> Aggregation:
    """Aggregation by *aggregator* of each task alone, checked often."""
    return Aggregation(
        aggregator=aggregator,
        grace_period=timedelta(seconds=1),
        max_size=1,
        check_interval=timedelta(milliseconds=100),
    )


def recording_mux(seen: list[bytes]) -> ServeMux:
    async def handle(task: Task) -> None:
        seen.append(task.payload)

    mux = ServeMux()
    mux.handle("joined", handle)
    return mux


async def test_an_aggregator_returning_no_task_is_logged_and_the_tasks_kept(
    redis: Redis, client: Client
) -> None:
    def bad(group: str, tasks: Sequence[Task]) -> Any:
        return "not a task"

    await client.enqueue(Task("part", b"1"), group="g")
    server = Server(redis, concurrency=2, aggregation=grouping(bad), **FAST)
    await server.start(ServeMux())
    try:
        await wait_until(lambda: server.stats.aggregation_errors >= 1, what="the failure")
    finally:
        await server.shutdown()
    assert server.stats.aggregated == 0
    # The task stays staged in its aggregation set until the recoverer reclaims it.
    (set_key,) = await redis.zrange("asynq:{default}:aggregation_sets", 0, -1)
    assert await redis.zcard(set_key) == 1
    assert await redis.llen("asynq:{default}:pending") == 0


async def test_a_sync_aggregator_may_return_an_awaitable(redis: Redis, client: Client) -> None:
    async def build(tasks: Sequence[Task]) -> Task:
        return Task("joined", b"+".join(t.payload for t in tasks))

    def aggregate(group: str, tasks: Sequence[Task]) -> Any:
        return build(tasks)  # a coroutine, awaited by the server

    seen: list[bytes] = []
    await client.enqueue(Task("part", b"a"), group="g")
    server = Server(redis, concurrency=2, aggregation=grouping(aggregate), **FAST)
    await server.start(recording_mux(seen))
    try:
        await wait_until(lambda: seen, what="the aggregated task handled")
    finally:
        await server.shutdown()
    assert seen == [b"a"] and server.stats.aggregated == 1


async def test_checks_piling_up_behind_a_slow_aggregator_are_skipped(
    redis: Redis, client: Client
) -> None:
    release = asyncio.Event()
    calls: list[str] = []

    async def slow(group: str, tasks: Sequence[Task]) -> Task:
        calls.append(group)
        await release.wait()
        return Task("joined", group.encode())

    for group in ("g1", "g2", "g3"):
        await client.enqueue(Task("part", group.encode()), group=group)
    seen: list[bytes] = []
    server = Server(redis, concurrency=2, aggregation=grouping(slow), **FAST)
    await server.start(recording_mux(seen))
    try:
        # Each check blocks in the aggregator on its own group: three checks run at once
        # (further ticks are skipped while they do), and none holds up the others.
        await wait_until(lambda: len(calls) == 3, what="three blocked checks")
        assert seen == []
        release.set()
        await wait_until(lambda: len(seen) == 3, what="the three aggregated tasks handled")
    finally:
        release.set()
        await server.shutdown()
    assert sorted(calls) == ["g1", "g2", "g3"]
    assert sorted(seen) == [b"g1", b"g2", b"g3"]
    assert await redis.zcard("asynq:{default}:aggregation_sets") == 0


async def test_shutdown_stops_a_check_blocked_in_the_aggregator_and_keeps_its_tasks(
    redis: Redis, client: Client
) -> None:
    started = asyncio.Event()
    stopped: list[str] = []

    async def stuck(group: str, tasks: Sequence[Task]) -> Task:
        started.set()
        try:
            await asyncio.Event().wait()  # never returns on its own
        except asyncio.CancelledError:
            stopped.append(group)
            raise
        raise AssertionError("unreachable")

    await client.enqueue(Task("part", b"x"), group="g")
    server = Server(redis, concurrency=2, aggregation=grouping(stuck), **FAST)
    await server.start(recording_mux([]))
    await asyncio.wait_for(started.wait(), 15)
    await asyncio.wait_for(server.shutdown(), 30)
    # The check ran in the aggregator role's own group: the shutdown cancelled it.
    assert stopped == ["g"]
    # Its task stays staged in the aggregation set; the recoverer returns it to the
    # group after the set's deadline, so nothing is lost.
    (set_key,) = await redis.zrange("asynq:{default}:aggregation_sets", 0, -1)
    assert await redis.zcard(set_key) == 1
