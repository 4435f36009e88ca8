"""TaskOwner: the group of a Client's background tasks (the result reader): none outlives
its aclose(), and an error one ended with is raised there, not lost."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from asyncq import Client, Task
from asyncq._taskstart import TaskOwner


async def test_aclose_cancels_the_running_tasks_and_waits_for_them() -> None:
    owner = TaskOwner()
    forever = owner.create_task(asyncio.Event().wait(), name="forever")  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await owner.aclose()
    assert forever.cancelled()


async def test_aclose_raises_the_error_a_task_ended_with() -> None:
    owner = TaskOwner()

    async def broken() -> None:
        raise LookupError("the reader broke")

    owner.create_task(broken(), name="broken")
    await asyncio.sleep(0)
    with pytest.raises(LookupError, match="the reader broke"):
        await owner.aclose()


async def test_the_result_reader_ends_with_its_client(redis: Redis) -> None:
    client = Client(redis)
    info = await client.enqueue(Task("t", b""), queue="owned", retention=None)
    with pytest.raises(TimeoutError):
        await client.wait(info.id, queue="owned", timeout=0.2)
    waiter = client._waiter
    assert waiter is not None and waiter._reader is not None
    reader = waiter._reader
    assert not reader.done()
    await client.aclose()
    assert reader.done()
