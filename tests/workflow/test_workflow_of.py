"""``app.workflow_of(id)``: a workflow handle from an id alone, as a second request
holding only the id needs it (issue 41, item 8)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import AmbiguousIdError, Server, Task, WorkflowNotFoundError, chain
from asyncq._producer.workflow import WorkflowFailedError, typed_group
from tests.support import wf_app as wf

RAW = "wf-of:raw"  # a plain handler of the App's mux, not an @app.task


async def _raw(task: Task) -> None:
    assert task.result_writer is not None
    await task.result_writer.write(b"raw bytes")


wf.app.mux.handle(RAW, _raw)  # once: a module runs once per process


async def test_a_handle_from_the_id_gives_the_typed_result_and_status(
    redis: Redis, worker: Server
) -> None:
    started = await wf.incr.s(1).then(wf.scale, factor=10).then(wf.incr).enqueue()
    # Another request, holding only the id:
    handle = await wf.app.workflow_of(started.id)
    assert handle.id == started.id and handle.queue == "default"
    assert await handle.result(timeout=20) == 21  # decoded as wf:incr's int
    status = await handle.status()
    assert status.state == "succeeded"
    assert [s.id for stage in status.stages for s in stage] == [
        s.id for stage in started.stages for s in stage
    ]
    # With the queue named, the same workflow.
    again = await wf.app.workflow_of(started.id, queue="default")
    assert await again.result(timeout=5) == 21


async def test_a_final_group_and_an_unregistered_final_type(redis: Redis, worker: Server) -> None:
    fan = await typed_group(wf.incr.s(1), wf.incr.s(2)).enqueue()
    assert await (await wf.app.workflow_of(fan.id)).result(timeout=20) == [2, 3]
    # A final step of a type the App does not register: its raw result bytes.

    plain = await chain(wf.incr.to_task(1), Task(RAW, b"", retention=timedelta(minutes=5))).enqueue(
        wf.app.client
    )
    assert await (await wf.app.workflow_of(plain.id)).result(timeout=20) == b"raw bytes"


async def test_cancel_through_a_handle_from_the_id(redis: Redis, app: None) -> None:
    started = await wf.price.s(1).then(wf.incr).enqueue()  # no worker: it stays running
    handle = await wf.app.workflow_of(started.id)
    assert await handle.cancel() == "running"
    assert await handle.cancel() == "canceled"  # only a running workflow changes
    with pytest.raises(WorkflowFailedError, match="canceled"):
        await handle.result(timeout=5)


async def test_bad_ids_are_clear_errors(redis: Redis, app: None) -> None:
    with pytest.raises(WorkflowNotFoundError):
        await wf.app.workflow_of("no-such-workflow")
    with pytest.raises(WorkflowNotFoundError):
        await wf.app.workflow_of("no-such-workflow", queue="default")
    with pytest.raises(ValueError, match="workflow ID cannot be empty"):
        await wf.app.workflow_of(" ")
    # One id in two queues: say which.
    a = await wf.incr.s(1).then(wf.incr).enqueue(workflow_id="twice")
    b = await wf.incr.options(queue="other").s(1).then(wf.incr).enqueue(workflow_id="twice")
    assert (a.queue, b.queue) == ("default", "other")
    with pytest.raises(AmbiguousIdError, match=r"default/twice.*other/twice"):
        await wf.app.workflow_of("twice")
    assert (await wf.app.workflow_of("twice", queue="other")).queue == "other"
    async with wf.app.eager():
        with pytest.raises(RuntimeError, match=r"workflow_of.*not available in eager mode"):
            await wf.app.workflow_of("twice")
