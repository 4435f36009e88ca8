"""Enqueue under hostile conditions (issue 25): a queue removed under a long-lived Client
(item 1) and a Redis that is out of memory (item 4)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Step, Task, chain
from asyncq._broker import Broker
from asyncq._broker.workflow import workflow_key

Enqueue = Callable[[Client, str, int], Awaitable[Any]]


async def _single(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"%d" % n), queue=q)


async def _hot(c: Client, q: str, n: int) -> Any:
    # The same option set twice: the second call takes the Client's template fast path.
    await c.enqueue(Task("t", b"warm%d" % n), queue=q)
    return await c.enqueue(Task("t", b"hot%d" % n), queue=q)


async def _unique(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"u%d" % n), queue=q, unique=timedelta(hours=1))


async def _scheduled(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"s%d" % n), queue=q, process_in=timedelta(hours=1))


async def _scheduled_unique(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(
        Task("t", b"su%d" % n), queue=q, process_in=timedelta(hours=1), unique=timedelta(hours=1)
    )


async def _group(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"g%d" % n), queue=q, group="g")


async def _group_unique(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"gu%d" % n), queue=q, group="g", unique=timedelta(hours=1))


async def _many(c: Client, q: str, n: int) -> Any:
    out = await c.enqueue_many([Task("t", b"m%d-%d" % (n, i)) for i in range(3)], queue=q)
    assert not [o for o in out if isinstance(o, Exception)], out
    return out


async def _many_mixed(c: Client, q: str, n: int) -> Any:
    out = await c.enqueue_many(
        [
            (Task("t", b"x%d" % n), {"process_in": timedelta(hours=1)}),
            (Task("t", b"y%d" % n), {"task_id": f"y{n}"}),
        ],
        queue=q,
    )
    assert not [o for o in out if isinstance(o, Exception)], out
    return out


PATHS: dict[str, Enqueue] = {
    "single": _single,
    "hot": _hot,
    "unique": _unique,
    "scheduled": _scheduled,
    "scheduled_unique": _scheduled_unique,
    "group": _group,
    "group_unique": _group_unique,
    "many": _many,
    "many_mixed": _many_mixed,
}


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_an_enqueue_after_queue_removal_registers_the_queue_again(
    redis: Redis, path: str
) -> None:
    enqueue = PATHS[path]
    queue = f"tenant:{path}"
    async with Client(redis) as client:
        await enqueue(client, queue, 1)
        assert await redis.sismember("asynq:queues", queue)
        # `asyncq queue rm --force`, or FLUSHALL, behind the long-lived Client's back.
        async with Inspector(redis) as insp:
            await insp.delete_queue(queue, force=True)
        assert not await redis.sismember("asynq:queues", queue)
        await enqueue(client, queue, 2)
        assert await redis.sismember("asynq:queues", queue), path
        await redis.flushdb()
        await enqueue(client, queue, 3)
        assert await redis.sismember("asynq:queues", queue), path
        async with Inspector(redis) as insp:
            info = await insp.queue_info(queue)
            assert info.size >= 1


# Item 3: a workflow step finished by a Go worker (a plain acknowledgement) is resolved by
# cancel whatever it left behind: a completed task (retention) or an archived one.
@pytest.mark.parametrize("outcome", ["completed", "archived"])
async def test_cancel_resolves_a_step_a_go_worker_finished(redis: Redis, outcome: str) -> None:
    broker = Broker(redis)
    async with Client(redis) as client:
        first = Step(Task("a"), options={"retention": timedelta(hours=1)})
        last = Step(Task("b"), options={"retention": timedelta(minutes=5)})
        info = await chain(first, last).enqueue(client)
    got = await broker.dequeue(["default"])
    assert got is not None
    if outcome == "completed":
        await broker.mark_as_complete(got.message)
    else:
        await broker.archive(got.message, "boom")
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow("default", info.id) == "running"
        seen = await insp.get_workflow("default", info.id)
        step = seen.stages[0][0]
        assert step.state == ("succeeded" if outcome == "completed" else "failed")
        # The task the Go worker left is kept (its result and retention are the user's).
        assert (await insp.get_task("default", step.id)).state.value == outcome
    ttl = await redis.ttl(workflow_key("default", info.id))
    assert 0 < ttl <= 300  # the workflow's own retention, not the 7-day hold of a live one
