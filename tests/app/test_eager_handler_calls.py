"""Eager runs are task runs: what a handler may call (progress, its Task, the result
writer) works in ``app.eager()`` as under a worker, workflows included (issue 41, item 1)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

import asyncq
from asyncq import App, ResultWriteError, current_task
from asyncq._producer.workflow import WorkflowFailedError
from asyncq._worker.result_writer import TaskResultWriter

app = App("redis://127.0.0.1:1/0")  # never connected: eager mode touches no Redis
seen: dict[str, object] = {}


@app.task(name="eager:count", timeout=timedelta(seconds=30))
async def count(n: int) -> int:
    for i in range(n):
        asyncq.progress(i / n, f"row {i}/{n}")  # as docs/events.md shows: before each step
    task = current_task()
    seen["task"] = (task.id, task.queue, task.retry_count, task.deadline is not None)
    return n


@app.task(name="eager:threaded")
async def threaded(n: int) -> int:
    # From a thread the handler started, as the progress docs allow.
    await asyncio.to_thread(asyncq.progress, 0.5, "in a thread")
    return n * 2


@app.task(name="eager:writes")
async def writes(n: int) -> int:
    writer = current_task().result_writer
    assert writer is not None
    assert await writer.write(b"partial") == len(b"partial")
    seen["writer"] = writer
    return n


@app.task(name="eager:breaks", max_retry=0)
async def breaks(n: int) -> int:
    asyncq.progress(0.25, "about to fail")
    raise RuntimeError(f"broke at {n}")


async def test_progress_and_the_task_work_in_an_eager_run() -> None:
    async with app.eager():
        handle = await count.enqueue(4)
        assert await handle.result() == 4
        updates = [(u.fraction, u.message) async for u in handle.progress()]
    # Every report, in order; the succeeded task's last one reads 100 % (as a worker's).
    assert updates == [(0.0, "row 0/4"), (0.25, "row 1/4"), (0.5, "row 2/4"), (1.0, "row 3/4")]
    assert handle.info is not None and handle.info.progress is not None
    assert handle.info.progress.percent == 100
    assert seen["task"] == (handle.id, "default", 0, True)


async def test_progress_from_a_handler_thread_in_an_eager_run() -> None:
    async with app.eager():
        handle = await threaded.enqueue(3)
        assert await handle.result() == 6
        assert [u.message async for u in handle.progress()] == ["in a thread"]


async def test_the_result_writer_works_in_an_eager_run_and_closes_after_it() -> None:
    async with app.eager():
        handle = await writes.enqueue(7)
        assert await handle.result() == 7
    writer = seen["writer"]
    assert isinstance(writer, TaskResultWriter)
    with pytest.raises(ResultWriteError):  # the handler returned, as under a worker
        await writer.write(b"late")
    assert handle.info is not None and handle.info.result == b"7"  # the return value wins


async def test_a_failed_eager_run_keeps_its_last_progress() -> None:
    async with app.eager():
        handle = await breaks.enqueue(1)
        with pytest.raises(asyncq.TaskFailedError, match="broke at 1"):
            await handle.result()
        assert [u.fraction async for u in handle.progress()] == [0.25]  # not settled


async def test_an_eager_workflow_with_a_progress_reporting_step() -> None:
    async with app.eager():
        wf = await count.s(3).then(count).enqueue()  # count(3)'s 3 is the next count's n
        assert await wf.result() == 3
        status = await wf.status()
    assert status.state == "succeeded"
    assert [s.result for stage in status.stages for s in stage] == [b"3", b"3"]
    # The handler saw the step's own id, as status() names it.
    assert seen["task"][0] == status.stages[1][0].id  # type: ignore[index]
    assert json.loads(status.stages[0][0].result or b"") == 3


async def test_a_failing_step_after_a_progress_step_fails_the_eager_workflow() -> None:
    async with app.eager():
        wf = await count.s(2).then(breaks).enqueue()
        with pytest.raises(WorkflowFailedError, match="broke at 2"):
            await wf.result()
