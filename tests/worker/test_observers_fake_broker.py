"""The processor's observers (completion notices, progress, metrics history) write through
the worker's broker like every other write, so a processor on the in-memory fake broker
shows them all without a Redis."""

from __future__ import annotations

import asyncio

import structlog

from asyncq import Task, progress
from asyncq._keys import completion_channel
from asyncq._worker.active import ActiveTasks
from asyncq._worker.completion import CompletionNotifier
from asyncq._worker.processor import Processor
from asyncq._worker.wakeup import QueueWakeup
from asyncq.history import HistoryRecorder
from asyncq.progress import ProgressWriter
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import Deferred, Q, message, role_deps


async def test_notices_progress_and_history_go_through_the_broker() -> None:
    fake = FakeBroker()
    kept = fake.enqueue(message("report", retention=600))  # completed, kept: a notice
    plain = fake.enqueue(message("report"))  # done and deleted: no notice
    broken = fake.enqueue(message("report", retry=0))  # archived: a notice
    history = HistoryRecorder(fake, log=structlog.get_logger("test"))
    writer = ProgressWriter(fake)

    async def handler(task: Task) -> None:
        if task.id == broken.id:
            raise ValueError("boom")
        progress(0.5, "half way")

    processor = Processor(
        role_deps(fake, concurrency=5),
        handler=handler,
        active=ActiveTasks(),
        wakeup=QueueWakeup(),
        defer_write=Deferred(),
        on_burst_done=lambda: None,
        notifier=CompletionNotifier(fake),
        history=history,
        progress=writer,
    )
    running = asyncio.create_task(processor.run())
    await wait_until(lambda: len(fake.completions) == 2, what="two completion notices")
    await processor.drain(1.0)
    await asyncio.wait_for(running, 5)
    await processor.cleanup()
    await writer.aclose()
    await history.flush()

    channel = completion_channel(Q)
    assert sorted(fake.completions) == sorted([(channel, kept.id), (channel, broken.id)])
    assert fake.state(kept.id) == "completed" and fake.state(plain.id) is None
    assert {task_id for _, task_id in fake.progress} == {kept.id}  # the others' were deleted
    stored = fake.progress[Q, kept.id]
    assert (stored["fraction"], stored["message"]) == ("0.5", "half way")
    ((queue, _), counts) = fake.history.popitem()
    assert queue == Q and not fake.history  # one hash: one queue, one minute
    assert (counts["p:report"], counts["f:report"], counts["a:report"]) == (3, 1, 1)
    assert "r:report" not in counts
    assert len(fake.called("write_history")) == 1
