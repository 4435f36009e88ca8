"""Concurrent enqueues on one Client share socket writes; each still gets its own reply.

Callers that reach the transport in one loop iteration go out in one send() (in groups
of 8 while Redis has little queued, so that it works while the loop builds the rest),
and the replies that resume several callers at once hold their next commands for one
send() too (asyncq._redis.transport); each task is still its own script call. These tests
count the writes by wrapping the connection's transport and check what lands in Redis.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._codec import decode_task_message
from asyncq._producer.client import Client
from asyncq._redis.transport import _AHEAD, _EARLY
from asyncq.errors import TaskIdConflictError
from asyncq.task import Task, TaskInfo, TaskState
from tests.support.helpers import counted_writes

N = 1000


async def _stored(redis: Redis, info: TaskInfo) -> tuple[object, ...]:
    """What Redis holds for *info*'s task, its id and payload left out."""
    fields = await redis.hgetall(keys.task_key(info.queue, info.id))
    msg = decode_task_message(fields.pop(b"msg"))
    assert msg.id == info.id and msg.payload == info.payload
    assert fields.pop(b"pending_since").isdigit()
    msg.id, msg.payload = "", b""
    return (msg, fields)


async def test_a_thousand_concurrent_enqueues_land_as_serial_ones_in_few_writes(
    redis: Redis, redis_url: str
) -> None:
    async with Client(redis_url) as client:
        serial = await client.enqueue(Task("t", b"serial", headers={"h": "v"}), queue="co")
        fast = client.broker.fast
        assert fast is not None
        with counted_writes(fast) as writes:
            infos = await asyncio.gather(
                *(
                    client.enqueue(Task("t", b"%d" % i, headers={"h": "v"}), queue="co")
                    for i in range(N)
                )
            )
    assert [info.payload for info in infos] == [b"%d" % i for i in range(N)]
    assert len({info.id for info in infos}) == N
    assert all(info.state is TaskState.PENDING and info.queue == "co" for info in infos)
    # The first caller finds nothing in flight and writes at once; the other 999 reach
    # the transport in the same iteration: groups of _EARLY go out at once while Redis has
    # fewer than _AHEAD unanswered (it works on them while the loop builds the rest), and
    # the remainder in one write at the iteration's end.
    assert 1 <= len(writes) < N
    assert len(writes) <= 1 + _AHEAD // _EARLY + 1, len(writes)
    pending = await redis.lrange(keys.pending_key("co"), 0, -1)
    assert set(pending) == {info.id.encode() for info in [serial, *infos]}
    reference = await _stored(redis, serial)
    for info in infos:
        assert await _stored(redis, info) == reference


async def test_replies_matched_in_order_under_coalescing(redis: Redis, redis_url: str) -> None:
    """Conflicting ids among coalesced callers fail those callers, and only those."""
    taken = set(range(0, N, 97))
    async with Client(redis_url) as client:
        for i in sorted(taken):
            await client.enqueue(Task("t"), task_id=f"id-{i}")
        fast = client.broker.fast
        assert fast is not None

        async def one(i: int) -> TaskInfo | Exception:
            try:
                if i % 97 == 0 or i % 89 == 0:  # the general path, on the same socket
                    return await client.enqueue(Task("t", b"%d" % i), task_id=f"id-{i}")
                return await client.enqueue(Task("t", b"%d" % i))
            except TaskIdConflictError as exc:
                return exc

        with counted_writes(fast) as writes:
            results = await asyncio.gather(*(one(i) for i in range(N)))
    for i, result in enumerate(results):
        if i in taken:
            assert isinstance(result, TaskIdConflictError) and f"'id-{i}'" in str(result)
        else:
            assert isinstance(result, TaskInfo) and result.payload == b"%d" % i
    assert len(writes) < N
    assert await redis.llen(keys.pending_key("default")) == N


async def test_busy_callers_each_write_their_next_command_with_the_others(
    redis: Redis, redis_url: str
) -> None:
    """Callers resumed by one read write their next enqueue in one send() together."""
    callers, rounds = 32, 20
    async with Client(redis_url) as client:
        await client.enqueue(Task("warm"))
        fast = client.broker.fast
        assert fast is not None

        async def lane(c: int) -> list[TaskInfo]:
            return [await client.enqueue(Task("t", b"%d:%d" % (c, r))) for r in range(rounds)]

        with counted_writes(fast) as writes:
            lanes = await asyncio.gather(*(lane(c) for c in range(callers)))
    calls = callers * rounds
    assert [info.payload for info in lanes[3]] == [b"3:%d" % r for r in range(rounds)]
    assert await redis.llen(keys.pending_key("default")) == calls + 1
    # One write per batch of replies read (and the first caller's lone write): a batch
    # read in several pieces costs more writes, never one per call.
    assert len(writes) < calls / 4, writes


async def test_a_serial_caller_writes_once_per_call(redis_url: str) -> None:
    n = 5
    async with Client(redis_url) as client:
        await client.enqueue(Task("warm"))
        fast = client.broker.fast
        assert fast is not None
        with counted_writes(fast) as writes:
            for i in range(n):
                await client.enqueue(Task("t", b"%d" % i))
    assert len(writes) == n
